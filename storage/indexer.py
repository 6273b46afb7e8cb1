"""The indexer: enqueue-put — commit-log records in, TimerLog units and wheel slots out.

    Indexer.index(records, now_ms) -> IndexResult

is the per-batch loop (one method on one component, so a compiled implementation can replace
its body without touching callers). It owns `indexed` (C: the commit-log offset below which
every record is indexed) and reads the dequeue cursor from Dispatch: a unit for a slot already
loaded goes to the next slot (the durable path) and the message also comes back in
`IndexResult.late`, for dequeue-put to take straight away.

Schedule counts are applied only after the batch's units are on disk: a batch that fails (a
full disk) and is retried counts once — /v1/schedule stays equal to the pending set after any
fault. (Message-table flags written by a failed attempt are rewritten identically by the retry.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from delayd.storage.commitlog import CommitLog, Record, RecordType
from delayd.storage.counters import Count, Counters
from delayd.storage.dispatch import Dispatch, Due
from delayd.storage.errors import StorageError
from delayd.storage.farindex import FarIndex
from delayd.storage.msgtable import MessageState, MessageTable
from delayd.storage.readyqueue import tag_hash
from delayd.storage.schedule import HOUR_MS, Placed, Schedule
from delayd.storage.timerindex import Entry, TimerIndex
from delayd.storage.timerlog import UnitMagic

# Plain-int and module-level aliases for the per-message hot path (enum attribute lookups and
# IntFlag arithmetic cost more than the rest of the work there).
_MESSAGE, _ROLL, _CANCEL, _GROUP = RecordType.MESSAGE, RecordType.ROLL, RecordType.CANCEL, RecordType.GROUP
_SCHEDULED, _DELIVERED, _CANCELLED = MessageState.SCHEDULED, MessageState.DELIVERED, MessageState.CANCELLED
_DEFAULT_BIT, _ROLL_BIT, _DELETE_BIT = int(UnitMagic.DEFAULT), int(UnitMagic.ROLL), int(UnitMagic.DELETE)
_SLOT, _FAR = int(Placed.SLOT), int(Placed.FAR)
BLOCKED = object()  # _entry_for: the next unit would overwrite an undispatched wheel lap


@dataclass(slots=True)
class IndexResult:
    consumed: int  # records indexed, from the first; fewer than given when `blocked`
    late: list[Due] = field(default_factory=list)  # indexed into a slot already loaded: release directly
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
        """Index records in log order. Stops early (`blocked`) when a unit would overwrite a
        wheel lap not yet dispatched; DiskFull leaves nothing counted (the caller retries)."""
        entries: list[Entry] = []
        counts = _Counts()
        late: list[Due] = []
        done = 0
        blocked = False
        msgs = self.msgs
        # The batch's message-table entries are read (and written back) a run at a time.
        msgs.begin_batch([rec.seq for rec in records if rec.type != _GROUP])
        try:
            entry_for, get, set_flags = self._entry_for, msgs.get, msgs.set_flags
            hashes, topic_hash, slots_add = self.counters.hashes, self.counters.topic_hash, counts.slots.append
            precision, nslots = self.schedule.precision_ms, self.schedule.slot_count
            # Fixed for the whole batch (nothing below moves them): hoisted for the fast path.
            d = self.dispatch.load_time_ms
            window_end = max(now_ms, d) + self.roll_window_ms
            unsafe_from = self.dispatch.read_time_ms + self.timers.wheel.span_ms  # fire >= this: BLOCKED
            fast = not records or records[0].offset >= self.full_until
            for rec in records:
                rtype = rec.type
                if fast and rtype == _MESSAGE:
                    # The common case, exactly as _entry_for decides it: a scheduled message due
                    # inside the window, in a slot not loaded yet. Anything else goes the long way.
                    deliver_at = rec.deliver_at
                    if d <= deliver_at <= window_end and deliver_at < unsafe_from:
                        st, off, _size, _roll = get(rec.seq)
                        if st == _SCHEDULED and off == rec.offset:
                            th = hashes.get(rec.topic)
                            if th is None:
                                th = topic_hash(rec.topic)
                            slots_add(deliver_at // precision % nslots)
                            set_flags(rec.seq, _SLOT)
                            entries.append(Entry(deliver_at, _DEFAULT_BIT, off, rec.size, th, rec.seq))
                            done += 1
                            continue
                if rtype == _MESSAGE or rtype == _ROLL:
                    entry = entry_for(rec, now_ms, counts, late)
                    if entry is BLOCKED:
                        blocked = True
                        break
                    if entry is not None:
                        entries.append(entry)  # type: ignore[arg-type]
                elif rtype == _CANCEL:
                    self._on_cancel_record(rec, counts, entries)
                done += 1
        finally:
            msgs.end_batch()
        if entries:
            self.timers.add(entries, now_ms)  # DiskFull propagates: nothing below happened
        self._apply(counts)
        if done:
            last = records[done - 1]
            self.indexed = max(self.indexed, last.offset + last.size)
        return IndexResult(done, late, blocked)

    def _apply(self, counts: _Counts) -> None:
        slots = self.schedule.slots
        for i in counts.slots:
            slots[i] += 1
        for i in counts.unslots:
            slots[i] = max(0, slots[i] - 1)
        for h, n in counts.far.items():
            if n:
                self.schedule.add_far(h * HOUR_MS, n)
        for topic, n in counts.scheduled.items():
            self.counters.add(topic, Count.SCHEDULED, n)
        for deliver_at, seq, th in counts.far_put:
            self.far.put(deliver_at, seq, th)
        for deliver_at, seq in counts.far_gone:
            self.far.remove(deliver_at, seq)

    def _entry_for(self, rec: Record, now_ms: int, counts: _Counts, late: list[Due]) -> Entry | object | None:
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
                late.append(Due(rec.deliver_at, rec.seq, rec.topic, rec.offset, rec.size, tag_hash(rec.tag),
                                self.timers.wheel.slot_time(fire), rec.key))
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
