"""Offline inspection of a data directory: `check` verifies every structure, `dump` prints them.

Both only read. They open files read-only and never take the LOCK, so they may run next to a
live daemon (bbolt's `check`/`dump` in spirit); what a daemon is writing at that very moment
can then show up as a torn tail, which is why a tail is reported separately from damage.

    check(data_dir, config=None) -> CheckReport        # `delayd check DATA_DIR`
    dump(data_dir, what, ...) -> Iterator[str]         # `delayd dump DATA_DIR WHAT`
        what: commitlog | timerlog | wheel | checkpoint | ready | msgtable
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from delayd.storage import checkpoint as ckpt
from delayd.storage import timerwheel
from delayd.storage.commitlog import HEADER_SIZE, MAX_RECORD, RECORD_VERSION, Record, decode
from delayd.storage.errors import (
    CorruptData,
    StorageError,
    TornRecord,
)
from delayd.storage.msgtable import ENTRY, ENTRY_SIZE, MessageState
from delayd.storage.readyqueue import UNIT as READY_UNIT
from delayd.storage.readyqueue import UNIT_SIZE as READY_UNIT_SIZE
from delayd.storage.segments import NAME_DIGITS
from delayd.storage.timerlog import NO_POS, UNIT_SIZE, Unit, UnitMagic, unpack_unit
from delayd.storage.timerwheel import HEADER as WHEEL_HEADER
from delayd.storage.timerwheel import SLOT, SLOT_SIZE

DUMP_KINDS = ("commitlog", "timerlog", "wheel", "checkpoint", "ready", "msgtable")
CHUNK = 1 << 20
MAX_PROBLEMS = 1000  # a wrecked file should not print a million lines


# ------------------------------------------------------------------------------ read-only files

class ReadOnlySegments:
    """The segment files of one directory, read with pread through read-only fds."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.bases: list[int] = []
        self.sizes: dict[int, int] = {}
        if self.directory.is_dir():
            for p in self.directory.iterdir():
                if p.name.isdigit() and len(p.name) == NAME_DIGITS:
                    self.bases.append(int(p.name))
                    self.sizes[int(p.name)] = p.stat().st_size
        self.bases.sort()
        self._fds: dict[int, int] = {}

    @property
    def exists(self) -> bool:
        return self.directory.is_dir()

    @property
    def start(self) -> int:
        return self.bases[0] if self.bases else 0

    @property
    def end(self) -> int:
        return self.bases[-1] + self.sizes[self.bases[-1]] if self.bases else 0

    def segment_of(self, offset: int) -> int | None:
        i = bisect.bisect_right(self.bases, offset) - 1
        if i < 0 or offset >= self.bases[i] + self.sizes[self.bases[i]]:
            return None
        return self.bases[i]

    def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes at `offset`, within one segment; b"" outside every segment."""
        base = self.segment_of(offset)
        if base is None:
            return b""
        fd = self._fds.get(base)
        if fd is None:
            fd = self._fds[base] = os.open(self.directory / f"{base:0{NAME_DIGITS}d}", os.O_RDONLY)
        return os.pread(fd, min(size, base + self.sizes[base] - offset), offset - base)

    def gaps(self) -> list[str]:
        out = []
        for a, b in zip(self.bases, self.bases[1:], strict=False):
            if a + self.sizes[a] != b:
                out.append(f"segment {a} ends at {a + self.sizes[a]} but the next one starts at {b}")
        return out

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def scan_records(segs: ReadOnlySegments, start: int = 0) -> Iterator[tuple[int, Record | CorruptData, int]]:
    """(offset, record or the error, bytes) for every record and every damaged stretch from `start`.

    After damage the scan resyncs on the next position where an intact record starts, like
    CommitLog.scan; a stretch with no intact record after it up to its segment end is one error.
    """
    for base in segs.bases:
        end = base + segs.sizes[base]
        pos = max(start, base)
        buf, buf_at = b"", pos
        while pos < end:
            if pos + HEADER_SIZE > buf_at + len(buf) or pos + _declared(buf, pos - buf_at) > buf_at + len(buf):
                want = max(CHUNK, _declared(segs.read(pos, 4), 0))
                buf, buf_at = segs.read(pos, want), pos
            try:
                rec = decode(buf, pos - buf_at, pos)
            except CorruptData as e:
                nxt = _resync(segs, pos, end)
                yield pos, e, nxt - pos
                pos = nxt
                buf, buf_at = b"", pos
                continue
            yield pos, rec, rec.size
            pos += rec.size


def _declared(buf: bytes, i: int) -> int:
    if len(buf) - i < 4:
        return HEADER_SIZE
    (n,) = struct.unpack_from("<I", buf, i)
    return n if HEADER_SIZE <= n <= MAX_RECORD else HEADER_SIZE


def _resync(segs: ReadOnlySegments, bad: int, end: int) -> int:
    data = segs.read(bad, end - bad)
    j = 1
    while True:
        # A record starts with length(4) crc(4) version(1): look for the version byte only.
        j = data.find(bytes((RECORD_VERSION,)), j + 8) - 8
        if j < 1 or j + HEADER_SIZE > len(data):
            return end
        try:
            decode(data, j, bad + j)
            return bad + j
        except CorruptData:
            j += 1


def read_record(segs: ReadOnlySegments, offset: int, size: int = 0) -> Record:
    buf = segs.read(offset, size or 4096)
    if not buf:
        raise TornRecord(f"no commit-log segment holds offset {offset}")
    n = _declared(buf, 0)
    if n > len(buf):
        buf = segs.read(offset, n)
    return decode(buf, 0, offset)


def read_wheel_header(path: Path) -> tuple[int, int, int]:
    """(precision_ms, slot_count, created_ms); the same validation as TimerWheel."""
    return timerwheel.read_header(path)


def iter_slots(path: Path, slot_count: int) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(index, time, first, last, num, magic) of every stored slot with num != 0 or a time."""
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
    d = Path(data_dir)
    rep = CheckReport(d)
    cp = _check_checkpoint(d, rep)
    commit = ReadOnlySegments(d / "commitlog")
    tlog = ReadOnlySegments(d / "timerlog")
    try:
        _check_commitlog(commit, cp, rep)
        _check_timerlog(tlog, cp, rep)
        _check_wheel(d / "timerwheel", tlog, cp, config, rep)
        _check_ready(d / "ready", commit, rep)
        _check_msgtable(d / "msgtable", cp, config, rep)
    finally:
        commit.close()
        tlog.close()
    return rep


def _check_checkpoint(d: Path, rep: CheckReport) -> ckpt.Checkpoint | None:
    found = None
    for path in (d / "checkpoint", ckpt.previous(d / "checkpoint")):
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


def _check_commitlog(segs: ReadOnlySegments, cp: ckpt.Checkpoint | None, rep: CheckReport) -> None:
    if not segs.exists:
        if cp is not None:
            rep.problem("commit log: directory missing")
        return
    rep.commit_segments = len(segs.bases)
    rep.commit_bytes = segs.end - segs.start
    for g in segs.gaps():
        rep.problem(f"commit log: {g}")
    last_base = segs.bases[-1] if segs.bases else 0
    last_good = segs.start
    pending_damage: list[tuple[int, CorruptData, int]] = []
    for off, item, n in scan_records(segs):
        if isinstance(item, Record):
            rep.commit_records += 1
            last_good = off + n
            for p_off, err, p_n in pending_damage:
                rep.damaged_records += 1
                rep.problem(f"commit log: damaged record at offset {p_off} ({p_n} bytes skipped): "
                            f"{type(err).__name__}: {err}")
            pending_damage = []
        else:
            pending_damage.append((off, item, n))
    for p_off, err, p_n in pending_damage:
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
        if cp.commit_end > segs.end:
            rep.problem(f"checkpoint: expects a commit log of {cp.commit_end} bytes, found {segs.end}")
        if segs.bases and cp.commit_indexed < segs.start:
            rep.problem(f"checkpoint: indexed offset {cp.commit_indexed} is before the oldest segment {segs.start}")


def _check_timerlog(segs: ReadOnlySegments, cp: ckpt.Checkpoint | None, rep: CheckReport) -> None:
    if not segs.exists:
        if cp is not None and cp.timerlog_end:
            rep.problem("TimerLog: directory missing")
        return
    for g in segs.gaps():
        rep.problem(f"TimerLog: {g}")
    for base in segs.bases:
        size = segs.sizes[base]
        if size % UNIT_SIZE:
            rep.problem(f"TimerLog: segment {base} holds {size} bytes, not whole {UNIT_SIZE}-byte units")
        pos = base
        while pos + UNIT_SIZE <= base + size:
            buf = segs.read(pos, min(CHUNK - CHUNK % UNIT_SIZE, base + size - pos))
            for i in range(0, len(buf) - UNIT_SIZE + 1, UNIT_SIZE):
                rep.timerlog_units += 1
                try:
                    unpack_unit(buf, i, pos + i)
                except CorruptData as e:
                    rep.damaged_units += 1
                    rep.problem(f"TimerLog: {e}")
            pos += len(buf) - len(buf) % UNIT_SIZE
    if cp is not None and segs.end < cp.timerlog_end:
        rep.problem(f"TimerLog: ends at {segs.end}, before the checkpoint's {cp.timerlog_end}; "
                    f"units the checkpoint counts on are gone")


def _check_wheel(path: Path, tlog: ReadOnlySegments, cp: ckpt.Checkpoint | None, config: object | None,
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


def _walk_chain(tlog: ReadOnlySegments, t: int, first: int, last: int, num: int, precision: int) -> str | None:
    pos, n, prev_unit = last, 0, None
    while pos != NO_POS:
        if pos % UNIT_SIZE or not tlog.start <= pos <= tlog.end - UNIT_SIZE:
            return f"chain reaches position {pos}, outside the TimerLog [{tlog.start}, {tlog.end})"
        buf = tlog.read(pos, UNIT_SIZE)
        try:
            unit = unpack_unit(buf, 0, pos)
        except (CorruptData, struct.error) as e:
            return f"unit at {pos}: {e}"
        if unit.fire_time - unit.fire_time % precision != t:
            return f"unit at {pos} fires at {unit.fire_time}, not in this slot"
        n += 1
        if n > num:
            return f"chain longer than num={num}"
        prev_unit, pos = unit, unit.prev_pos
    if n != num:
        return f"chain has {n} units, num says {num}"
    if prev_unit is not None and prev_unit.pos != first:
        return f"chain ends at {prev_unit.pos}, first_pos says {first}"
    return None


def _check_ready(directory: Path, commit: ReadOnlySegments, rep: CheckReport) -> None:
    if not directory.is_dir():
        return
    for qdir in sorted(directory.iterdir()):
        segs = ReadOnlySegments(qdir)
        try:
            for base in segs.bases:
                if segs.sizes[base] % READY_UNIT_SIZE:
                    rep.problem(f"ready/{qdir.name}: segment {base} does not hold whole units")
            for u in _ready_units(segs):
                rep.ready_units += 1
                index, off, size, _th, _deliver, _released, seq = u
                if off < commit.start:
                    continue  # its segment is past retention
                try:
                    rec = read_record(commit, off, size)
                    if rec.seq != seq or rec.size != size:
                        raise CorruptData(f"record there is seq {rec.seq} of {rec.size} bytes")
                except CorruptData as e:
                    rep.damaged_ready_units += 1
                    rep.problem(f"ready/{qdir.name}: unit {index} (seq {seq}) points at offset {off}: "
                                f"{type(e).__name__}: {e}")
        finally:
            segs.close()


def _ready_units(segs: ReadOnlySegments) -> Iterator[tuple[int, ...]]:
    for base in segs.bases:
        pos, end = base, base + segs.sizes[base]
        while pos + READY_UNIT_SIZE <= end:
            buf = segs.read(pos, min(CHUNK - CHUNK % READY_UNIT_SIZE, end - pos))
            for i in range(0, len(buf) - READY_UNIT_SIZE + 1, READY_UNIT_SIZE):
                yield ((pos + i) // READY_UNIT_SIZE, *READY_UNIT.unpack_from(buf, i))
            pos += len(buf) - len(buf) % READY_UNIT_SIZE


def _check_msgtable(directory: Path, cp: ckpt.Checkpoint | None, config: object | None, rep: CheckReport) -> None:
    per_segment = int(getattr(config, "msgtable_segment_entries", 1 << 20))
    if cp is not None and cp.next_seq > 1:
        seg, idx = divmod(cp.next_seq - 1, per_segment)
        path = directory / f"{seg:020d}"
        if not directory.is_dir():
            rep.problem("message table: directory missing (recovery must rescan the commit log)")
        elif (seg + 1) * per_segment > cp.next_seq and (
                not path.exists() or path.stat().st_size < (idx + 1) * ENTRY_SIZE):
            # Only a partial segment: a full one may be gone to retention.
            rep.problem(f"message table: entries up to seq {cp.next_seq - 1} (checkpoint) are missing")
    if not directory.is_dir():
        return
    for p in sorted(directory.iterdir()):
        if not (p.name.isdigit() and len(p.name) == NAME_DIGITS):
            continue
        with open(p, "rb") as f:
            data = f.read()
        for i, (state, _flags, _roll, _size, _off) in enumerate(ENTRY.iter_unpack(data[:len(data) - len(data) % ENTRY_SIZE])):
            if state:
                rep.msgtable_entries += 1
                if state > max(MessageState):
                    rep.problem(f"message table: seq {int(p.name) * per_segment + i} has state {state}")


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
    d = Path(data_dir)
    gens = {"commitlog": lambda: _dump_commitlog(d, segment, start), "timerlog": lambda: _dump_timerlog(d, start),
            "wheel": lambda: _dump_wheel(d), "checkpoint": lambda: _dump_checkpoint(d),
            "ready": lambda: _dump_ready(d, topic, start), "msgtable": lambda: _dump_msgtable(d, start, config)}
    if what not in gens:
        raise ValueError(f"dump what? one of {', '.join(DUMP_KINDS)}")
    for n, line in enumerate(gens[what]()):
        if limit is not None and n >= limit:
            return
        yield line


def _dump_commitlog(d: Path, segment: int | None, start: int) -> Iterator[str]:
    segs = ReadOnlySegments(d / "commitlog")
    try:
        if segment is not None:
            if segment not in segs.sizes:
                raise StorageError(f"no commit-log segment {segment}; segments: {segs.bases}")
            segs.bases = [segment]
        yield f"# commit log {segs.directory}: segments {segs.bases}"
        for off, item, n in scan_records(segs, start):
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
        segs.close()


def _dump_timerlog(d: Path, start: int) -> Iterator[str]:
    segs = ReadOnlySegments(d / "timerlog")
    try:
        yield f"# TimerLog {segs.directory}: [{segs.start}, {segs.end}), {(segs.end - segs.start) // UNIT_SIZE} units"
        for base in segs.bases:
            pos = max(base, start - start % UNIT_SIZE)
            end = base + segs.sizes[base]
            while pos + UNIT_SIZE <= end:
                buf = segs.read(pos, min(CHUNK - CHUNK % UNIT_SIZE, end - pos))
                for i in range(0, len(buf) - UNIT_SIZE + 1, UNIT_SIZE):
                    yield _unit_line(buf, i, pos + i)
                pos += len(buf) - len(buf) % UNIT_SIZE
    finally:
        segs.close()


def _unit_line(buf: bytes, i: int, pos: int) -> str:
    try:
        u: Unit = unpack_unit(buf, i, pos)
    except CorruptData as e:
        return f"pos={pos} DAMAGED: {e} raw={bytes(buf[i:i + UNIT_SIZE]).hex()}"
    return (f"pos={u.pos} prev={u.prev_pos} magic={_magic(u.magic)} fire={_ts(u.fire_time)} "
            f"enqueued={u.enqueue_time} offset={u.commit_offset} size={u.commit_size} seq={u.seq} "
            f"topic_hash={u.topic_hash:#010x}")


def _magic(m: int) -> str:
    names = [f.name or "" for f in UnitMagic if m & f]
    return "|".join(names) if names else str(m)


def _dump_wheel(d: Path) -> Iterator[str]:
    path = d / "timerwheel"
    precision, count, created = read_wheel_header(path)
    yield f"# TimerWheel {path}: {precision} ms x {count} slots (span {precision * count} ms), created {_ts(created)}"
    for idx, t, first, last, num, magic in iter_slots(path, count):
        yield f"slot={idx} time={_ts(t)} first={first} last={last} num={num} magic={_magic(magic)}"


def _dump_checkpoint(d: Path) -> Iterator[str]:
    for path in (d / "checkpoint", ckpt.previous(d / "checkpoint")):
        try:
            cp = ckpt.load(path)
        except FileNotFoundError:
            yield f"# {path.name}: missing"
            continue
        except CorruptData as e:
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


def _dump_ready(d: Path, topic: str | None, start: int) -> Iterator[str]:
    root = d / "ready"
    topics = [topic] if topic else sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    for t in topics:
        segs = ReadOnlySegments(root / t)
        try:
            yield f"# ready queue {t}: units [{segs.start // READY_UNIT_SIZE}, {segs.end // READY_UNIT_SIZE})"
            for index, off, size, th, deliver, released, seq in _ready_units(segs):
                if index >= start:
                    yield (f"topic={t} index={index} offset={off} size={size} tag_hash={th:#010x} "
                           f"deliver_at={_ts(deliver)} released_at={released} late_ms={released - deliver} seq={seq}")
        finally:
            segs.close()


def _dump_msgtable(d: Path, start: int, config: object | None) -> Iterator[str]:
    per_segment = int(getattr(config, "msgtable_segment_entries", 1 << 20))
    root = d / "msgtable"
    paths = sorted(p for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        first = int(p.name) * per_segment
        for i, (state, flags, roll, size, off) in enumerate(ENTRY.iter_unpack(data[:len(data) - len(data) % ENTRY_SIZE])):
            if state and first + i >= start:
                name = MessageState(state).name if state <= max(MessageState) else str(state)
                yield f"seq={first + i} state={name} flags={flags} roll={roll} offset={off} size={size}"

