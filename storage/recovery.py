"""Recovery: scan, check, truncate, count — then re-index through the normal path.

Mixed into storage.store.Store (it uses the store's files and counters). The sequence and
why it is safe are in the Store module's docstring; each repair is counted in the
RecoveryReport, whose `line()` is the one summary log line.
"""

from __future__ import annotations

import logging
import time
import zlib
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from delayd.storage import checkpoint as ckpt
from delayd.storage import farindex
from delayd.storage.commitlog import Record, RecordType, ScanReport
from delayd.storage.errors import CorruptData, GeometryMismatch, Insane, StorageError
from delayd.storage.keyindex import KeyIndex
from delayd.storage.msgtable import MessageState
from delayd.storage.timerindex import TimerIndex
from delayd.storage.timerlog import TimerLog
from delayd.storage.timerwheel import TimerWheel

if TYPE_CHECKING:
    from delayd.storage.store import Store

log = logging.getLogger("delayd.storage")


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


def recover(store: Store) -> RecoveryReport:
    t0 = time.monotonic()
    rep = RecoveryReport()
    tlog = TimerLog(store.dir / "timerlog", store.cfg.timerlog_segment_units)
    cp = _load_checkpoint(store, rep, tlog.end)

    wheel_path = store.dir / "timerwheel"
    try:
        wheel = TimerWheel(wheel_path, store.cfg.precision_ms, store.cfg.slot_count)
    except (GeometryMismatch, CorruptData) as e:
        aside = wheel_path.with_name(f"timerwheel.bad-{int(time.time())}")
        wheel_path.rename(aside)
        log.warning("TimerWheel unusable (%s); moved to %s and rebuilding", e, aside.name)
        wheel = TimerWheel(wheel_path, store.cfg.precision_ms, store.cfg.slot_count)
        rep.wheel = f"rebuilt ({type(e).__name__})"
        if isinstance(e, GeometryMismatch) and cp is not None:
            # The TimerLog's chains follow the old slots and cannot be re-linked into the new
            # ones: index everything again from the commit log, as without a checkpoint.
            rep.checkpoint = f"set aside: wheel geometry changed; full rescan (checkpoint {rep.checkpoint})"
            cp = None
    store.timers = TimerIndex(tlog, wheel)
    start = cp.commit_indexed if cp else store.commit.start
    rep.commit = store.commit.recover(start)

    now = store.clock_ms()
    if cp is not None:
        _restore(store, cp)
        if rep.wheel == "ok" and (wheel.created or store.timers.check_slots()):
            rep.wheel = "rebuilt (missing)" if wheel.created else "rebuilt (damaged slots)"
        if rep.wheel == "ok":
            try:
                rep.units_stripped = store.timers.strip_after(cp.timerlog_end)
            except CorruptData as e:
                rep.wheel = f"rebuilt (damaged TimerLog: {e})"
        if rep.wheel != "ok":
            rebuild_wheel(store, cp.timerlog_end)
        rep.timerlog_truncated = tlog.truncate(cp.timerlog_end)
    else:
        # No usable checkpoint: every derived structure is rebuilt from the commit log.
        # A checkpoint file left in place would describe the TimerLog and wheel about to be
        # discarded; trusted after a crash before the next checkpoint it would lose messages.
        for p in (store.dir / "checkpoint", ckpt.previous(store.dir / "checkpoint")):
            if p.exists():
                p.rename(p.with_name(f"{p.name}.bad-{int(time.time() * 1000)}"))
        tlog.files.reset(tlog.end)
        wheel.reset()
        store.read_time_ms = store.load_time_ms = store.timers.wheel.slot_time(now)
        if rep.wheel == "ok" and not wheel.created:
            rep.wheel = "rebuilt (no checkpoint)"
    store.indexed = start

    # Deliveries past the checkpoint: the ready queues are their record. Counters change
    # only with appends (produce/cancel to the commit log, release to a ready queue), so
    # replaying exactly the appends after the checkpoint's snapshot makes them exact.
    ends = cp.ready_ends if cp else {}
    for topic, q in store.ready.items():
        for u in q.scan(ends.get(topic, 0)):
            st, off, size, roll = store.msgs.get(u.seq)
            if st != MessageState.DELIVERED:
                store.msgs.set(u.seq, MessageState.DELIVERED, off if off >= 0 else u.commit_offset,
                              size or u.commit_size, roll)
            if cp is not None:
                store._count(topic, "scheduled", -1)
            store._count(topic, "delivered_total", 1)
            store.totals["delivered"] += 1
            rep.ready_replayed += 1
    if cp is not None:
        for rec in store.commit.scan(cp.commit_end):
            _count_append(store, rec)

    # Without a checkpoint the message table is first brought up to date from the whole log,
    # so that indexing below sees each message's final record and state.
    store._full = cp is None
    if store._full:
        for rec in store.commit.scan(start):
            _rebuild_message_state(store, rec)
    # Re-index the commit log from C: the normal enqueue path, batch by batch.
    batch: list[Record] = []
    for rec in store.commit.scan(start):
        store.next_seq = max(store.next_seq, rec.seq + 1)
        if rec.type == RecordType.GROUP:
            rep.group_events.append(rec)
        elif not store._full:
            # Message-table writes after the checkpoint were never fsynced: after a power
            # cut they may be gone. The log says what they were.
            _restore_state(store, rec)
        batch.append(rec)
        if len(batch) >= 4096:
            rep.replayed_records += store.index(batch, now)
            batch = []
    if batch:
        rep.replayed_records += store.index(batch, now)
    store._full = False
    store.late.clear()  # recovered units sit in slot R, which dequeue-get loads first anyway
    store.indexed = store.commit.end
    _recover_keys(store, cp, rep)
    _recover_far(store, cp, rep)
    rep.seconds = time.monotonic() - t0
    return rep


def open_keys(store: Store) -> KeyIndex:
    import sqlite3
    path = store.dir / "keys.sqlite"
    try:
        keys = KeyIndex(path)
        keys.count()
        return keys
    except (sqlite3.DatabaseError, CorruptData) as e:
        log.warning("key index unusable (%s); rebuilding it from the commit log", e)
        for p in store.dir.glob("keys.sqlite*"):
            p.rename(p.with_name(p.name.replace("keys.sqlite", f"keys.bad-{int(time.time())}.sqlite")))
        store.keys_rebuilt = True
        return KeyIndex(path)


def _recover_keys(store: Store, cp: ckpt.Checkpoint | None, rep: RecoveryReport) -> None:
    """Bring the key index up to the log: replay from where its own commit says it is
    complete (or from the checkpoint, whichever is older; everything if it is behind the
    oldest segment or was rebuilt)."""
    pos = min(store.keys.commit_pos, cp.commit_indexed if cp else store.commit.start)
    if store.keys_rebuilt or pos < store.commit.start or (
            store.keys.created and store.commit.end > store.commit.start):
        store.keys.reset()
        pos = store.commit.start
        rep.keys = "rebuilt"
    rows: list[tuple[str, str, int, int]] = []
    for rec in store.commit.scan(pos):
        if rec.key is None:
            continue
        rep.keys_replayed += 1
        if rec.type == RecordType.MESSAGE:
            rows.append((rec.topic, rec.key, rec.seq, rec.deliver_at))
        elif rec.type == RecordType.CANCEL:
            store.keys.put_many(rows)
            rows = []
            store.keys.release(rec.topic, rec.key, rec.seq)
    store.keys.put_many(rows)
    store.keys.commit(store.commit.end)
    ends = cp.ready_ends if cp else {}
    done = []
    for topic, q in store.ready.items():
        for u in q.scan(ends.get(topic, 0)):
            try:
                rec = store.commit.read(u.commit_offset, u.commit_size)
            except (StorageError, CorruptData):
                continue
            if rec.key is not None:
                done.append((u.released_at, topic, rec.key, u.seq))
    store.keys.delivered(done)
    store.keys.commit(store.commit.end)


def _recover_far(store: Store, cp: ckpt.Checkpoint | None, rep: RecoveryReport) -> None:
    """Bring the far index up to the log (storage.farindex): replay from where its own commit
    says it is complete, or rebuild it from the oldest segment when it is new or unusable or
    the message table was just rebuilt."""
    from delayd.storage.store import FLAG_FAR  # the store imports this module
    pos = min(store.far.commit_pos, cp.commit_indexed if cp else store.commit.start)
    if store.far_rebuild or cp is None or pos < store.commit.start:
        store.far.reset()
        pos = store.commit.start
        rep.far = "rebuilt"
    rep.far_replayed = farindex.replay(store.far, store.commit.scan(pos), store.msgs, FLAG_FAR)
    store.far.commit(store.indexed)
    store.far_rebuild = False


def _load_checkpoint(store: Store, rep: RecoveryReport, timerlog_end: int) -> ckpt.Checkpoint | None:
    """The newest valid checkpoint (current, else the previous one), or None. Besides its
    own checks, it must agree with the files it describes: a derived file that lost what the
    checkpoint counts on (a truncated TimerLog, a deleted message table) forces a rescan."""
    problems = []
    for path in (store.dir / "checkpoint", ckpt.previous(store.dir / "checkpoint")):
        try:
            cp = ckpt.load(path)
            if cp.commit_end > store.commit.end:
                raise Insane(f"expects a commit log of {cp.commit_end} bytes, found {store.commit.end}")
            if cp.commit_indexed < store.commit.start:
                raise Insane("points before the oldest commit-log segment")
            if cp.timerlog_end > timerlog_end:
                raise Insane(f"expects a TimerLog of {cp.timerlog_end} bytes, found {timerlog_end}")
            last, per = cp.next_seq - 1, store.msgs.segment_entries
            if last > 0 and (not store._msgtable_existed or (
                    (last // per + 1) * per > cp.next_seq and not store.msgs.has_entry(last))):
                # (A segment wholly below next_seq may be gone to retention, never a partial one.)
                raise Insane(f"the message table lacks entries up to seq {last}")
            if not store._msgtable_existed and store.commit.end > store.commit.start:
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


def _restore(store: Store, cp: ckpt.Checkpoint) -> None:
    store.next_seq = cp.next_seq
    store.read_time_ms = store.load_time_ms = cp.read_time_ms
    store.totals.update(cp.counters.get("totals", {}))
    store.topic_counts = {t: dict(c) for t, c in cp.counters.get("topics", {}).items()}
    for t in store.topic_counts:
        store.topic_names[zlib.crc32(t.encode())] = t
    if cp.schedule:
        raw = zlib.decompress(cp.schedule)
        if len(raw) == 4 * store.cfg.slot_count:
            store.slot_counts = array("i", raw)
    store.far_counts = dict(cp.far_schedule)
    store.groups_snapshot = cp.groups
    store.indexed_at = dict(cp.indexed_at)
    store.durable_indexed = cp.commit_indexed


def rebuild_wheel(store: Store, timerlog_end: int | None = None) -> None:
    damaged: list[int] = []
    store.timers.rebuild(store.timers.log.scan(store.timers.log.start, timerlog_end, damaged), store.read_time_ms)
    if damaged:
        # Their messages are lost to the timer (the unit held which message it was).
        log.error("TimerLog: %d damaged units skipped while rebuilding the wheel (first at %d)",
                  len(damaged), damaged[0])


def _count_append(store: Store, rec: Record) -> None:
    """Counter changes of one appended record (the same as at append time)."""
    if rec.type == RecordType.MESSAGE:
        store._count(rec.topic, "produced_total", 1)
        store._count(rec.topic, "scheduled", 1)
        store.totals["produced"] += 1
    elif rec.type == RecordType.CANCEL:
        store._count(rec.topic, "cancelled_total", 1)
        store._count(rec.topic, "scheduled", -1)
        store.totals["cancelled"] += 1


def _rebuild_message_state(store: Store, rec: Record) -> None:
    """Full rescan: the message table and the counters from the log alone."""
    if rec.type == RecordType.MESSAGE:
        store._count(rec.topic, "produced_total", 1)
        store.totals["produced"] += 1
    elif rec.type == RecordType.CANCEL and store.msgs.get(rec.seq)[0] != MessageState.DELIVERED:
        store._count(rec.topic, "cancelled_total", 1)
        store.totals["cancelled"] += 1
    _restore_state(store, rec)


def _restore_state(store: Store, rec: Record) -> None:
    """Make the message table agree with one record of the log (idempotent)."""
    st, off, _s, roll = store.msgs.get(rec.seq)
    if rec.type == RecordType.MESSAGE:
        if st == MessageState.UNKNOWN:
            store.msgs.set(rec.seq, MessageState.SCHEDULED, rec.offset, rec.size, 0)
    elif rec.type == RecordType.ROLL:
        if st in (MessageState.UNKNOWN, MessageState.SCHEDULED) and rec.roll_count >= roll:
            store.msgs.set(rec.seq, MessageState.SCHEDULED, rec.offset, rec.size, rec.roll_count)
    elif rec.type == RecordType.CANCEL and st not in (MessageState.DELIVERED, MessageState.CANCELLED):
        store.msgs.set_state(rec.seq, MessageState.CANCELLED)
