"""The indexer: enqueue-put — commit-log records in, TimerLog units and wheel slots out.

    Indexer.index_rows(rows, now_ms) -> IndexResult     (MessageRows: storage.batch)
    Indexer.index(records, now_ms)   -> IndexResult     (decoded records: the same, for recovery)

is the per-batch loop. The compiled batch core (`batch.ops.index_rows`) takes every row it can —
GROUP records, messages (late and far ones included) and far messages' roll copies — and the rest
goes one by one through `_entry_for` / `_on_cancel_record` (cancel and RELEASE records, a full
rescan, a message the table does not know). The indexer owns `indexed` (C: the commit-log offset
below which every record is indexed) and reads the dequeue cursor from Dispatch: a unit for a slot
already loaded goes to the next slot (the durable path) and the message also comes back in
`IndexResult.late` (DueRows), for dequeue-put to take straight away.

Schedule counts are applied only after the batch's units are on disk: a batch that fails (a
full disk) and is retried counts once — /v1/schedule stays equal to the pending set after any
fault. (Message-table flags written by a failed attempt are rewritten identically by the retry.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from delayd.storage import batch
from delayd.storage.batch import MROW, due_row, row_of
from delayd.storage.commitlog import CommitLog, Record, RecordType
from delayd.storage.counters import Count, Counters
from delayd.storage.dispatch import Dispatch
from delayd.storage.errors import DiskFull, StorageError
from delayd.storage.farindex import FarIndex
from delayd.storage.msgtable import BATCH_GAP, MessageState, MessageTable
from delayd.storage.readyqueue import tag_hash
from delayd.storage.schedule import HOUR_MS, Placed, Schedule
from delayd.storage.timerindex import WHEEL_HEADER_SIZE, Entry, TimerIndex
from delayd.storage.timerlog import UNIT_SIZE, UnitMagic

# Plain-int and module-level aliases for the per-message hot path (enum attribute lookups and
# IntFlag arithmetic cost more than the rest of the work there).
_MESSAGE, _ROLL, _CANCEL, _GROUP = RecordType.MESSAGE, RecordType.ROLL, RecordType.CANCEL, RecordType.GROUP
_RELEASE = RecordType.RELEASE
_SCHEDULED, _DELIVERED, _CANCELLED = MessageState.SCHEDULED, MessageState.DELIVERED, MessageState.CANCELLED
_DEFAULT_BIT, _ROLL_BIT, _DELETE_BIT = int(UnitMagic.DEFAULT), int(UnitMagic.ROLL), int(UnitMagic.DELETE)
_SLOT, _FAR = int(Placed.SLOT), int(Placed.FAR)
BLOCKED = object()  # _entry_for: the next unit would overwrite an undispatched wheel lap


@dataclass(slots=True)
class IndexResult:
    consumed: int  # records indexed, from the first; fewer than given when `blocked` (or a write failed)
    late: bytes = b""  # DueRows indexed into a slot already loaded: release directly
    blocked: bool = False  # a unit would overwrite a wheel lap not dispatched yet: retry after a checkpoint


@dataclass(slots=True)
class _Counts:
    """Schedule changes of one batch, applied once its units are written."""
    slots: list[int] = field(default_factory=list)  # slot indexes +1
    unslots: list[int] = field(default_factory=list)  # slot indexes -1 (cancels)
    far: dict[int, int] = field(default_factory=dict)  # hour -> delta
    scheduled: dict[str, int] = field(default_factory=dict)  # full rescan: topic -> pending found
    far_put: list[tuple[int, int, int]] = field(default_factory=list)  # (deliver_at, seq, topic hash) parked far
    far_gone: list[tuple[int, int]] = field(default_factory=list)  # (deliver_at, seq) no longer parked far

    def add_far(self, deliver_at: int, n: int) -> None:
        h = deliver_at // HOUR_MS
        self.far[h] = self.far.get(h, 0) + n


class Indexer:
    def __init__(self, *, roll_window_ms: int, commit: CommitLog, msgs: MessageTable, timers: TimerIndex,
                 schedule: Schedule, counters: Counters, dispatch: Dispatch, far: FarIndex, indexed: int = 0) -> None:
        self.roll_window_ms = roll_window_ms
        self.commit, self.msgs, self.timers, self.schedule, self.far = commit, msgs, timers, schedule, far
        self.counters, self.dispatch = counters, dispatch
        self.indexed = indexed  # C
        # Recovery without a checkpoint: below this offset each message's current record counts
        # as first indexed (its schedule count and `scheduled` are rebuilt, not carried over).
        self.full_until = 0

    def index(self, records: list[Record], now_ms: int) -> IndexResult:
        """index_rows for decoded records (recovery replays them so)."""
        hashes = self.counters.hashes
        return self.index_rows(b"".join(row_of(r, hashes.get(r.topic)) for r in records), now_ms)

    def index_rows(self, rows: bytes, now_ms: int) -> IndexResult:
        """Index MessageRows in log order. Stops early (`blocked`) when a unit would overwrite a
        wheel lap not yet dispatched. A write that fails (disk full) ends the batch: what was
        indexed before it is reported as consumed and counted once; nothing of the row that
        failed is counted (the caller retries from it). Raises only when nothing was indexed."""
        n = len(rows) // MROW
        msgs, timers = self.msgs, self.timers
        wheel, tlog = timers.wheel, timers.log
        ops = batch.ops
        late: list[bytes] = []
        i = 0
        blocked = False
        d = self.dispatch.load_time_ms
        window_end = max(now_ms, d) + self.roll_window_ms
        unsafe_from = self.dispatch.read_time_ms + wheel.span_ms  # fire >= this: BLOCKED
        precision, nslots = wheel.precision_ms, wheel.slot_count
        # The batch's message-table entries are read (and written back) a run at a time.
        msgs.begin_runs(ops.seq_runs(rows, msgs.segment_entries, BATCH_GAP, MROW, 0))
        try:
            while i < n:
                _seq, _due, offset, size, *_rest = batch.MROW_FMT.unpack_from(rows, i * MROW)
                if offset >= self.full_until:
                    room = tlog.room_units()
                    consumed, units, slots, late_rows, counts, far, near = ops.index_rows(
                        rows, i, msgs.spans, wheel.buffer, WHEEL_HEADER_SIZE, precision, nslots, d, window_end,
                        unsafe_from, tlog.end, now_ms, room)
                    if units:
                        tlog.append(units)  # before the slots point at them; DiskFull: nothing counted
                    ops.put_slots(wheel.buffer, WHEEL_HEADER_SIZE, precision, nslots, slots)
                    self.schedule.count(counts)
                    if far or near:
                        self._far_rows(far, near)
                    late.append(late_rows)
                    i += consumed
                    if i >= n or len(units) == room * UNIT_SIZE:
                        continue  # done, or the segment is full (room_units() starts the next)
                    _seq, _due, offset, size, *_rest = batch.MROW_FMT.unpack_from(rows, i * MROW)
                # Not the compiled core's row: the full path, on the decoded record (a RELEASE
                # record whose units this process appended itself needs nothing).
                if offset in self.dispatch.own_releases:
                    self.dispatch.own_releases.discard(offset)
                    i += 1
                    continue
                if self._one(self.commit.read(offset, size), now_ms, late) is BLOCKED:
                    blocked = True
                    break
                i += 1
        except DiskFull:
            if not i:
                raise
        finally:
            msgs.end_batch()
        if i:
            _seq, _due, offset, size, *_rest = batch.MROW_FMT.unpack_from(rows, (i - 1) * MROW)
            self.indexed = max(self.indexed, offset + size)
        return IndexResult(i, b"".join(late), blocked)

    def _far_rows(self, far: bytes, near: bytes) -> None:
        """`_apply` for the messages the compiled core parked far and those whose roll copy came
        inside the window (FarRows): their hourly counts and far-index rows, as `_entry_for`
        counts them."""
        counts = _Counts(far_put=list(batch.FAR.iter_unpack(far)))
        for deliver_at, _seq, _th in counts.far_put:
            counts.add_far(deliver_at, 1)
        for deliver_at, seq, _th in batch.FAR.iter_unpack(near):
            counts.add_far(deliver_at, -1)
            counts.far_gone.append((deliver_at, seq))
        self._apply(counts)

    def _one(self, rec: Record, now_ms: int, late: list[bytes]) -> object | None:
        """Index one record the compiled core does not take; BLOCKED when its unit would
        overwrite an undispatched lap (nothing happened then)."""
        counts = _Counts()
        entries: list[Entry] = []
        rtype = rec.type
        if rtype == _MESSAGE or rtype == _ROLL:
            entry = self._entry_for(rec, now_ms, counts, late)
            if entry is BLOCKED:
                return BLOCKED
            if entry is not None:
                entries.append(entry)  # type: ignore[arg-type]
        elif rtype == _CANCEL:
            self._on_cancel_record(rec, counts, entries)
        elif rtype == _RELEASE:
            # The ready queue is derived from RELEASE records: nothing to do on the member that
            # released (its queue has the units), the units appended on a replica.
            self.dispatch.apply_release(rec)
        if entries:
            self.timers.add(entries, now_ms)  # DiskFull propagates: nothing below happened
        self._apply(counts)
        return None

    def _apply(self, counts: _Counts) -> None:
        self.schedule.apply(counts.slots, counts.unslots)
        for h, n in counts.far.items():
            if n:
                self.schedule.add_far(h * HOUR_MS, n)
        for topic, n in counts.scheduled.items():
            self.counters.add(topic, Count.SCHEDULED, n)
        if counts.far_put:
            self.far.put_many(counts.far_put)
        for deliver_at, seq in counts.far_gone:
            self.far.remove(deliver_at, seq)

    def _entry_for(self, rec: Record, now_ms: int, counts: _Counts, late: list[bytes]) -> Entry | object | None:
        """The unit to write for a message record; None to skip it, BLOCKED to stop the batch.
        (Runs once per message: locals and plain ints on purpose.)"""
        seq = rec.seq
        msgs = self.msgs
        st, off, size, roll = msgs.get(seq)
        th = self.counters.topic_hash(rec.topic)
        is_message = rec.type == _MESSAGE
        full = rec.offset < self.full_until
        first = is_message or full
        if full:
            if st != _SCHEDULED or off != rec.offset:
                return None
        elif is_message:
            if st == _CANCELLED:
                msgs.set_flags(seq, 0)  # never in the schedule
                return None
            if st == _DELIVERED or off != rec.offset:
                return None
        else:  # a roll copy: current only if the table points at it (or is about to)
            if st != _SCHEDULED:
                return None
            if off != rec.offset:
                if rec.roll_count < roll:
                    return None
                msgs.set(seq, _SCHEDULED, rec.offset, rec.size, rec.roll_count)
        d = self.dispatch.load_time_ms
        base = now_ms if now_ms > d else d  # never roll into a slot that is already behind the reader
        window = self.roll_window_ms
        deliver_at = rec.deliver_at
        if deliver_at > base + window:
            remain = deliver_at - base - window
            fire = base + (window // 2 if remain < window // 3 else window)
            magic = _ROLL_BIT
        else:
            fire = deliver_at
            magic = _DEFAULT_BIT
        if fire < d:
            fire = d
        if fire - self.timers.wheel.span_ms >= self.dispatch.read_time_ms:  # not timers.safe_to_write()
            return BLOCKED
        if full:
            counts.scheduled[rec.topic] = counts.scheduled.get(rec.topic, 0) + 1
        if magic == _ROLL_BIT:
            if first:
                counts.add_far(deliver_at, 1)
                counts.far_put.append((deliver_at, seq, th))
            msgs.set_flags(seq, _FAR)
        else:
            if not first:
                counts.add_far(deliver_at, -1)
                counts.far_gone.append((deliver_at, seq))
            if deliver_at >= d:
                counts.slots.append(self.schedule.slot_index(deliver_at))
                msgs.set_flags(seq, _SLOT)
            else:
                # Its slot was already loaded: the unit goes into the next slot (the durable path),
                # and the message also goes straight to dequeue-put so it is not a slot late.
                msgs.set_flags(seq, 0)
                late.append(due_row(rec.deliver_at, rec.seq, rec.offset, rec.size, th, tag_hash(rec.tag),
                                    rec.key is not None, self.timers.wheel.slot_time(fire)))
        return Entry(fire, magic, rec.offset, rec.size, th, rec.seq)

    def _on_cancel_record(self, rec: Record, counts: _Counts, entries: list[Entry]) -> None:
        """A cancel takes its message out of the schedule; in the window it also gets RIP-43's
        DELETE marker (after the message's own unit, in this batch or an earlier one: a walk,
        newest first, meets the marker before its target). Dispatch checks the message table
        too, which is what makes a cancel that races the slot still win."""
        flags = self.msgs.flags(rec.seq)
        if not flags & (_SLOT | _FAR):
            return
        _st, off, size, _roll = self.msgs.get(rec.seq)
        try:
            target = self.commit.read(off, size).deliver_at
        except StorageError:
            return  # its record is unreadable: dispatch drops the message as such
        if flags & _FAR:
            counts.add_far(target, -1)
            counts.far_gone.append((target, rec.seq))
        elif target >= self.dispatch.load_time_ms:
            counts.unslots.append(self.schedule.slot_index(target))
            entries.append(Entry(target, _DELETE_BIT, off, size, self.counters.topic_hash(rec.topic), rec.seq))
