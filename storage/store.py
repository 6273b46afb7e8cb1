"""The store: one data directory's structures behind one facade.

`Store` owns the components and passes each the parts it works on; nothing reaches into
another's private state, and no module of storage imports this one but recovery, which builds
the components and then the Store (`storage.recovery.open_store`). The broker's stages call the
components' per-batch methods directly:

    commit     CommitLog      produce appends; enqueue-get reads records back
    indexer    Indexer        enqueue-put: index(records, now) -> IndexResult
    dispatch   Dispatch       dequeue-get, -get-message, -put: open_slot / resolve / release
    schedule   Schedule       per-slot and hourly pending counts (GET /v1/schedule)
    counters   Counters       totals and per-topic counts (GET /v1/stats)
    ready      ReadyQueues    every topic's ready queue, a bounded number open
    msgs       MessageTable   per-message state and current record
    keys       KeyIndex       (topic, key) -> message
    far        FarIndex       messages due beyond the roll window, in due order (listing)
    timers     TimerIndex     TimerLog + TimerWheel
    retention  Retention      which segments may go

Crash consistency in one paragraph: the checkpoint records (C) the commit-log offset below
which everything is indexed, (T) the TimerLog end at that moment, (R) the wheel time below
which everything is dispatched, and each ready queue's end. Recovery cuts a torn commit-log
tail, unlinks TimerLog units at or after T from the wheel and truncates the TimerLog to T,
marks as delivered what the ready queues hold past the checkpoint, and then re-indexes the
commit log from C — the same code path as normal operation. The message table makes every
step idempotent: a unit whose record is no longer the message's current one (it rolled), or
whose message is delivered or cancelled, is dropped at dispatch.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from delayd.storage import batch
from delayd.storage import checkpoint as ckpt
from delayd.storage.browse import Browser, Page, Query
from delayd.storage.commitlog import CommitLog, Record, RecordFlag, RecordType, encode, encode_messages
from delayd.storage.counters import Counters
from delayd.storage.datadir import DataDir
from delayd.storage.dispatch import Dispatch, Due
from delayd.storage.farindex import FarIndex
from delayd.storage.indexer import Indexer
from delayd.storage.keyindex import KeyIndex
from delayd.storage.msgtable import MessageState, MessageTable
from delayd.storage.readyqueues import DEFAULT_MAX_OPEN, QueueView, ReadyQueues, fsync_paths
from delayd.storage.retention import Retention
from delayd.storage.schedule import Placed, Schedule
from delayd.storage.segments import fsync_all
from delayd.storage.timerindex import TimerIndex

__all__ = ["Due", "NewMessage", "PendingCheckpoint", "Store", "StoreConfig"]

HANDOFF_BYTES = 32 * 1024 * 1024  # MessageRows produce hands enqueue-get at most (beyond: it reads the log)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    precision_ms: int = 1000
    roll_window_ms: int = 2 * 86_400_000
    lookahead_ms: int = 300  # how far ahead of the clock dequeue-get loads slots
    commit_segment_bytes: int = 64 * 1024 * 1024
    timerlog_segment_units: int = 1 << 20
    ready_segment_units: int = 1 << 18
    msgtable_segment_entries: int = 1 << 20
    ready_open_files: int = DEFAULT_MAX_OPEN  # ready queues open at once (an LRU closes the rest)

    @property
    def slot_count(self) -> int:
        # Twice the window plus margin: a lap is read long before the next one is written.
        return 2 * self.roll_window_ms // self.precision_ms + 64


@dataclass(slots=True)
class NewMessage:
    topic: str
    body: bytes
    deliver_at: int
    tag: str | None = None
    key: str | None = None
    headers: dict[str, str] | None = None


@dataclass(slots=True)
class PendingCheckpoint:
    """A checkpoint snapshotted on the event loop, to be made durable in a worker thread."""
    checkpoint: ckpt.Checkpoint
    fds: list[int]  # duplicated descriptors to fsync (and close)
    paths: list[Path]  # files of closed ready queues to fsync by path
    pack_schedule: Callable[[], bytes]  # the checkpoint's `schedule`, packed (Schedule.snapshot)
    key_ops: list[Any] | None = field(default_factory=list)  # key-index writes riding this checkpoint (None: left queued)
    key_pos: int = 0  # the commit-log offset those writes cover
    far_ops: list[Any] = field(default_factory=list)  # far-index writes riding this checkpoint
    far_pos: int = 0  # the commit-log offset those cover (the indexed one)


class Store:
    def __init__(self, data: DataDir, cfg: StoreConfig, clock_ms: Callable[[], int], *, commit: CommitLog,
                 msgs: MessageTable, keys: KeyIndex, far: FarIndex, timers: TimerIndex, ready: ReadyQueues,
                 counters: Counters,
                 schedule: Schedule, dispatch: Dispatch, indexer: Indexer, retention: Retention,
                 next_seq: int, durable_indexed: int, groups_snapshot: dict[str, Any]) -> None:
        self.data = data
        self.dir = data.path
        self.cfg = cfg
        self.clock_ms = clock_ms
        self.commit, self.msgs, self.keys, self.timers, self.ready = commit, msgs, keys, timers, ready
        self.far = far
        self.counters, self.schedule, self.dispatch, self.indexer = counters, schedule, dispatch, indexer
        self.retention = retention
        self.next_seq = next_seq
        self.durable_indexed = durable_indexed  # C as of the last checkpoint written
        self.groups_snapshot = groups_snapshot  # consumer groups as of the checkpoint recovery started from
        self._browser: Browser | None = None
        # Produce hands enqueue-get the MessageRows of what it appended, (start, end, rows) in log
        # order, so the records are not read and decoded again; whatever is not here (cancels,
        # group events, roll copies, an overflow) enqueue-get reads from the log.
        self._handoff: deque[tuple[int, int, bytes]] = deque()
        self._handoff_bytes = 0

    # ---------------------------------------------------------------------------------- views
    @property
    def node_id(self) -> str:
        return self.data.node_id

    @property
    def indexed(self) -> int:
        return self.indexer.indexed

    @property
    def load_time_ms(self) -> int:
        return self.dispatch.load_time_ms

    @property
    def read_time_ms(self) -> int:
        return self.dispatch.read_time_ms

    @property
    def totals(self) -> dict[str, int]:
        return self.counters.totals

    @property
    def topic_counts(self) -> dict[str, dict[str, int]]:
        return self.counters.topics

    @property
    def scheduled(self) -> int:
        return self.counters.scheduled

    def queue(self, topic: str) -> QueueView:
        """A topic's ready queue as consumer groups read it (creates nothing)."""
        return self.ready.view(topic)

    def earliest(self, topic: str) -> int:
        """Where a consumer group starting at the earliest begins: the first ready unit whose
        record retention kept (see ReadyQueues.earliest)."""
        return self.ready.earliest(topic, self.commit.start)

    # ---------------------------------------------------------------------------------- produce
    def append_messages(self, msgs: list[NewMessage], now_ms: int,
                        cancels: list[tuple[int, str, str | None]] = ()) -> list[int]:  # type: ignore[assignment]
        """Append messages (not yet durable: call flush) and return their sequence numbers.

        `cancels` (seq, topic, key) are cancelled in the same atomic write: a replace by key
        either happens whole or not at all, also across a crash.
        """
        first = self.next_seq
        n = len(msgs)
        self.msgs.prepare(first, first + n - 1)  # no descriptor for it: refused before anything is stored
        recs = [encode(Record(RecordType.CANCEL, seq, topic, key=key, produced_at=now_ms), RecordFlag.CONTINUED)
                for seq, topic, key in cancels]
        recs += encode_messages(msgs, first, now_ms)
        offsets = self.commit.append(recs)[len(cancels):]
        self.next_seq = first + n
        for seq, topic, key in cancels:
            self._cancelled(seq, topic, key)
        self.msgs.set_run(first, [(MessageState.SCHEDULED, off, len(r), 0)
                                  for off, r in zip(offsets, recs[len(cancels):], strict=True)])
        keyed = [(m.topic, m.key, first + i, m.deliver_at) for i, m in enumerate(msgs) if m.key is not None]
        if keyed:
            self.keys.put_many(keyed)
        for topic, k in collections.Counter(m.topic for m in msgs).items():
            self.counters.produced(topic, k)
        return list(range(first, first + n))

    def append_packed(self, topic: str, records: bytes, sizes: bytes, now_ms: int,
                      keys: Sequence[str | None] | None = None, dues: Sequence[int] = (),
                      cancels: list[tuple[int, str, str | None]] = (),  # type: ignore[assignment]
                      claimed: int | None = None) -> int:
        """append_messages for records the compiled batch core encoded (storage.batch
        `encode_produce`, with seqs from `next_seq`): appended in one write, their message-table
        entries and MessageRows made from the same bytes. `keys` and `dues`: each record's key
        (None: none) and deliver_at, in order, or None when no record has a key; the key index
        keeps both (KeyIndex.put_run, `claimed` passed on), so neither may change afterwards.
        Returns the first seq."""
        first = self.next_seq
        n = len(sizes) // 4
        self.msgs.prepare(first, first + n - 1)  # no descriptor for it: refused before anything is stored
        head = [encode(Record(RecordType.CANCEL, seq, t, key=key, produced_at=now_ms), RecordFlag.CONTINUED)
                for seq, t, key in cancels]
        if head:
            data = b"".join(head) + records
            offsets = self.commit.append_packed(data, b"".join(len(h).to_bytes(4, "little") for h in head) + sizes)
            offsets = offsets[len(head):]
        else:
            offsets = self.commit.append_packed(records, sizes)
        self.next_seq = first + n
        for seq, t, key in cancels:
            self._cancelled(seq, t, key)
        entries, rows = batch.ops.produced_rows(records, offsets, self.counters.topic_hash(topic))
        self.msgs.write_entries(first, entries)
        if keys is not None:
            self.keys.put_run(topic, keys, first, dues, claimed)
        self.counters.produced(topic, n)
        if not head and n:
            last_size = int.from_bytes(sizes[-4:], "little")
            self._hand_off(offsets[0], offsets[-1] + last_size, rows)
        return first

    def _hand_off(self, start: int, end: int, rows: bytes) -> None:
        if self._handoff_bytes + len(rows) <= HANDOFF_BYTES:
            self._handoff.append((start, end, rows))
            self._handoff_bytes += len(rows)

    def handed_rows(self, pos: int) -> tuple[bytes, int]:
        """enqueue-get: the MessageRows produce handed over for the records at `pos`, and the
        offset after them; (b"", pos) when what lies at `pos` must be read from the log."""
        q = self._handoff
        while q and q[0][1] <= pos:  # read from the log already (an overflow, a restart)
            self._handoff_bytes -= len(q.popleft()[2])
        if q and q[0][0] == pos:
            start, end, rows = q.popleft()
            self._handoff_bytes -= len(rows)
            return rows, end
        return b"", pos

    def next_handed(self) -> int | None:
        """Where the first handed-over run starts: enqueue-get reads the log up to there."""
        return self._handoff[0][0] if self._handoff else None

    def append_cancel(self, seq: int, topic: str, key: str | None = None) -> None:
        """Log the cancel, then mark the message cancelled (dispatch checks the mark). If the
        append fails (disk full) nothing changed."""
        self.commit.append([encode(Record(RecordType.CANCEL, seq, topic, key=key, produced_at=self.clock_ms()))])
        self._cancelled(seq, topic, key)

    def _cancelled(self, seq: int, topic: str, key: str | None) -> None:
        self.msgs.set_state(seq, MessageState.CANCELLED)
        if key is not None:
            self.keys.release(topic, key, seq)
        self.counters.cancelled(topic)

    def append_group_event(self, topic: str, group: str, body: bytes) -> None:
        self.commit.append([encode(Record(RecordType.GROUP, 0, topic, body, key=group,
                                          produced_at=self.clock_ms()))])

    # ---------------------------------------------------------------------------------- replica
    def apply_replicated(self, offset: int, data: bytes) -> list[Record]:
        """A follower's append: the primary's records (whole, CRC-checked: CommitLog.append_raw)
        at their offsets, with what produce and cancel do besides the append (message table,
        key index, counters, next_seq), so the enqueue side indexes them as the primary's own
        and a promoted follower serves at once. RELEASE records are applied by the enqueue side
        (Indexer), in log order. Not durable until the commit log is fsynced. Returns the GROUP
        records, for the consumer groups."""
        end = self.commit.append_raw(offset, data)
        groups: list[Record] = []
        keyed: list[tuple[str, str, int, int]] = []
        msgs = self.msgs
        for rec in self.commit.scan(offset, end, verify=False):
            t = rec.type
            if t == RecordType.MESSAGE:
                if rec.seq >= self.next_seq:
                    self.msgs.prepare(rec.seq, rec.seq)
                    self.next_seq = rec.seq + 1
                if msgs.get(rec.seq)[0] == MessageState.UNKNOWN:
                    msgs.set(rec.seq, MessageState.SCHEDULED, rec.offset, rec.size, 0)
                if rec.key is not None:
                    keyed.append((rec.topic, rec.key, rec.seq, rec.deliver_at))
                self.counters.produced(rec.topic, 1)
            elif t == RecordType.CANCEL:
                if keyed:
                    self.keys.put_many(keyed)
                    keyed = []
                if msgs.get(rec.seq)[0] not in (MessageState.DELIVERED, MessageState.CANCELLED,
                                                MessageState.UNKNOWN):
                    self._cancelled(rec.seq, rec.topic, rec.key)
            elif t == RecordType.ROLL:
                st, _off, _size, roll = msgs.get(rec.seq)
                if st in (MessageState.UNKNOWN, MessageState.SCHEDULED) and rec.roll_count >= roll:
                    msgs.set(rec.seq, MessageState.SCHEDULED, rec.offset, rec.size, rec.roll_count)
            elif t == RecordType.GROUP:
                groups.append(rec)
        if keyed:
            self.keys.put_many(keyed)
        return groups

    def apply_releases(self) -> int:
        """Apply every RELEASE record the enqueue side has not reached yet (a follower about to
        release messages itself: its ready queues must first hold what the log says, or its own
        releases would take indexes a RELEASE record of the old primary names). Returns how many."""
        n = 0
        for rec in self.commit.scan(self.indexed):
            if rec.type == RecordType.RELEASE:
                self.dispatch.apply_release(rec)
                n += 1
        return n

    def flush_commit(self) -> None:
        self.commit.flush()

    def commit_handles(self) -> list[int]:
        """fds to fsync (with storage.segments.fsync_all, possibly in a thread) to make every
        append so far durable: the broker's group commit."""
        return self.commit.files.dirty_handles()

    # ---------------------------------------------------------------------------------- lookups
    def state(self, seq: int) -> tuple[MessageState, int, int, int]:
        return self.msgs.get(seq)

    def read_record(self, offset: int, size: int = 0) -> Record:
        return self.commit.read(offset, size)

    def read_many(self, locations: list[tuple[int, int]]) -> list[Any]:
        return self.dispatch.read_many(locations)

    def key_holder(self, topic: str, key: str) -> tuple[int, MessageState, int, int | None] | None:
        """(seq, state, deliver_at, done_at) of the message holding `key` now, or None."""
        return self.key_holders(topic, [key]).get(key)

    def key_holders(self, topic: str, keys: Sequence[str]) -> dict[str, tuple[int, MessageState, int, int | None]]:
        """Holders of many keys with one index query. The state comes from the message table, so
        a stale index entry cannot mislead."""
        return self._holding(self.keys.lookup_many(topic, keys))

    def claim_holders(self, topic: str, keys: Sequence[str]) -> tuple[dict[str, tuple[int, MessageState, int, int | None]], list[str] | None]:
        """key_holders for a produce's keys, claimed in the same pass (KeyIndex.claim_many), and
        the keys among which any that repeats in `keys` is (None: not known)."""
        found, maybe = self.keys.claim_many(topic, keys)
        return self._holding(found), maybe

    def _holding(self, found: dict[str, tuple[int, int, int | None]]) -> dict[str, tuple[int, MessageState, int, int | None]]:
        out: dict[str, tuple[int, MessageState, int, int | None]] = {}
        for key, (seq, deliver_at, done_at) in found.items():
            st = self.msgs.get(seq)[0]
            if st not in (MessageState.UNKNOWN, MessageState.CANCELLED):
                out[key] = (seq, st, deliver_at, done_at)
        return out

    def browse(self, query: Query, near_from_ms: int) -> Generator[None, None, Page]:
        """Pending messages in due order, one page (storage.browse): a generator to step, that
        yields while it walks a big slot and returns the Page. `near_from_ms` is the oldest slot
        whose units may still be in flight (the dispatcher's read time)."""
        if self._browser is None:
            self._browser = Browser(self.timers.wheel, self.timers.log, self.msgs, self.far, self.read_many,
                                    lambda: (self.dispatch.load_time_ms, self.schedule.slots),
                                    far_flag=int(Placed.FAR), slot_flag=int(Placed.SLOT))
        return self._browser.page(query, near_from_ms)

    def schedule_buckets(self, start: int, end: int, step: int) -> list[list[int]]:
        """Pending messages per [t, t+step) bucket (see Schedule.buckets)."""
        return self.schedule.buckets(start, end, step, self.dispatch.load_time_ms, self.timers.wheel.span_ms)

    # ---------------------------------------------------------------------------------- checkpoint
    def checkpoint(self, read_time_ms: int, groups: dict[str, Any], *, keys: bool = True) -> None:
        """Flush every derived structure, then record how far each is complete (`keys`: the key
        index's queued writes too; else they wait for the next checkpoint)."""
        pending = self.prepare_checkpoint(read_time_ms, groups, keys=keys)
        try:
            self.finish_checkpoint(pending)
        except BaseException:
            self.checkpoint_failed(pending)
            raise
        self.checkpoint_saved(pending)

    def prepare_checkpoint(self, read_time_ms: int, groups: dict[str, Any], *, keys: bool = True) -> PendingCheckpoint:
        """Snapshot positions and counters (consistent: nothing runs in between) and collect
        what must reach the disk before the snapshot may be written (`keys`: the key index's
        queued writes with it; its own commit position says how far it is complete either way)."""
        fds: list[int] = []
        try:
            fds += self.commit.files.checkpoint_handles()  # leaves the group commit its own
            fds += self.timers.log.files.dirty_handles()
            fds += self.msgs.dirty_handles()
            fds += self.ready.dirty_handles()
            fds.append(self.timers.wheel.dup_fd())  # fsync of the file also writes its mmap'd pages
        except OSError:
            for fd in fds:
                os.close(fd)
            self._all_dirty()
            raise
        pack_schedule, far = self.schedule.snapshot()  # (packed by finish_checkpoint)
        cp = ckpt.Checkpoint(
            commit_indexed=self.indexer.indexed, commit_end=self.commit.end, timerlog_end=self.timers.log.end,
            read_time_ms=read_time_ms, next_seq=self.next_seq, ready_ends=self.ready.ends(),
            counters=self.counters.snapshot(), far_schedule=far,
            groups=groups, created_ms=self.clock_ms(), indexed_at=dict(self.retention.indexed_at))
        return PendingCheckpoint(cp, fds, self.ready.take_unsynced(), pack_schedule, self.keys.take_ops() if keys else None,
                                 self.commit.end, self.far.take_ops(), self.indexer.indexed)

    def finish_checkpoint(self, pending: PendingCheckpoint) -> None:
        """Write the queued key-index changes, fsync, then write the checkpoint. Touches no
        state the event loop uses: safe in a worker thread."""
        try:
            if pending.key_ops is not None:
                self.keys.apply(pending.key_ops, pending.key_pos)
            self.far.apply(pending.far_ops, pending.far_pos)
            fsync_paths(pending.paths)
        finally:
            fsync_all(pending.fds)  # closes them, also on failure
            pending.fds = []
        ckpt.save(self.data.layout.checkpoint, replace(pending.checkpoint, schedule=pending.pack_schedule()))

    def checkpoint_failed(self, pending: PendingCheckpoint) -> None:
        """The checkpoint was not written: what it was to make durable is fsynced next time
        (every file it collected is dirty again) and its key-index changes are requeued."""
        if pending.key_ops is not None:
            self.keys.requeue(pending.key_ops)
        self.far.requeue(pending.far_ops)
        self.ready.unsynced_again(pending.paths)
        for fd in pending.fds:
            os.close(fd)
        pending.fds = []
        self._all_dirty()

    def _all_dirty(self) -> None:
        self.commit.files.mark_all_dirty()
        self.timers.log.files.mark_all_dirty()
        self.ready.mark_all_dirty()
        self.msgs.mark_all_dirty()

    def checkpoint_saved(self, pending: PendingCheckpoint) -> None:
        cp = pending.checkpoint
        self.commit.files.unmap_idle()  # a burst's mappings go once the drain is over
        self.msgs.unmap_idle()
        if pending.key_ops is not None:
            self.keys.applied()
        self.far.applied()
        self.dispatch.read_time_ms = cp.read_time_ms
        self.durable_indexed = cp.commit_indexed
        self.retention.covered(cp.commit_indexed, cp.created_ms)

    # ---------------------------------------------------------------------------------- retention
    def retain(self, now_ms: int, retention_ms: int, needed: dict[str, int]) -> dict[str, int]:
        """Delete the segments nothing needs any more (see storage.retention)."""
        return self.retention.retain(now_ms, retention_ms, needed, read_time_ms=self.dispatch.read_time_ms,
                                     durable_indexed=self.durable_indexed, next_seq=self.next_seq)

    def disk_bytes(self) -> int:
        """The data directory's bytes: segments, wheel, checkpoint and the SQLite indexes with
        their write-ahead logs (a log grows to SQLite's 1,000 pages, 16 MB with 16 KiB pages, and
        is then written again from its start, while no reader holds it). Ready queues count their
        units, from memory."""
        total = self.commit.disk_bytes() + self.timers.log.files.disk_bytes() + self.msgs.disk_bytes()
        total += self.ready.disk_bytes() + self.keys.disk_bytes() + self.far.disk_bytes()
        for p in (self.data.layout.timerwheel, self.data.layout.checkpoint):
            # The checkpoint is renamed aside and replaced by the checkpoint thread: between the two
            # renames it is briefly absent (an exists-then-stat raced that and failed /v1/stats).
            with contextlib.suppress(FileNotFoundError):
                total += p.stat().st_size
        return total

    def close(self) -> None:
        try:
            self.commit.close()
            self.timers.close()
            self.msgs.close()
            self.keys.commit(self.commit.end)
            self.keys.close()
            self.far.commit(self.indexer.indexed)
            self.far.close()
            self.ready.close()
        finally:
            self.data.close()
