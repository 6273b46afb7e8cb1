"""Recovery: scan, check, truncate, count — then re-index through the normal path.

`open_store(path, cfg)` opens a data directory (LOCK, format check, node id: storage.datadir)
and `recover(data, cfg)` builds every component from the files and then the Store. The
sequence and why it is safe are in storage.store's docstring. Its first part only reads (which
checkpoint to trust, whether the wheel's geometry fits): the first write is the commit-log scan's
cut of a torn tail, and that scan raises UnsupportedVersion on a record of a newer format before
it cuts anything — data a newer build wrote is refused, never repaired. Each repair is counted
in the RecoveryReport, whose `line()` is the one summary log line; every truncation is also
logged at WARNING with what it cut.
"""

from __future__ import annotations

import logging
import struct
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from delayd.storage import batch, farindex
from delayd.storage import checkpoint as ckpt
from delayd.storage.batch import MROW, MROW_FMT, ROW_KEYED
from delayd.storage.commitlog import CommitLog, Record, RecordType, ScanReport
from delayd.storage.counters import Counters
from delayd.storage.datadir import DataDir, Layout
from delayd.storage.dispatch import Dispatch
from delayd.storage.errors import CorruptData, GeometryMismatch, Insane, StorageError
from delayd.storage.indexer import Indexer
from delayd.storage.keyindex import KeyIndex, open_or_set_aside
from delayd.storage.msgtable import BATCH_GAP, MessageState, MessageTable
from delayd.storage.readyqueues import ReadyQueues
from delayd.storage.retention import Retention
from delayd.storage.schedule import Placed, Schedule
from delayd.storage.store import Store, StoreConfig
from delayd.storage.timerindex import TimerIndex
from delayd.storage.timerlog import UNIT_SIZE, TimerLog
from delayd.storage.timerwheel import TimerWheel
from delayd.storage.timerwheel import validate as validate_wheel

log = logging.getLogger("delayd.storage")

REPLAY_BATCH = 4096  # records a chunk of recovery's passes (MessageRows read and indexed together)
# Keys the key index's replay leaves queued for the first checkpoint (about 74 bytes each, packed):
# twice the broker's default max_unwritten_keys, about what a kill -9 under a keyed flood leaves
# (its bound plus the keys of the checkpoint being written). Past it (a rebuild) the replay writes
# them as it goes.
REPLAY_KEYS_HELD = 1_000_000
_LOC = struct.Struct("<qI")  # a record's (offset, size), as record_keys takes them
_U32 = struct.Struct("<I")
_AT, _TYPE = 16, 38  # where a MessageRow holds its record's (offset, size), its record type
_RELEASE_B, _CANCEL_B = bytes([int(RecordType.RELEASE)]), bytes([int(RecordType.CANCEL)])
_KEYED = bytes(b & ROW_KEYED for b in range(256))  # bytes.translate: a row's bits -> its ROW_KEYED bit
_MESSAGE, _ROLL, _CANCEL, _RELEASE, _GROUP = (int(t) for t in (RecordType.MESSAGE, RecordType.ROLL, RecordType.CANCEL,
                                                                RecordType.RELEASE, RecordType.GROUP))


@dataclass(slots=True)
class RecoveryReport:
    checkpoint: str = "none"  # "ok", "none", or why it was rejected
    commit: ScanReport = field(default_factory=ScanReport)
    replayed_records: int = 0
    units_stripped: int = 0
    timerlog_truncated: int = 0
    wheel: str = "ok"  # "ok", "rebuilt (<why>)"
    ready_replayed: int = 0
    keys_replayed: int = 0
    keys: str = "ok"
    far_replayed: int = 0
    far: str = "ok"
    group_events: list[Record] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        c = self.commit
        return (f"recovery done in {self.seconds:.3f}s: checkpoint {self.checkpoint}; commit log "
                f"{c.records} records scanned, {c.truncated_bytes} bytes truncated, {c.skipped_records} "
                f"damaged records ({c.skipped_bytes} bytes) skipped; {self.replayed_records} records "
                f"re-indexed; TimerLog {self.units_stripped} units unlinked, {self.timerlog_truncated} "
                f"bytes truncated; wheel {self.wheel}; {self.ready_replayed} deliveries replayed; key index "
                f"{self.keys}, {self.keys_replayed} records replayed; far index {self.far}, "
                f"{self.far_replayed} messages replayed")


def open_store(path: Path, cfg: StoreConfig | None = None, clock_ms: Callable[[], int] | None = None, *,
               node_id: str | None = None) -> tuple[Store, RecoveryReport]:
    """Open the data directory at `path` and recover it: the Store, and what recovery did."""
    data = DataDir.open(Path(path), node_id)
    try:
        return recover(data, cfg or StoreConfig(), clock_ms or (lambda: int(time.time() * 1000)))
    except BaseException:
        data.close()
        raise


def _aside(path: Path, why: str) -> Path:
    aside = path.with_name(f"{path.name}.bad-{int(time.time() * 1000)}")
    path.rename(aside)
    log.warning("%s unusable (%s); moved to %s", path.name, why, aside.name)
    return aside


# ------------------------------------------------------------------------------ read-only first part

@dataclass(slots=True)
class _Found:
    """What the read-only part decided."""
    checkpoint: ckpt.Checkpoint | None
    timerlog_bad: str | None  # why the TimerLog cannot be used (None: it can)
    msgtable_bad: str | None
    wheel_bad: CorruptData | GeometryMismatch | None
    wheel_missing: bool


def _inspect(layout: Layout, cfg: StoreConfig, commit: CommitLog, rep: RecoveryReport) -> _Found:
    timerlog_bad = msgtable_bad = None
    timerlog_end = 0
    try:
        tl = TimerLog(layout.timerlog, cfg.timerlog_segment_units, readonly=True)
        timerlog_end = tl.end - tl.end % UNIT_SIZE
        tl.close()
    except CorruptData as e:
        timerlog_bad = f"{type(e).__name__}: {e}"
    msgs = MessageTable(layout.msgtable, cfg.msgtable_segment_entries, readonly=True)
    try:
        for seg in msgs.segments():
            msgs.has_entry(seg * cfg.msgtable_segment_entries)  # reads and checks the header
    except CorruptData as e:
        msgtable_bad = f"{type(e).__name__}: {e}"
    wheel_bad: CorruptData | GeometryMismatch | None = None
    wheel_missing = not layout.timerwheel.exists() or layout.timerwheel.stat().st_size == 0
    if not wheel_missing:
        try:
            validate_wheel(layout.timerwheel, cfg.precision_ms, cfg.slot_count)
        except (CorruptData, GeometryMismatch) as e:
            wheel_bad = e
    try:
        cp = _load_checkpoint(layout, commit, msgs, rep, timerlog_end,
                              msgtable_usable=layout.msgtable.is_dir() and msgtable_bad is None)
    finally:
        msgs.close()
    if cp is not None and isinstance(wheel_bad, GeometryMismatch):
        # The TimerLog's chains follow the old slots and cannot be re-linked into the new
        # ones: index everything again from the commit log, as without a checkpoint.
        rep.checkpoint = f"set aside: wheel geometry changed; full rescan (checkpoint {rep.checkpoint})"
        cp = None
    return _Found(cp, timerlog_bad, msgtable_bad, wheel_bad, wheel_missing)


def _load_checkpoint(layout: Layout, commit: CommitLog, msgs: MessageTable, rep: RecoveryReport,
                     timerlog_end: int, msgtable_usable: bool) -> ckpt.Checkpoint | None:
    """The newest valid checkpoint (current, else the previous one), or None. Besides its
    own checks, it must agree with the files it describes: a derived file that lost what the
    checkpoint counts on (a truncated TimerLog, a deleted message table) forces a rescan."""
    problems = []
    for path in (layout.checkpoint, ckpt.previous(layout.checkpoint)):
        try:
            cp = ckpt.load(path)
            if cp.commit_end > commit.end:
                raise Insane(f"expects a commit log of {cp.commit_end} bytes, found {commit.end}")
            if cp.commit_indexed < commit.start:
                raise Insane("points before the oldest commit-log segment")
            if cp.timerlog_end > timerlog_end:
                raise Insane(f"expects a TimerLog of {cp.timerlog_end} bytes, found {timerlog_end}")
            last, per = cp.next_seq - 1, msgs.segment_entries
            if last > 0 and (not msgtable_usable or (
                    (last // per + 1) * per > cp.next_seq and not msgs.has_entry(last))):
                # (A segment wholly below next_seq may be gone to retention, never a partial one.)
                raise Insane(f"the message table lacks entries up to seq {last}")
            if not msgtable_usable and commit.end > commit.start:
                # An older checkpoint (even an empty one, next_seq 1) is no help either: the
                # replay after it needs the entries that every append wrote.
                raise Insane("the message table is missing")
        except FileNotFoundError:
            if path.name == "checkpoint" and ckpt.previous(path).exists():
                problems.append("checkpoint: missing")  # the recovery line says it fell back
            continue
        except CorruptData as e:
            problems.append(f"{path.name}: {type(e).__name__}: {e}")
            log.warning("checkpoint %s rejected: %s", path.name, e)
            continue
        rep.checkpoint = "ok" if not problems else f"fell back to {path.name} ({'; '.join(problems)})"
        return cp
    rep.checkpoint = f"rejected ({'; '.join(problems)}); full rescan" if problems else "none"
    return None


# ------------------------------------------------------------------------------ recovery

def recover(data: DataDir, cfg: StoreConfig, clock_ms: Callable[[], int]) -> tuple[Store, RecoveryReport]:
    t0 = time.monotonic()
    rep = RecoveryReport()
    layout = data.layout
    commit = CommitLog(layout.commitlog, cfg.commit_segment_bytes)
    found = _inspect(layout, cfg, commit, rep)
    cp = found.checkpoint
    start = cp.commit_indexed if cp else commit.start
    # The first write: cutting a torn tail. A newer record on the way raises before it.
    rep.commit = commit.recover(start)

    if found.timerlog_bad:
        _aside(layout.timerlog, found.timerlog_bad)
    if found.msgtable_bad:
        _aside(layout.msgtable, found.msgtable_bad)
    tlog = TimerLog(layout.timerlog, cfg.timerlog_segment_units)
    tlog.cut_torn_tail()
    if found.wheel_bad is not None:
        _aside(layout.timerwheel, f"{type(found.wheel_bad).__name__}: {found.wheel_bad}")
        rep.wheel = f"rebuilt ({type(found.wheel_bad).__name__})"
    wheel = TimerWheel(layout.timerwheel, cfg.precision_ms, cfg.slot_count)
    msgs = MessageTable(layout.msgtable, cfg.msgtable_segment_entries)
    keys, keys_rebuilt = open_keys(layout.keys)
    far, far_rebuild = farindex.open_far(layout.far)
    ready = ReadyQueues(layout.ready, cfg.ready_segment_units, cfg.ready_open_files)
    timers = TimerIndex(tlog, wheel)
    counters = Counters()
    schedule = Schedule(cfg.precision_ms, cfg.slot_count)
    dispatch = Dispatch(commit=commit, msgs=msgs, timers=timers, schedule=schedule, counters=counters, ready=ready,
                        keys=keys, load_time_ms=0, read_time_ms=0)
    indexer = Indexer(roll_window_ms=cfg.roll_window_ms, commit=commit, msgs=msgs, timers=timers, schedule=schedule,
                      counters=counters, dispatch=dispatch, far=far, indexed=start)
    retention = Retention(roll_window_ms=cfg.roll_window_ms, lookahead_ms=cfg.lookahead_ms,
                          precision_ms=cfg.precision_ms, commit=commit, timers=timers, msgs=msgs, ready=ready,
                          keys=keys, far=far, indexed_at=cp.indexed_at if cp else None)
    store = Store(data, cfg, clock_ms, commit=commit, msgs=msgs, keys=keys, far=far, timers=timers, ready=ready,
                  counters=counters, schedule=schedule, dispatch=dispatch, indexer=indexer, retention=retention,
                  next_seq=cp.next_seq if cp else 1, durable_indexed=cp.commit_indexed if cp else 0,
                  groups_snapshot=cp.groups if cp else {})
    try:
        _repair(store, cp, found, rep, keys_rebuilt, far_rebuild)
    except BaseException:
        store.close()
        raise
    rep.seconds = time.monotonic() - t0
    return store, rep


def _repair(store: Store, cp: ckpt.Checkpoint | None, found: _Found, rep: RecoveryReport, keys_rebuilt: bool,
            far_rebuild: bool) -> None:
    layout, commit, timers, msgs = store.data.layout, store.commit, store.timers, store.msgs
    counters, dispatch, indexer = store.counters, store.dispatch, store.indexer
    now = store.clock_ms()
    start = indexer.indexed
    if cp is not None:
        dispatch.read_time_ms = dispatch.load_time_ms = cp.read_time_ms
        counters.restore(cp.counters)
        store.schedule.restore(cp.schedule, cp.far_schedule)
        if rep.wheel == "ok" and (timers.wheel.created or timers.check_slots()):
            rep.wheel = "rebuilt (missing)" if timers.wheel.created else "rebuilt (damaged slots)"
        if rep.wheel == "ok":
            try:
                rep.units_stripped = timers.strip_after(cp.timerlog_end)
            except CorruptData as e:
                rep.wheel = f"rebuilt (damaged TimerLog: {e})"
        if rep.wheel != "ok":
            timers.rebuild_from_log(dispatch.read_time_ms, cp.timerlog_end)
        rep.timerlog_truncated = timers.log.truncate(cp.timerlog_end, "TimerLog: units past the checkpoint are "
                                                                      "redone from the commit log")
    else:
        # No usable checkpoint: every derived structure is rebuilt from the commit log.
        # A checkpoint file left in place would describe the TimerLog and wheel about to be
        # discarded; trusted after a crash before the next checkpoint it would lose messages.
        for p in (layout.checkpoint, ckpt.previous(layout.checkpoint)):
            if p.exists():
                p.rename(p.with_name(f"{p.name}.bad-{int(time.time() * 1000)}"))
        timers.log.files.reset(timers.log.end)
        timers.wheel.reset()
        dispatch.read_time_ms = dispatch.load_time_ms = timers.wheel.slot_time(now)
        if rep.wheel == "ok" and not timers.wheel.created:
            rep.wheel = "rebuilt (no checkpoint)"

    # The ready queues are derived from the RELEASE records: append what a record past the
    # checkpoint says and a queue lacks (a crash between the record and the units, or a
    # replica's queue). Counted below, with the rest of the queue past the checkpoint.
    for rows in _rows(commit, cp.commit_end if cp is not None else commit.start):
        types = rows[_TYPE::MROW]
        k = types.find(_RELEASE_B)
        while k >= 0:
            dispatch.apply_release(commit.read(*_LOC.unpack_from(rows, k * MROW + _AT)), count=False)
            k = types.find(_RELEASE_B, k + 1)
        for (rtype, th), (n, k) in batch.ops.census(rows).items() if cp is not None else ():
            if rtype in (_MESSAGE, _CANCEL):
                topic = dispatch.topic_name(th, *_LOC.unpack_from(rows, k * MROW + _AT))
                (counters.produced if rtype == _MESSAGE else counters.cancelled)(topic, n)
    # Deliveries past the checkpoint: the ready queues are their record. Counters change
    # only with appends (produce/cancel to the commit log, release to a ready queue), so
    # replaying exactly the appends after the checkpoint's snapshot makes them exact.
    ends = cp.ready_ends if cp else {}
    for topic in store.ready.topics():
        for u in store.ready.scan(topic, ends.get(topic, 0)):
            st, off, size, roll = msgs.get(u.seq)
            if st != MessageState.DELIVERED:
                msgs.set(u.seq, MessageState.DELIVERED, off if off >= 0 else u.commit_offset,
                         size or u.commit_size, roll)
            counters.delivered(topic, 1, was_scheduled=cp is not None)
            rep.ready_replayed += 1

    # Without a checkpoint the message table is first brought up to date from the whole log,
    # so that indexing below sees each message's final record and state.
    full = cp is None
    if full:
        indexer.full_until = commit.end
        for rec in commit.scan(start):
            _rebuild_message_state(msgs, counters, rec)
    # Re-index the commit log from C: the normal enqueue path (`Indexer.index_rows`), a chunk of
    # MessageRows at a time. A chunk that is blocked (a long stop: the wheel must turn first)
    # leaves the rest to enqueue-get, which goes on from `indexed`; the pass still restores
    # state and collects group events.
    blocked = False
    for rows in _rows(commit, start):
        if not full:  # (the entries _restore_state reads and writes, a read a run of seqs)
            msgs.begin_runs(batch.ops.seq_runs(rows, msgs.segment_entries, BATCH_GAP, MROW, 0))
        try:
            # Message-table writes after the checkpoint were never fsynced: after a power cut
            # they may be gone. The log says what they were (the batch core restores the
            # entries the batch holds; the rows it leaves are done here, in order).
            top, left = batch.ops.restore_states(rows, msgs.spans, not full)
            store.next_seq = max(store.next_seq, top)
            for (k,) in _U32.iter_unpack(left):
                seq, _due, offset, size, _th, _tag, roll, rtype, _flags = MROW_FMT.unpack_from(rows, k * MROW)
                if rtype == _GROUP:
                    rep.group_events.append(commit.read(offset, size))
                else:
                    _restore_state(msgs, rtype, seq, offset, size, roll)
        finally:
            msgs.end_batch()
        if not blocked:
            blocked = _replay(indexer, rows, now, rep)
    if not blocked:
        indexer.indexed = commit.end
    _recover_keys(store, cp, rep, keys_rebuilt)
    _recover_far(store, cp, rep, far_rebuild, start)


def _rows(commit: CommitLog, start: int, end: int | None = None) -> Iterator[bytes]:
    """MessageRows of every intact record from `start` up to `end` (default: the log's end),
    REPLAY_BATCH records a chunk: the compiled scan, CRC-checked (a damaged record is skipped, as
    `CommitLog.scan` skips it; `recover` has reported it). Recovery's passes read the log so, and
    decode only the records they need whole (RELEASE, GROUP, keyed ones)."""
    pos, stop = start, commit.end if end is None else end
    while pos < stop:
        rows, pos = batch.read_rows(commit, pos, REPLAY_BATCH, stop, verify=True)
        if not rows:
            return  # (the commit log's scan found no record up to the end)
        yield rows


def _replay(indexer: Indexer, rows: bytes, now: int, rep: RecoveryReport) -> bool:
    """Index one chunk of MessageRows; True when it was blocked. (Late messages are not handed
    on: recovered units sit in slot R, which dequeue-get loads first anyway.)"""
    result = indexer.index_rows(rows, now)
    rep.replayed_records += result.consumed
    if result.blocked:
        indexer.indexed = MROW_FMT.unpack_from(rows, result.consumed * MROW)[2]
        log.info("recovery: re-indexing paused at offset %d until the wheel turns (a long stop)",
                 indexer.indexed)
    return result.blocked


def open_keys(path: Path) -> tuple[KeyIndex, bool]:
    """The key index, and whether it was unusable (closed, set aside and started empty)."""
    return open_or_set_aside(path, KeyIndex, "key index")


def _recover_keys(store: Store, cp: ckpt.Checkpoint | None, rep: RecoveryReport, rebuilt: bool) -> None:
    """Bring the key index up to the log: replay from where its own commit says it is
    complete (or from the checkpoint, whichever is older; everything if it is behind the
    oldest segment or was rebuilt). The replay queues its writes as produce does, and the
    first checkpoint writes them (its thread; lookups meanwhile answered from the overlay);
    only past REPLAY_KEYS_HELD keys does it write them here."""
    keys, commit = store.keys, store.commit
    pos = min(keys.commit_pos, cp.commit_indexed if cp else commit.start)
    if rebuilt or pos < commit.start or (keys.created and commit.end > commit.start):
        keys.reset()
        pos = commit.start
        rep.keys = "rebuilt"
    for chunk in _rows(commit, pos):
        keyed = chunk[MROW - 1::MROW].translate(_KEYED)  # (a MessageRow's last byte: its bits)
        if not keyed.strip(b"\0"):
            continue  # no key to replay
        rep.keys_replayed += keyed.count(ROW_KEYED)
        # Each produce's run of messages queued as that produce did (KeyIndex.put_run), and the
        # keys of the cancels between them released, in the log's order.
        cancels, done_to = _keyed_cancels(chunk[_TYPE::MROW], keyed), 0
        bounds = array("I", batch.ops.message_runs(chunk))
        for first, end in [*zip(bounds[0::2], bounds[1::2], strict=True), (len(keyed), len(keyed))]:
            while done_to < len(cancels) and cancels[done_to] < first:
                rec = commit.read(*_LOC.unpack_from(chunk, cancels[done_to] * MROW + _AT))
                if rec.key is not None:
                    keys.release(rec.topic, rec.key, rec.seq)
                done_to += 1
            if keyed.find(ROW_KEYED, first, end) >= 0:
                _put_keys(store, chunk[first * MROW:end * MROW])
        if keys.unwritten >= REPLAY_KEYS_HELD:  # (a rebuild: written as it goes, not all held)
            _seq, _due, offset, size, *_rest = MROW_FMT.unpack_from(chunk, len(chunk) - MROW)
            keys.commit(offset + size)
    ends = cp.ready_ends if cp else {}
    done = []
    for topic in store.ready.topics():
        for u in store.ready.scan(topic, ends.get(topic, 0)):
            try:
                rec = commit.read(u.commit_offset, u.commit_size)
            except StorageError:
                continue
            if rec.key is not None:
                done.append((u.released_at, topic, rec.key, u.seq))
    keys.delivered(done)


def _keyed_cancels(types: bytes, keyed: bytes) -> list[int]:
    """The rows that are keyed CANCEL records, from a chunk's type and ROW_KEYED columns."""
    out, k = [], types.find(_CANCEL_B)
    while k >= 0:
        if keyed[k]:
            out.append(k)
        k = types.find(_CANCEL_B, k + 1)
    return out


def _put_keys(store: Store, run: bytes) -> None:
    """Queue the keys of `run`, the MessageRows of consecutive messages of one topic (a produce's,
    `message_runs`), as that produce did (`put_run`): their keys taken by the batch core from one
    read per stretch of the log (`record_keys`, no Record a message). A run with a record the
    core could not take is read record by record."""
    commit = store.commit
    locs = run[_AT:] + bytes(_AT)  # each row's (offset, size) at the start of MROW bytes
    keys, seqs, problems = batch.ops.record_keys(locs, store.dispatch.read_runs(locs, MROW), MROW)
    first, _due, offset, size, th, *_rest = MROW_FMT.unpack_from(run)
    n = len(run) // MROW
    if not problems and seqs == array("Q", range(first, first + n)).tobytes():
        dues = array("q", memoryview(run).cast("q")[1::MROW // 8])
        store.keys.put_run(store.dispatch.topic_name(th, offset, size), keys, first, dues)
        return
    rows = []
    for seq, deliver_at, offset, size, *_rest in MROW_FMT.iter_unpack(run):
        try:
            rec = commit.read(offset, size)
        except StorageError:
            continue
        if rec.key is not None:
            rows.append((rec.topic, rec.key, seq, deliver_at))
    store.keys.put_many(rows)


def _recover_far(store: Store, cp: ckpt.Checkpoint | None, rep: RecoveryReport, rebuild: bool, start: int) -> None:
    """Bring the far index up to the log (storage.farindex): replay from where its own commit
    says it is complete, or rebuild it from the oldest segment when it is new or unusable or
    the message table was just rebuilt (no checkpoint). Re-indexing from `start` queued the
    rows of what it indexed, as it does at any time (enqueue-get queues those of what it
    indexes later, after a pass that was blocked): a replay stops there, unless the index was
    just emptied, which dropped them too."""
    far, commit = store.far, store.commit
    pos = min(far.commit_pos, cp.commit_indexed if cp else commit.start)
    end: int | None = start
    if rebuild or cp is None or pos < commit.start:
        far.reset()
        pos, end = commit.start, None
        rep.far = "rebuilt"
    rep.far_replayed = farindex.replay(far, _rows(commit, pos, end), store.msgs, int(Placed.FAR))
    far.commit(store.indexer.indexed)


def _rebuild_message_state(msgs: MessageTable, counters: Counters, rec: Record) -> None:
    """Full rescan: the message table and the counters from the log alone (`scheduled` is
    counted as the indexer finds each message pending)."""
    if rec.type == RecordType.MESSAGE:
        counters.add(rec.topic, "produced_total", 1)
        counters.total("produced")
    elif rec.type == RecordType.CANCEL and msgs.get(rec.seq)[0] != MessageState.DELIVERED:
        counters.add(rec.topic, "cancelled_total", 1)
        counters.total("cancelled")
    _restore_state(msgs, rec.type, rec.seq, rec.offset, rec.size, rec.roll_count)


def _restore_state(msgs: MessageTable, rtype: int, seq: int, offset: int, size: int, roll_count: int) -> None:
    """Make the message table agree with one record of the log (idempotent): its type, seq,
    offset, size and roll count (a MessageRow's)."""
    st, _off, _s, roll = msgs.get(seq)
    if rtype == _MESSAGE:
        if st == MessageState.UNKNOWN:
            msgs.set(seq, MessageState.SCHEDULED, offset, size, 0)
    elif rtype == _ROLL:
        if st in (MessageState.UNKNOWN, MessageState.SCHEDULED) and roll_count >= roll:
            msgs.set(seq, MessageState.SCHEDULED, offset, size, roll_count)
    elif rtype == _CANCEL and st not in (MessageState.DELIVERED, MessageState.CANCELLED):
        msgs.set_state(seq, MessageState.CANCELLED)
