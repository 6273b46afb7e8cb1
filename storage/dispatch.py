"""Dispatch: the read side of the timer — dequeue-get, dequeue-get-message, dequeue-put.

It owns the dequeue cursor: `load_time_ms` (D, the next slot dequeue-get loads) and
`read_time_ms` (R as of the last checkpoint: every slot before it was dispatched, durably).
Each per-batch loop is one method taking a batch and returning a typed result, so a compiled
implementation can replace a loop body without touching its callers:

    open_slot(slot_time, chunk)  -> chunks of Units        (dequeue-get)
    resolve(units, slot_time)    -> Resolved               (dequeue-get-message)
    release(dues, now_ms)        -> list[Due] released     (dequeue-put)

Every state check goes to the message table, which is what makes a cancel that races the
pipeline win and a unit that is stale (its message rolled, was delivered or cancelled) drop out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from delayd.storage.commitlog import CommitLog, Record, RecordType, decode, encode
from delayd.storage.counters import Counters, Total
from delayd.storage.errors import CorruptData, OutOfDescriptors, StorageError, UnsupportedVersion
from delayd.storage.keyindex import KeyIndex
from delayd.storage.msgtable import MessageState, MessageTable
from delayd.storage.readyqueue import tag_hash
from delayd.storage.readyqueues import ReadyQueues
from delayd.storage.schedule import Schedule
from delayd.storage.timerindex import TimerIndex
from delayd.storage.timerlog import Unit, UnitMagic

log = logging.getLogger("delayd.storage")

READ_SPAN = 1 << 20  # read_many reads at most this much of the log at once
READ_GAP = 64 * 1024  # and bridges gaps up to this between records it needs
_SCHEDULED, _DELIVERED = MessageState.SCHEDULED, MessageState.DELIVERED
_ROLL_BIT = int(UnitMagic.ROLL)


@dataclass(slots=True)
class Due:
    """A message leaving the timer: released into its topic's ready queue at `deliver_at`."""
    deliver_at: int
    seq: int
    topic: str
    commit_offset: int
    commit_size: int
    tag_hash: int
    slot_time: int
    key: str | None = None


@dataclass(slots=True)
class Resolved:
    """What dequeue-get-message made of a chunk of one slot's units (`Dispatch.resolve`)."""
    due: list[Due] = field(default_factory=list)  # to release at their own millisecond
    roll: list[Record] = field(default_factory=list)  # far messages to re-append (roll forward)
    unreadable: list[tuple[Unit, CorruptData]] = field(default_factory=list)  # record damaged: message lost
    dropped: int = 0  # cancelled, delivered, or a stale unit of a message that rolled since


class Dispatch:
    def __init__(self, *, commit: CommitLog, msgs: MessageTable, timers: TimerIndex, schedule: Schedule,
                 counters: Counters, ready: ReadyQueues, keys: KeyIndex, load_time_ms: int,
                 read_time_ms: int) -> None:
        self.commit, self.msgs, self.timers, self.schedule = commit, msgs, timers, schedule
        self.counters, self.ready, self.keys = counters, ready, keys
        self.load_time_ms = load_time_ms  # D
        self.read_time_ms = read_time_ms  # R, durable (set when a checkpoint is saved)

    # ---------------------------------------------------------------------------------- dequeue-get
    def open_slot(self, slot_time: int, chunk: int = 1024) -> Iterator[list[Unit]]:
        """Take slot `slot_time` (the next one) out of the wheel and walk it in chunks.

        The slot counts as loaded at once: later units for it go to the next slot. Its chain
        as of now is walked lazily, so a large slot does not hold the event loop.
        """
        self.schedule.take_slot(slot_time)
        self.load_time_ms = slot_time + self.timers.wheel.precision_ms
        return self._walk(slot_time, chunk)

    def load_slot(self, slot_time: int) -> list[Unit]:
        """open_slot, walked whole."""
        return [u for c in self.open_slot(slot_time) for u in c]

    def _walk(self, slot_time: int, chunk: int) -> Iterator[list[Unit]]:
        out: list[Unit] = []
        passed: set[int] = set()
        try:
            for u in self.timers.walk(slot_time):
                out.append(u)
                if len(out) >= chunk:
                    passed.update(x.pos for x in out)
                    yield out
                    out = []
        except CorruptData as e:
            # A chain that does not hold together: the TimerLog is the truth, rebuild from it
            # and walk the slot again, skipping units already passed on.
            log.error("TimerWheel slot %d damaged (%s); rebuilding the wheel from the TimerLog", slot_time, e)
            # From the durable read time, not `slot_time`: slots loaded since the checkpoint may
            # still be in flight and are walked again if we crash before the next checkpoint.
            self.timers.rebuild_from_log(self.read_time_ms)
            out = [u for u in self.timers.walk(slot_time) if u.pos not in passed]
        if out:
            yield out

    # ---------------------------------------------------------------------------------- dequeue-get-message
    def resolve(self, units: list[Unit], slot_time: int) -> Resolved:
        """What to do with a chunk of one slot: the message-table entries with one read per run
        of ids and the records with one read per stretch of the log (a burst of one second is a
        few long runs, not a million small reads). A record that does not decode is reported in
        `unreadable`, so one damaged message does not stop the others."""
        msgs = self.msgs
        msgs.begin_batch(u.seq for u in units)
        try:
            states = [msgs.get(u.seq) for u in units]
        finally:
            msgs.end_batch()
        out = Resolved()
        live = []
        for u, st in zip(units, states, strict=True):
            if st[0] == _SCHEDULED and st[1] == u.commit_offset:
                live.append(u)
            else:
                out.dropped += 1
        recs = self.read_many([(u.commit_offset, u.commit_size) for u in live])
        for u, rec in zip(live, recs, strict=True):
            if isinstance(rec, StorageError):
                out.unreadable.append((u, rec if isinstance(rec, CorruptData) else CorruptData(str(rec))))
            elif u.magic & _ROLL_BIT:
                out.roll.append(rec)
            else:
                out.due.append(Due(rec.deliver_at, rec.seq, rec.topic, rec.offset, rec.size, tag_hash(rec.tag),
                                   slot_time, rec.key))
        return out

    def read_many(self, locations: list[tuple[int, int]]) -> list[Record | StorageError]:
        """The records at (offset, size) locations, in the order asked, with one read per
        stretch of the log rather than one per record. A record that does not decode comes
        back as its error (CorruptData, or OffsetOutOfRange for a deleted segment), so one
        unreadable message does not fail the others. A newer format version, and running out
        of descriptors, raise: neither says anything about the record."""
        out: list[Record | StorageError | None] = [None] * len(locations)
        order = sorted(range(len(locations)), key=lambda i: locations[i][0])
        files = self.commit.files
        j = 0
        while j < len(order):
            start = locations[order[j]][0]
            k = j + 1
            while k < len(order):
                off, size = locations[order[k]]
                prev_off, prev_size = locations[order[k - 1]]
                if off + size - start > READ_SPAN or off - (prev_off + prev_size) > READ_GAP:
                    break
                k += 1
            last_off, last_size = locations[order[k - 1]]
            end = max(last_off + last_size, start)
            try:
                one_segment = end <= files.segment_end(files.segment_of(start))
                buf = files.read(start, end - start) if one_segment else None
            except StorageError:
                buf = None
            for i in order[j:k]:
                off, size = locations[i]
                try:
                    out[i] = decode(buf, off - start, off) if buf is not None and len(buf) >= end - start \
                        else self.commit.read(off, size)
                except (UnsupportedVersion, OutOfDescriptors):
                    raise  # newer data, or no descriptor right now: never "unreadable"
                except StorageError as e:
                    out[i] = e
            j = k
        return out  # type: ignore[return-value]

    def roll_forward(self, rec: Record) -> None:
        """Re-append a far message so the old segment is not pinned; enqueue indexes the copy.
        `rec` is changed (type ROLL, roll_count + 1): pass a copy."""
        rec.type = RecordType.ROLL
        rec.roll_count += 1
        self.commit.append([encode(rec)])
        self.counters.total(Total.ROLLED)

    def drop_unreadable(self, unit: Unit) -> None:
        """A unit whose record no longer decodes (disk damage): that one message is lost. It
        leaves the schedule as cancelled, so counts stay true and a GET tells it is gone."""
        st = self.msgs.get(unit.seq)[0]
        if st == _SCHEDULED:
            self.msgs.set_state(unit.seq, MessageState.CANCELLED)
            topic = self.counters.topic_names.get(unit.topic_hash)
            if topic is not None:
                self.counters.add(topic, "scheduled", -1)
            self.counters.total(Total.UNREADABLE)

    # ---------------------------------------------------------------------------------- dequeue-put
    def release(self, dues: list[Due], now_ms: int) -> list[Due]:
        """Make due messages visible. Checks the state once more, so a cancel that arrived
        while the message was in the pipeline still wins. Returns what was released; on
        DiskFull, what was released before the failing topic stays released (marked
        delivered) and the rest is untouched: a retry of the whole batch releases each once."""
        self.msgs.begin_batch(d.seq for d in dues)
        try:
            return self._release(dues, now_ms)
        finally:
            self.msgs.end_batch()

    def _release(self, dues: list[Due], now_ms: int) -> list[Due]:
        by_topic: dict[str, list[Due]] = {}
        seen: set[int] = set()
        get = self.msgs.get
        for d in dues:
            # One message can come twice in a batch: straight from enqueue-put (its slot had
            # passed) and from the slot it was also written to. The state check covers earlier
            # batches; `seen` covers this one.
            if d.seq in seen:
                continue
            st, off, _s, _r = get(d.seq)
            if st == _SCHEDULED and off == d.commit_offset:
                seen.add(d.seq)
                by_topic.setdefault(d.topic, []).append(d)
        out = []
        for topic, ds in by_topic.items():
            self.ready.append(topic, [(d.commit_offset, d.commit_size, d.tag_hash, d.deliver_at, now_ms, d.seq)
                                      for d in ds])
            keyed = []
            for d in ds:
                self.msgs.set_state(d.seq, _DELIVERED)
                if d.key is not None:
                    keyed.append((now_ms, topic, d.key, d.seq))
            if keyed:
                self.keys.delivered(keyed)
            self.counters.delivered(topic, len(ds))
            out.extend(ds)
        return out
