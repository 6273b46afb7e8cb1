"""Dispatch: the read side of the timer — dequeue-get, dequeue-get-message, dequeue-put.

It owns the dequeue cursor: `load_time_ms` (D, the next slot dequeue-get loads) and
`read_time_ms` (R as of the last checkpoint: every slot before it was dispatched, durably).
Each per-batch loop is one method taking a batch and returning a typed result; the per-message
work inside runs in the compiled batch core (storage.batch: `ops`), batches travel as rows:

    open_slot(slot_time, chunk)  -> chunks of UnitRows     (dequeue-get: the Walker)
    resolve(units, slot_time)    -> Resolved               (dequeue-get-message: classify, dues, roll_copies)
    release(dues, now_ms)        -> Released               (dequeue-put: release_rows, set_states)

Every state check goes to the message table, which is what makes a cancel that races the
pipeline win and a unit that is stale (its message rolled, was delivered or cancelled) drop out.
"""

from __future__ import annotations

import logging
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from delayd.storage import batch
from delayd.storage.batch import DROW, KIND_DROP, KIND_ROLL, UROW, due_row
from delayd.storage.commitlog import (
    CommitLog,
    Record,
    RecordType,
    decode,
    encode,
    release_body,
    release_parts,
)
from delayd.storage.counters import Counters, Total
from delayd.storage.errors import CorruptData, Insane, OutOfDescriptors, StorageError, UnsupportedVersion
from delayd.storage.keyindex import KeyIndex
from delayd.storage.msgtable import BATCH_GAP, MessageState, MessageTable
from delayd.storage.readyqueue import UNIT as READY
from delayd.storage.readyqueue import ReadyUnit, tag_hash
from delayd.storage.readyqueues import ReadyQueues
from delayd.storage.schedule import Schedule
from delayd.storage.timerindex import Entry, TimerIndex
from delayd.storage.timerlog import NO_POS, UNIT, UNIT_SIZE, Unit, UnitMagic

log = logging.getLogger("delayd.storage")

READ_SPAN = 1 << 20  # read_many reads at most this much of the log at once
READ_GAP = 64 * 1024  # and bridges gaps up to this between records it needs
_WHOLE = 1 << 62  # a mapped segment is one stretch, whatever the gaps
_STRETCH = struct.Struct("<qq")  # a stretch of the log to read: start, end
_LOC = struct.Struct("<qI")  # a record's place: offset, size
_SCHEDULED, _DELIVERED = MessageState.SCHEDULED, MessageState.DELIVERED
_ROLL_BIT = int(UnitMagic.ROLL)


@dataclass(slots=True, frozen=True)
class Due:
    """A message leaving the timer, released into its topic's ready queue at `deliver_at`: one
    DueRow (storage.batch) decoded, for slow paths and tests (the pipeline moves rows)."""
    deliver_at: int
    seq: int
    commit_offset: int
    commit_size: int
    topic_hash: int
    tag_hash: int
    keyed: bool
    slot_time: int

    @classmethod
    def rows(cls, rows: bytes) -> list[Due]:
        return [cls(d, seq, off, size, th, tgh, bool(bits & batch.ROW_KEYED), st)
                for d, seq, off, size, th, tgh, bits, st in batch.DUE.iter_unpack(rows)]

    def row(self) -> bytes:
        return due_row(self.deliver_at, self.seq, self.commit_offset, self.commit_size, self.topic_hash,
                       self.tag_hash, self.keyed, self.slot_time)


@dataclass(slots=True)
class Resolved:
    """What dequeue-get-message made of a chunk of one slot's units (`Dispatch.resolve`)."""
    due: bytes = b""  # DueRows: to release at their own millisecond
    roll: bytes = b""  # the roll copies of far messages, packed back to back: to append (roll_forward)
    roll_sizes: bytes = b""  # each copy's length, u32
    unreadable: list[tuple[Unit, CorruptData]] = field(default_factory=list)  # record damaged: message lost
    dropped: int = 0  # cancelled, delivered, or a stale unit of a message that rolled since

    def copies(self) -> list[Record]:
        """The roll copies, decoded."""
        out, pos = [], 0
        for size in array("I", self.roll_sizes):
            out.append(decode(self.roll, pos))
            pos += size
        return out


@dataclass(slots=True)
class Released:
    """What dequeue-put released (`Dispatch.release`): per topic, the ready-queue units appended
    (storage.readyqueue.UNIT, packed) and the index of the first."""
    batches: list[tuple[str, int, bytes]] = field(default_factory=list)  # (topic, first index, units)
    count: int = 0

    def units(self) -> list[ReadyUnit]:
        return [ReadyUnit(first + k, *u) for _t, first, units in self.batches
                for k, u in enumerate(READY.iter_unpack(units))]


class Dispatch:
    def __init__(self, *, commit: CommitLog, msgs: MessageTable, timers: TimerIndex, schedule: Schedule,
                 counters: Counters, ready: ReadyQueues, keys: KeyIndex, load_time_ms: int,
                 read_time_ms: int) -> None:
        self.commit, self.msgs, self.timers, self.schedule = commit, msgs, timers, schedule
        self.counters, self.ready, self.keys = counters, ready, keys
        self.load_time_ms = load_time_ms  # D
        self.read_time_ms = read_time_ms  # R, durable (set when a checkpoint is saved)
        # Offsets of the RELEASE records this process appended with their units: the enqueue
        # side has nothing to apply there and skips them unread (after a restart it reads them).
        self.own_releases: set[int] = set()

    # ---------------------------------------------------------------------------------- dequeue-get
    def open_slot(self, slot_time: int, chunk: int = 1024) -> Iterator[bytes]:
        """Take slot `slot_time` (the next one) out of the wheel and walk it in chunks of UnitRows.

        The slot counts as loaded at once: later units for it go to the next slot. Its chain
        as of now is walked lazily, so a large slot does not hold the event loop.
        """
        self.schedule.take_slot(slot_time)
        self.load_time_ms = slot_time + self.timers.wheel.precision_ms
        return self._walk(slot_time, chunk)

    def rewind(self, read_time_ms: int) -> None:
        """The dequeue side stopped holding units it took out of the wheel and did not release
        (loaded ahead, or held until due: a pipeline replaced in place when a replicated member
        changes role). Their slots are walked again from `read_time_ms`, the oldest slot still in
        flight; the message table drops what was released meanwhile, as after a crash."""
        self.load_time_ms = min(self.load_time_ms, read_time_ms)

    def load_slot(self, slot_time: int) -> list[Unit]:
        """open_slot, walked whole, as Units."""
        return [unit_of(rows, k) for rows in self.open_slot(slot_time) for k in range(len(rows) // UROW)]

    def _walk(self, slot_time: int, chunk: int) -> Iterator[bytes]:
        passed: list[bytes] = []
        try:
            for rows in self._chain_rows(slot_time, chunk):
                passed.append(rows)
                yield rows
        except CorruptData as e:
            # A chain that does not hold together: the TimerLog is the truth, rebuild from it
            # and walk the slot again, skipping units already passed on.
            log.error("TimerWheel slot %d damaged (%s); rebuilding the wheel from the TimerLog", slot_time, e)
            # From the durable read time, not `slot_time`: slots loaded since the checkpoint may
            # still be in flight and are walked again if we crash before the next checkpoint.
            self.timers.rebuild_from_log(self.read_time_ms)
            done = {struct.unpack_from("<q", rows, k * UROW)[0] for rows in passed for k in range(len(rows) // UROW)}
            rest = b"".join(rows[k * UROW:(k + 1) * UROW] for rows in self._chain_rows(slot_time, chunk)
                            for k in range(len(rows) // UROW) if struct.unpack_from("<q", rows, k * UROW)[0] not in done)
            if rest:
                yield rest

    def _chain_rows(self, slot_time: int, chunk: int) -> Iterator[bytes]:
        """The live units of one slot as UnitRows, newest first, DELETE markers applied (a marker
        is always newer than its target), in chunks of about `chunk`: the compiled Walker over
        windows of the TimerLog. Damage raises CorruptData."""
        slot = self.timers.wheel.get(slot_time)
        if slot.empty:
            return
        tlog = self.timers.log
        walker = batch.ops.Walker(slot_time, self.timers.wheel.precision_ms, slot.last_pos)
        lo, buf = 0, b""
        pending: list[bytes] = []
        have = 0
        while walker.pos != NO_POS:
            pos = walker.pos
            if not (lo <= pos and pos + UNIT_SIZE <= lo + len(buf)):
                lo, buf = tlog.window(pos)
            rows, outcome = walker.feed(buf, lo, chunk - have)
            if rows:
                pending.append(rows)
                have += len(rows) // UROW
                if have >= chunk:
                    yield b"".join(pending)
                    pending, have = [], 0
            if outcome == 2:
                raise Insane(f"damaged TimerLog unit at {walker.pos} in the chain of slot {slot_time}")
        if pending:
            yield b"".join(pending)

    def carry(self, until_ms: int, max_slots: int = 4096) -> int:
        """A replication follower's dequeue side: move the cursor towards `until_ms` (at most
        `max_slots` slots per call) without releasing anything. The primary releases; its
        RELEASE, ROLL and CANCEL records reach this member through the log and mark the
        messages of the slots passed delivered, rolled or cancelled here. A unit whose message
        is still pending here (its primary's record not indexed yet, or never written because
        the primary died first) moves to the slot at the new cursor, so a promoted follower
        still holds it. Returns how many units moved.

        Without this a follower's cursor stood where it started: the indexer blocks a unit more
        than the wheel's span ahead of the cursor, so after a few roll windows it stopped
        indexing, and a promoted follower first walked every slot since it started following.
        Nothing changes until the moved units are written: a failed write (disk full) leaves
        the cursor where it was, to be retried (a unit written twice is released once)."""
        precision = self.timers.wheel.precision_ms
        start = self.load_time_ms
        end = min(until_ms - until_ms % precision, start + max_slots * precision)
        if end <= start:
            return 0
        msgs = self.msgs
        moved: list[Entry] = []
        for t in range(start, end, precision):
            for rows in self._walk(t, 4096):
                kinds, _locs = self._classify(rows)
                for i, kind in enumerate(kinds):
                    if kind != KIND_DROP:
                        u = unit_of(rows, i)
                        moved.append(Entry(end, int(u.magic), u.commit_offset, u.commit_size, u.topic_hash, u.seq))
        if moved:
            self.timers.add(moved, end)
        for e in moved:
            if not e.magic & _ROLL_BIT:
                msgs.set_flags(e.seq, 0)  # due, out of the counted schedule: as a late message is
        for t in range(start, end, precision):
            self.schedule.take_slot(t)
        self.load_time_ms = end
        return len(moved)

    # ---------------------------------------------------------------------------------- dequeue-get-message
    def _classify(self, units: bytes) -> tuple[bytes, bytes]:
        """The compiled core's classify of UnitRows, the message-table entries read a run at a time."""
        msgs = self.msgs
        msgs.begin_runs(batch.ops.seq_runs(units, msgs.segment_entries, BATCH_GAP, UROW, 8 + 44))
        try:
            return batch.ops.classify(units, msgs.spans)
        finally:
            msgs.end_batch()

    def resolve(self, units: bytes, slot_time: int) -> Resolved:
        """What to do with a chunk of one slot's UnitRows: the message-table entries with one
        read per run of ids, the records with one read per stretch of the log (a burst of one
        second is a few long runs, not a million small reads), and per message the compiled
        core's classify, dues and roll_copies. A record that does not decode is reported in `unreadable`, so
        one damaged message does not stop the others."""
        ops = batch.ops
        kinds, locs = self._classify(units)
        out = Resolved(dropped=kinds.count(KIND_DROP))
        if len(kinds) == out.dropped:
            return out
        reads = self.read_runs(locs)
        due, problems = ops.dues(units, kinds, reads, slot_time)
        extra: list[bytes] = []
        for i, _outcome in problems:
            unit = unit_of(units, i)
            rec = self._read_unit(unit, out)
            if rec is None:
                continue
            extra.append(due_row(rec.deliver_at, rec.seq, rec.offset, rec.size, unit.topic_hash, tag_hash(rec.tag),
                                 rec.key is not None, slot_time))
        if KIND_ROLL in kinds:
            out.roll, out.roll_sizes, problems = ops.roll_copies(units, kinds, reads)
            if problems:
                self._roll_problems(units, problems, out)
        out.due = due + b"".join(extra) if extra else due
        return out

    def _read_unit(self, unit: Unit, out: Resolved) -> Record | None:
        """The record of a unit the batch core named (not read, or not whole): the commit log's
        own read decides; one that does not decode goes to `out.unreadable` (None)."""
        try:
            return self.commit.read(unit.commit_offset, unit.commit_size)
        except (UnsupportedVersion, OutOfDescriptors):
            raise  # newer data, or no descriptor right now: never "unreadable"
        except StorageError as e:
            out.unreadable.append((unit, e if isinstance(e, CorruptData) else CorruptData(str(e))))
            return None

    def _roll_problems(self, units: bytes, problems: list[tuple[int, int]], out: Resolved) -> None:
        """The roll copies of the records `roll_copies` named, encoded here from the commit log's
        read and added to `out`."""
        copies, sizes = [out.roll], array("I", out.roll_sizes)
        for i, _outcome in problems:
            unit = unit_of(units, i)
            rec = self._read_unit(unit, out)
            if rec is None:
                continue
            rec.type, rec.roll_count = RecordType.ROLL, min(rec.roll_count + 1, batch.MAX_ROLL_COUNT)
            copies.append(encode(rec))
            sizes.append(len(copies[-1]))
        out.roll, out.roll_sizes = b"".join(copies), sizes.tobytes()

    def read_runs(self, locs: bytes, stride: int = 12) -> list[tuple[int, bytes]]:
        """The stretches of the log that hold the records at `locs` ((offset i64, size u32) at the
        start of each row of `stride` bytes: packed locations, or PullRows),
        one read per stretch of at most READ_SPAN with gaps of at most READ_GAP within one
        segment (the batch core's `read_plan`), sorted by offset: what the core's `dues` and
        `encode_pull` take. A stretch in a deleted segment is not read (the core then names its
        records, and they are read one by one)."""
        files = self.commit.files
        bases = array("q", files.bases).tobytes()
        if batch.ops is not batch:  # the compiled core takes views; the reference, bytes
            views = self._view_runs(locs, stride, bases)
            if views is not None:
                return views
        plan = batch.ops.read_plan(locs, stride, bases, READ_SPAN, READ_GAP)
        out: list[tuple[int, bytes]] = []
        for start, end in _STRETCH.iter_unpack(plan):
            try:
                out.append((start, files.read(start, end - start)))
            except OutOfDescriptors:
                raise
            except StorageError:
                pass  # a deleted segment: its records are named one by one
        return out

    def _view_runs(self, locs: bytes, stride: int, bases: bytes) -> list[tuple[int, bytes]] | None:
        """read_runs without a read: one view per segment of its mapping (SegmentedFile.view),
        covering the records at `locs`, so a pull of records scattered over the log (a burst
        due in one second, released in deliver_at order, not log order) costs no syscall and
        no copy. None when a segment cannot be mapped now: then read_runs reads."""
        files = self.commit.files
        out: list[tuple[int, bytes]] = []
        for start, end in _STRETCH.iter_unpack(batch.ops.read_plan(locs, stride, bases, _WHOLE, _WHOLE)):
            try:
                view = files.view(start, end)
            except OutOfDescriptors:
                raise
            except StorageError:
                continue  # a deleted segment: its records are named one by one
            if view is None:
                return None
            out.append((start, view))  # type: ignore[arg-type]  # a buffer, as the core takes
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

    def roll_forward(self, copies: bytes, sizes: bytes) -> None:
        """Append the roll copies `resolve` made (RIP-43's roll: the far message again, so its old
        segment is not pinned; enqueue indexes the copies). One write in the usual case; a
        retry after a failed write (disk full) may append some copies twice, and the message
        table then points at the later one, whose unit is the only live one."""
        self.commit.append_packed(copies, sizes)
        self.counters.total(Total.ROLLED, len(sizes) // 4)

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
    def release(self, dues: bytes, now_ms: int) -> Released:
        """Make due messages (DueRows) visible. Checks the state once more, so a cancel that
        arrived while the message was in the pipeline still wins; a message that comes twice in a
        batch (straight from enqueue-put, and from the slot it was also written to) is released
        once. On DiskFull, what was released before the failing topic stays released (marked
        delivered) and the rest is untouched: a retry of the whole batch releases each once."""
        ops, msgs = batch.ops, self.msgs
        out = Released()
        # Mapped, a segment is one run however scattered the seqs (a burst released in
        # deliver_at order): one span over its mapping, no read per run.
        per = msgs.segment_entries
        msgs.begin_runs(ops.seq_runs(dues, per, per, DROW, 8), mapped=True)
        try:
            for th, (units, seqs, keyed) in ops.release_rows(dues, msgs.spans, now_ms).items():
                topic = self._topic(th, units)
                # The RELEASE record first: the ready queue is derived from it (a replica, and
                # recovery, append what a RELEASE record says and the queue lacks). DiskFull here:
                # nothing of this topic changed.
                (at,) = self.commit.append([encode(Record(RecordType.RELEASE, 0, topic,
                                                          release_body(self.ready.end(topic), units),
                                                          produced_at=now_ms))])
                first = self.ready.append_units(topic, units)
                self.own_releases.add(at)
                ops.set_states(seqs, msgs.spans, int(_DELIVERED))
                n = len(seqs) // 8
                if keyed:
                    self.keys_delivered(now_ms, topic, keyed, 12)
                self.counters.delivered(topic, n)
                out.batches.append((topic, first, units))
                out.count += n
        finally:
            msgs.end_batch()
        return out

    def apply_release(self, rec: Record, *, count: bool = True) -> tuple[int, bytes]:
        """Make the ready queue of `rec.topic` hold what the RELEASE record `rec` says: append
        the units it lacks (none on the member that released them) and mark their messages
        delivered. Idempotent. Returns (first index, units) of what was appended (b"": nothing).
        `count`: count the deliveries (recovery counts them as it replays the queues)."""
        first, units = release_parts(rec.body)
        end = self.ready.end(rec.topic)
        n = len(units) // READY.size
        if end >= first + n:
            return end, b""
        if end < first:
            raise Insane(f"RELEASE record at {rec.offset} puts units at index {first} of {rec.topic!r}, "
                         f"whose ready queue ends at {end}")
        units = units[(end - first) * READY.size:]
        first = self.ready.append_units(rec.topic, units)
        seqs = array("Q", [u[5] for u in READY.iter_unpack(units)])
        msgs = self.msgs
        for seq in seqs:
            st, off, size, roll = msgs.get(seq)
            if st != _DELIVERED:
                if off < 0:  # not in the table (being rebuilt): the unit says where its record is
                    off, size = next((u[0], u[1]) for u in READY.iter_unpack(units) if u[5] == seq)
                msgs.set(seq, _DELIVERED, off, size, roll)
        if count:
            self.keys_delivered(rec.produced_at, rec.topic, units, READY.size)
            self.counters.delivered(rec.topic, len(seqs))
        return first, units

    def keys_delivered(self, done_at: int, topic: str, locs: bytes, stride: int) -> None:
        """The key index marks delivered at `done_at` the messages of `topic` whose records are
        located at `locs` ((offset i64, size u32) at the start of each row of `stride` bytes):
        their keys taken by the batch core (`record_keys`: one read per stretch of the log, no
        Record a message; a burst of keyed messages cost dequeue-put 3.9 µs a message decoded,
        BENCHMARKS.md); a record it could not take is read through the commit log, and one that
        does not decode is left out (its key stays taken until it is reused or expires)."""
        keys, seqs, problems = batch.ops.record_keys(locs, self.read_runs(locs, stride), stride)
        self.keys.delivered_keys(done_at, topic, keys, seqs)
        if problems:
            again = self.read_many([_LOC.unpack_from(locs, i * stride) for i, _outcome in problems])
            self.keys.delivered([(done_at, topic, r.key, r.seq) for r in again if isinstance(r, Record) and r.key is not None])

    def _topic(self, topic_hash: int, units: bytes) -> str:
        """The name of a topic hash, else read from the first unit's record (`topic_name`)."""
        return self.topic_name(topic_hash, *struct.unpack_from("<qI", units, 0))

    def topic_name(self, topic_hash: int, offset: int, size: int) -> str:
        """The name of a topic hash (known for every topic counted since the start), else read
        from the record at `offset` (`size` bytes), one of that topic's."""
        name = self.counters.topic_names.get(topic_hash)
        if name is None:
            name = self.commit.read(offset, size).topic
            self.counters.topic_hash(name)
        return name


def unit_of(rows: bytes, k: int) -> Unit:
    """The Unit of UnitRow `k` (the pipeline's slow paths and tests)."""
    (pos,) = struct.unpack_from("<q", rows, k * UROW)
    _size, prev, magic, enq, delay, off, csize, th, seq = UNIT.unpack_from(rows, k * UROW + 8)
    return Unit(pos, prev, UnitMagic(magic), enq, delay, off, csize, th, seq)
