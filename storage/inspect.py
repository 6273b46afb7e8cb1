"""Offline inspection of a data directory: `check` verifies every structure, `dump` prints them.

Both only read, through the structures' own read-only modes (the commit log's one decoder,
`CommitLog(..., readonly=True)`; TimerLog, ready queues and message table opened read-only,
segment headers and all). They never take the LOCK, so they may run next to a live daemon
(bbolt's `check`/`dump` in spirit); what a daemon is writing at that very moment can then show
up as a torn tail, which is why a tail is reported separately from damage.

    check(data_dir, config=None) -> CheckReport        # `delayd check DATA_DIR`
    dump(data_dir, what, ...) -> Iterator[str]         # `delayd dump DATA_DIR WHAT`
        what: commitlog | timerlog | wheel | checkpoint | ready | msgtable
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from delayd.storage import checkpoint as ckpt
from delayd.storage.commitlog import CommitLog, Record, ScanReport
from delayd.storage.datadir import Layout, check_formats
from delayd.storage.errors import CorruptData, StorageError, UnsupportedVersion
from delayd.storage.msgtable import MessageState, MessageTable
from delayd.storage.readyqueue import UNIT_SIZE as READY_UNIT_SIZE
from delayd.storage.readyqueue import ReadyQueue
from delayd.storage.timerlog import NO_POS, UNIT_SIZE, TimerLog, UnitMagic
from delayd.storage.timerwheel import HEADER as WHEEL_HEADER
from delayd.storage.timerwheel import SLOT, SLOT_SIZE
from delayd.storage.timerwheel import read_header as read_wheel_header

DUMP_KINDS = ("commitlog", "timerlog", "wheel", "checkpoint", "ready", "msgtable")
MAX_PROBLEMS = 1000  # a wrecked file should not print a million lines
BIG_SEGMENT = 1 << 62  # segment sizes for read-only opening: never reached, nothing is appended


# ------------------------------------------------------------------------------ reading

def scan_items(log: CommitLog, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Record | CorruptData, int]]:
    """(offset, record or the error, bytes) for every record and every damaged stretch from
    `start`, in log order: the commit log's own scan (one decoder), damage included."""
    report = ScanReport(max_notes=1 << 62)
    told = 0
    for rec in log.scan(start, end, report):
        while told < len(report.damage):
            d = report.damage[told]
            told += 1
            yield d.offset, d.error, d.size
        yield rec.offset, rec, rec.size
    for d in report.damage[told:]:
        yield d.offset, d.error, d.size


def iter_slots(path: Path, slot_count: int) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(index, time, first, last, num, magic) of every stored slot with num != 0."""
    with open(path, "rb") as f:
        f.seek(WHEEL_HEADER.size)
        i = 0
        while i < slot_count:
            data = f.read(min(slot_count - i, 32768) * SLOT_SIZE)
            if not data:
                return
            for raw in SLOT.iter_unpack(data[:len(data) - len(data) % SLOT_SIZE]):
                if raw[3] != 0:
                    yield (i, *raw)
                i += 1


def _topics(layout: Layout) -> list[str]:
    try:
        return sorted(os.listdir(layout.ready))
    except FileNotFoundError:
        return []


# ------------------------------------------------------------------------------ check

@dataclass
class CheckReport:
    data_dir: Path
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checkpoint: str = "missing"  # "ok", "missing", or why it is unusable
    commit_segments: int = 0
    commit_records: int = 0
    commit_bytes: int = 0
    damaged_records: int = 0
    torn_tail_bytes: int = 0
    timerlog_units: int = 0
    damaged_units: int = 0
    wheel: str = "missing"  # "ok", "missing", or why it is unusable
    wheel_slots: int = 0  # non-empty slots still to be dispatched
    wheel_units: int = 0  # units reached through their chains
    damaged_slots: int = 0
    ready_units: int = 0
    damaged_ready_units: int = 0
    msgtable_entries: int = 0
    dropped_problems: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)
        else:
            self.dropped_problems += 1

    def text(self) -> str:
        lines = [
            f"data dir {self.data_dir}: {'OK' if self.ok else f'{len(self.problems) + self.dropped_problems} problem(s)'}",
            f"  checkpoint: {self.checkpoint}",
            f"  commit log: {self.commit_segments} segments, {self.commit_records} records, {self.commit_bytes} "
            f"bytes; {self.damaged_records} damaged, {self.torn_tail_bytes} bytes of torn tail",
            f"  TimerLog: {self.timerlog_units} units, {self.damaged_units} damaged",
            f"  TimerWheel: {self.wheel}; {self.wheel_slots} pending slots, {self.wheel_units} units chained, "
            f"{self.damaged_slots} damaged slots",
            f"  ready queues: {self.ready_units} units, {self.damaged_ready_units} pointing at nothing readable",
            f"  message table: {self.msgtable_entries} entries",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        if self.dropped_problems:
            lines.append(f"  ... and {self.dropped_problems} more problems")
        return "\n".join(lines)


def check(data_dir: Path, config: object | None = None) -> CheckReport:
    """Verify every structure of `data_dir` (read-only, no LOCK).

    `config` (a StoreConfig, optional) adds the geometry check: a wheel built for another
    precision or slot count is reported, as the daemon would rebuild it.
    """
    layout = Layout(Path(data_dir))
    rep = CheckReport(layout.path)
    if not layout.path.is_dir():
        return rep
    try:
        meta = check_formats(layout.path)
        rep.notes.append(f"format version 2, node id {meta.node_id!r}" if meta is not None
                         else "format version 1 (no meta file; the daemon upgrades it at its next start)")
    except UnsupportedVersion as e:
        rep.problem(f"written by a newer delayd: {e}")
        return rep  # its files cannot be read by this build
    except CorruptData as e:
        rep.problem(f"meta: {type(e).__name__}: {e}")
    cp = _check_checkpoint(layout, rep)
    log = CommitLog(layout.commitlog, BIG_SEGMENT, readonly=True)
    try:
        tlog: TimerLog | None = TimerLog(layout.timerlog, BIG_SEGMENT // UNIT_SIZE, readonly=True)
    except CorruptData as e:
        rep.problem(f"TimerLog: {type(e).__name__}: {e}")
        tlog = None
    try:
        _check_commitlog(layout, log, cp, rep)
        if tlog is not None:
            _check_timerlog(layout, tlog, cp, rep)
            _check_wheel(layout.timerwheel, tlog, cp, config, rep)
        _check_ready(layout, log, rep)
        _check_msgtable(layout, cp, config, rep)
    finally:
        log.close()
        if tlog is not None:
            tlog.close()
    return rep


def _check_checkpoint(layout: Layout, rep: CheckReport) -> ckpt.Checkpoint | None:
    found = None
    for path in (layout.checkpoint, ckpt.previous(layout.checkpoint)):
        try:
            cp = ckpt.load(path)
        except FileNotFoundError:
            if path.name == "checkpoint" and ckpt.previous(path).exists():
                rep.problem("checkpoint: missing (checkpoint.prev is there)")
            continue
        except CorruptData as e:
            rep.problem(f"{path.name}: {type(e).__name__}: {e}")
            if path.name == "checkpoint":
                rep.checkpoint = f"unusable ({type(e).__name__})"
            continue
        if found is None:
            found = cp
            rep.checkpoint = "ok" if path.name == "checkpoint" else f"{rep.checkpoint}; checkpoint.prev ok"
    return found


def _gaps(name: str, files: object, rep: CheckReport) -> None:
    bases = files.bases  # type: ignore[attr-defined]
    for a, b in zip(bases, bases[1:], strict=False):
        end = files.segment_end(a)  # type: ignore[attr-defined]
        if end != b:
            rep.problem(f"{name}: segment {a} ends at {end} but the next one starts at {b}")


def _check_commitlog(layout: Layout, log: CommitLog, cp: ckpt.Checkpoint | None, rep: CheckReport) -> None:
    if not layout.commitlog.is_dir():
        if cp is not None:
            rep.problem("commit log: directory missing")
        return
    files = log.files
    rep.commit_segments = len(files.bases)
    rep.commit_bytes = log.end - log.start
    _gaps("commit log", files, rep)
    last_base = files.bases[-1] if files.bases else 0
    last_good = log.start
    pending: list[tuple[int, CorruptData, int]] = []
    try:
        for off, item, n in scan_items(log):
            if isinstance(item, Record):
                rep.commit_records += 1
                last_good = off + n
                for p_off, err, p_n in pending:
                    rep.damaged_records += 1
                    rep.problem(f"commit log: damaged record at offset {p_off} ({p_n} bytes skipped): "
                                f"{type(err).__name__}: {err}")
                pending = []
            else:
                pending.append((off, item, n))
    except UnsupportedVersion as e:
        rep.problem(f"commit log: written by a newer delayd: {e}")
    for p_off, err, p_n in pending:
        if p_off >= last_base and p_off >= last_good:
            rep.torn_tail_bytes += p_n
            rep.problem(f"commit log: torn or corrupt tail of {p_n} bytes at offset {p_off} "
                        f"({type(err).__name__}); recovery cuts it")
        else:
            rep.damaged_records += 1
            rep.problem(f"commit log: damaged record at offset {p_off} ({p_n} bytes skipped): "
                        f"{type(err).__name__}: {err}")
    if cp is None and rep.commit_records:
        rep.problem("checkpoint: no valid checkpoint; recovery rescans the whole commit log")
    if cp is not None:
        if cp.commit_end > log.end:
            rep.problem(f"checkpoint: expects a commit log of {cp.commit_end} bytes, found {log.end}")
        if files.bases and cp.commit_indexed < log.start:
            rep.problem(f"checkpoint: indexed offset {cp.commit_indexed} is before the oldest segment {log.start}")


def _check_timerlog(layout: Layout, tlog: TimerLog, cp: ckpt.Checkpoint | None, rep: CheckReport) -> None:
    if not layout.timerlog.is_dir():
        if cp is not None and cp.timerlog_end:
            rep.problem("TimerLog: directory missing")
        return
    files = tlog.files
    _gaps("TimerLog", files, rep)
    for base in files.bases:
        size = files.segment_end(base) - base
        if size % UNIT_SIZE:
            rep.problem(f"TimerLog: segment {base} holds {size} bytes, not whole {UNIT_SIZE}-byte units")
    damaged: list[int] = []
    for _u in tlog.scan(tlog.start, None, damaged):
        rep.timerlog_units += 1
    rep.timerlog_units += len(damaged)
    rep.damaged_units = len(damaged)
    for pos in damaged:
        rep.problem(f"TimerLog: damaged TimerLog unit at {pos}")
    if cp is not None and tlog.end < cp.timerlog_end:
        rep.problem(f"TimerLog: ends at {tlog.end}, before the checkpoint's {cp.timerlog_end}; "
                    f"units the checkpoint counts on are gone")


def _check_wheel(path: Path, tlog: TimerLog, cp: ckpt.Checkpoint | None, config: object | None,
                 rep: CheckReport) -> None:
    if not path.exists():
        if cp is not None:
            rep.problem("TimerWheel: file missing (recovery rebuilds it from the TimerLog)")
        return
    try:
        precision, count, _created = read_wheel_header(path)
    except CorruptData as e:
        rep.wheel = f"unusable ({type(e).__name__})"
        rep.problem(f"TimerWheel: {type(e).__name__}: {e}")
        return
    rep.wheel = f"ok ({precision} ms x {count} slots)"
    if path.stat().st_size != WHEEL_HEADER.size + count * SLOT_SIZE:
        rep.problem(f"TimerWheel: file is {path.stat().st_size} bytes, the header says {count} slots")
    want = (getattr(config, "precision_ms", precision), getattr(config, "slot_count", count))
    if want != (precision, count):
        rep.wheel = f"geometry mismatch ({precision} ms x {count} slots)"
        rep.problem(f"TimerWheel: built for {precision} ms x {count} slots, configured {want[0]} ms x {want[1]}; "
                    f"the daemon rebuilds it")
    read_time = cp.read_time_ms if cp is not None else 0
    for idx, t, first, last, num, _magic in iter_slots(path, count):
        if num < 0 or t % precision or t // precision % count != idx:
            rep.damaged_slots += 1
            rep.problem(f"TimerWheel: slot {idx} is impossible (time {t}, num {num})")
            continue
        if t < read_time - read_time % precision:
            continue  # dispatched already: its units may be gone with old TimerLog segments
        rep.wheel_slots += 1
        err = _walk_chain(tlog, t, first, last, num, precision)
        if err:
            rep.damaged_slots += 1
            rep.problem(f"TimerWheel: slot {idx} (time {t}): {err}")
        else:
            rep.wheel_units += num


def _walk_chain(tlog: TimerLog, t: int, first: int, last: int, num: int, precision: int) -> str | None:
    pos, n, prev_pos = last, 0, None
    while pos != NO_POS:
        if pos % UNIT_SIZE or not tlog.start <= pos <= tlog.end - UNIT_SIZE:
            return f"chain reaches position {pos}, outside the TimerLog [{tlog.start}, {tlog.end})"
        try:
            unit = tlog.read(pos)
        except (CorruptData, StorageError) as e:
            return f"unit at {pos}: {e}"
        if unit.fire_time - unit.fire_time % precision != t:
            return f"unit at {pos} fires at {unit.fire_time}, not in this slot"
        n += 1
        if n > num:
            return f"chain longer than num={num}"
        prev_pos, pos = unit.pos, unit.prev_pos
    if n != num:
        return f"chain has {n} units, num says {num}"
    if prev_pos is not None and prev_pos != first:
        return f"chain ends at {prev_pos}, first_pos says {first}"
    return None


def _check_ready(layout: Layout, log: CommitLog, rep: CheckReport) -> None:
    for topic in _topics(layout):
        try:
            q = ReadyQueue(layout.ready / topic, BIG_SEGMENT // READY_UNIT_SIZE, readonly=True)
        except CorruptData as e:
            rep.problem(f"ready/{topic}: {type(e).__name__}: {e}")
            continue
        try:
            for base in q.files.bases:
                if (q.files.segment_end(base) - base) % READY_UNIT_SIZE:
                    rep.problem(f"ready/{topic}: segment {base} does not hold whole units")
            for u in q.scan(q.start):
                rep.ready_units += 1
                if u.commit_offset < log.start:
                    continue  # its segment is past retention
                try:
                    rec = log.read(u.commit_offset, u.commit_size)
                    if rec.seq != u.seq or rec.size != u.commit_size:
                        raise CorruptData(f"record there is seq {rec.seq} of {rec.size} bytes")
                except (CorruptData, StorageError) as e:
                    rep.damaged_ready_units += 1
                    rep.problem(f"ready/{topic}: unit {u.index} (seq {u.seq}) points at offset {u.commit_offset}: "
                                f"{type(e).__name__}: {e}")
        finally:
            q.close()


def _check_msgtable(layout: Layout, cp: ckpt.Checkpoint | None, config: object | None, rep: CheckReport) -> None:
    per_segment = int(getattr(config, "msgtable_segment_entries", 1 << 20))
    table = MessageTable(layout.msgtable, per_segment, readonly=True)
    try:
        if cp is not None and cp.next_seq > 1:
            last = cp.next_seq - 1
            if not layout.msgtable.is_dir():
                rep.problem("message table: directory missing (recovery must rescan the commit log)")
            elif (last // per_segment + 1) * per_segment > cp.next_seq and not table.has_entry(last):
                # Only a partial segment: a full one may be gone to retention.
                rep.problem(f"message table: entries up to seq {last} (checkpoint) are missing")
        for seg in table.segments():
            for seq, state, *_rest in table.entries(seg):
                rep.msgtable_entries += 1
                if state > max(MessageState):
                    rep.problem(f"message table: seq {seq} has state {state}")
    except CorruptData as e:
        rep.problem(f"message table: {type(e).__name__}: {e}")
    finally:
        table.close()


# ------------------------------------------------------------------------------ dump

def _ts(ms: int) -> str:
    if not 0 < ms < 253402300800000:
        return str(ms)
    return f"{ms} ({datetime.fromtimestamp(ms / 1000, UTC).strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z)"


def dump(data_dir: Path, what: str, *, segment: int | None = None, start: int = 0, limit: int | None = None,
         topic: str | None = None, config: object | None = None) -> Iterator[str]:
    """Readable lines for one structure of `data_dir` (read-only, no LOCK).

    commitlog: every record (offset, type, seq, topic, deliver_at, sizes) of one `segment`
    (its base offset) or of all from `start`; timerlog: units (pos, prev, magic, fire time,
    offset, seq) from `start`; wheel: the header and every non-empty slot (time, first, last,
    num, magic); checkpoint: both checkpoint files; ready: units of one `topic` or all;
    msgtable: non-empty entries from seq `start`. `limit` caps the number of lines.
    """
    layout = Layout(Path(data_dir))
    gens = {"commitlog": lambda: _dump_commitlog(layout, segment, start),
            "timerlog": lambda: _dump_timerlog(layout, start), "wheel": lambda: _dump_wheel(layout),
            "checkpoint": lambda: _dump_checkpoint(layout), "ready": lambda: _dump_ready(layout, topic, start),
            "msgtable": lambda: _dump_msgtable(layout, start, config)}
    if what not in gens:
        raise ValueError(f"dump what? one of {', '.join(DUMP_KINDS)}")
    for n, line in enumerate(gens[what]()):
        if limit is not None and n >= limit:
            return
        yield line


def _dump_commitlog(layout: Layout, segment: int | None, start: int) -> Iterator[str]:
    log = CommitLog(layout.commitlog, BIG_SEGMENT, readonly=True)
    try:
        bases = log.files.bases
        end = None
        if segment is not None:
            if segment not in bases:
                raise StorageError(f"no commit-log segment {segment}; segments: {bases}")
            bases, start, end = [segment], segment, log.files.segment_end(segment)
        yield f"# commit log {layout.commitlog}: segments {bases}"
        for off, item, n in scan_items(log, start, end):
            if isinstance(item, Record):
                r = item
                extra = f" roll={r.roll_count}" if r.roll_count else ""
                extra += f" tag={r.tag!r}" if r.tag else ""
                extra += f" key={r.key!r}" if r.key else ""
                extra += f" headers={len(r.headers)}" if r.headers else ""
                yield (f"offset={off} size={r.size} type={r.type.name} seq={r.seq} topic={r.topic!r} "
                       f"deliver_at={_ts(r.deliver_at)} produced_at={r.produced_at} body={len(r.body)}{extra}")
            else:
                yield f"offset={off} DAMAGED {n} bytes: {type(item).__name__}: {item}"
    finally:
        log.close()


def _dump_timerlog(layout: Layout, start: int) -> Iterator[str]:
    tlog = TimerLog(layout.timerlog, BIG_SEGMENT // UNIT_SIZE, readonly=True)
    try:
        yield f"# TimerLog {layout.timerlog}: [{tlog.start}, {tlog.end}), {(tlog.end - tlog.start) // UNIT_SIZE} units"
        damaged: list[int] = []
        for u in tlog.scan(start, None, damaged):
            while damaged and damaged[0] < u.pos:
                pos = damaged.pop(0)
                yield f"pos={pos} DAMAGED raw={tlog.files.read(pos, UNIT_SIZE).hex()}"
            yield (f"pos={u.pos} prev={u.prev_pos} magic={_magic(u.magic)} fire={_ts(u.fire_time)} "
                   f"enqueued={u.enqueue_time} offset={u.commit_offset} size={u.commit_size} seq={u.seq} "
                   f"topic_hash={u.topic_hash:#010x}")
        for pos in damaged:
            yield f"pos={pos} DAMAGED raw={tlog.files.read(pos, UNIT_SIZE).hex()}"
    finally:
        tlog.close()


def _magic(m: int) -> str:
    names = [f.name or "" for f in UnitMagic if m & f]
    return "|".join(names) if names else str(m)


def _dump_wheel(layout: Layout) -> Iterator[str]:
    path = layout.timerwheel
    precision, count, created = read_wheel_header(path)
    yield f"# TimerWheel {path}: {precision} ms x {count} slots (span {precision * count} ms), created {_ts(created)}"
    for idx, t, first, last, num, magic in iter_slots(path, count):
        yield f"slot={idx} time={_ts(t)} first={first} last={last} num={num} magic={_magic(magic)}"


def _dump_checkpoint(layout: Layout) -> Iterator[str]:
    for path in (layout.checkpoint, ckpt.previous(layout.checkpoint)):
        try:
            cp = ckpt.load(path)
        except FileNotFoundError:
            yield f"# {path.name}: missing"
            continue
        except (CorruptData, UnsupportedVersion) as e:
            yield f"# {path.name}: INVALID {type(e).__name__}: {e}"
            continue
        yield f"# {path.name}: valid"
        yield f"commit_indexed={cp.commit_indexed}"
        yield f"commit_end={cp.commit_end}"
        yield f"timerlog_end={cp.timerlog_end} ({cp.timerlog_end // UNIT_SIZE} units)"
        yield f"read_time_ms={_ts(cp.read_time_ms)}"
        yield f"next_seq={cp.next_seq}"
        yield f"created_ms={_ts(cp.created_ms)}"
        for t, n in sorted(cp.ready_ends.items()):
            yield f"ready_end[{t}]={n}"
        yield f"counters={cp.counters}"
        yield f"far_schedule={len(cp.far_schedule)} hours, {sum(cp.far_schedule.values())} messages"
        yield f"schedule={len(cp.schedule)} bytes (zlib)"
        yield f"groups={sorted(cp.groups)}"


def _dump_ready(layout: Layout, topic: str | None, start: int) -> Iterator[str]:
    for t in [topic] if topic else _topics(layout):
        q = ReadyQueue(layout.ready / t, BIG_SEGMENT // READY_UNIT_SIZE, readonly=True)
        try:
            yield f"# ready queue {t}: units [{q.start}, {q.end})"
            for u in q.scan(start):
                yield (f"topic={t} index={u.index} offset={u.commit_offset} size={u.commit_size} "
                       f"tag_hash={u.tag_hash:#010x} deliver_at={_ts(u.deliver_at)} released_at={u.released_at} "
                       f"late_ms={u.released_at - u.deliver_at} seq={u.seq}")
        finally:
            q.close()


def _dump_msgtable(layout: Layout, start: int, config: object | None) -> Iterator[str]:
    per_segment = int(getattr(config, "msgtable_segment_entries", 1 << 20))
    table = MessageTable(layout.msgtable, per_segment, readonly=True)
    try:
        for seg in table.segments():
            for seq, state, flags, roll, size, off in table.entries(seg):
                if seq >= start:
                    name = MessageState(state).name if state <= max(MessageState) else str(state)
                    yield f"seq={seq} state={name} flags={flags} roll={roll} offset={off} size={size}"
    finally:
        table.close()
