"""The RIP-43 timer pipeline: five stages linked by bounded queues.

    produce ─▶ commit log ─▶ enqueue-get ─▶ enqueue-put ─▶ TimerLog + wheel
                               RowBatch       │ DueBatch (late)    │
    ready queue ◀─ dequeue-put ◀─ dequeue-get-message ◀─ dequeue-get (walks due slots)
                            DueBatch                SlotBatch

A full link makes the stage before it wait; nothing is ever dropped. The commit log absorbs
bursts: produce only waits for the commit log (and its fsync), indexing catches up. Each link
carries one named batch type (RocketMQ passes one TimerRequest through every queue), and a batch
is rows of fixed size in one bytes object (storage.batch: MessageRows, UnitRows, DueRows), never
a Python object per message. Every stage is a small class with a name, an inbox, an outbox,
counters and a state (INITIAL, RUNNING, WAITING, END), and calls one per-batch method of a storage
component (Indexer.index_rows, Dispatch.resolve, Dispatch.release), whose per-message loops run in
the compiled batch core.

Stopping drains instead of cancelling: the sources (enqueue-get, dequeue-get) stop taking new
work and close their links, each stage finishes what is in its inbox and closes its own, and
dequeue-put releases what is already due (messages held for a later millisecond stay in the
wheel: the checkpoint's read time keeps their slot, and they are walked again at the next start).
`Pipeline.stop` bounds the drain with a timeout and cancels what is left after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Generic, TypeVar

from delayd.broker.clock import Clock
from delayd.storage import batch
from delayd.storage.batch import DROW, MROW, UROW
from delayd.storage.dispatch import Released
from delayd.storage.errors import DiskFull, NotDurable, OutOfDescriptors
from delayd.storage.fsyncer import Fsyncer
from delayd.storage.segments import DESCRIPTOR_ERRNOS
from delayd.storage.store import Store

log = logging.getLogger("delayd.pipeline")

RETRY_S = 0.5  # a stage that cannot write (disk full, no descriptors) retries this often
RELEASE_BATCH = 4096  # messages released per event-loop turn
RESOLVE_CHUNK = 1024  # units resolved per event-loop turn (a big slot must not stall releases)
CARRY_POLL_S = 0.1  # a follower looks this often whether its primary's cursor moved
# A primary's enqueue-get held back by the watermark looks again this often even when nothing
# woke it: what moves the watermark (acks, the group commit's fsync, the in-sync set) wakes it,
# and this bounds the delay should a move go unannounced.
LIMIT_POLL_S = 0.05
DRAIN_TIMEOUT_S = 5.0
TRANSIENT = (DiskFull, OutOfDescriptors, OSError)  # caught by the stages; `transient` says which to retry


def transient(e: BaseException) -> bool:
    """A failure a stage waits out and retries: a full disk, or no file descriptor to spare."""
    return isinstance(e, DiskFull | OutOfDescriptors) or (isinstance(e, OSError) and e.errno in DESCRIPTOR_ERRNOS)


# ------------------------------------------------------------------------------ batches and links

@dataclass(slots=True)
class RowBatch:
    """enqueue-get → enqueue-put: MessageRows of commit-log records, in log order."""
    rows: bytes

    def __len__(self) -> int:
        return len(self.rows) // MROW


@dataclass(slots=True)
class SlotBatch:
    """dequeue-get → dequeue-get-message: UnitRows of a chunk of one slot's units."""
    slot_time: int
    units: bytes

    def __len__(self) -> int:
        return len(self.units) // UROW


@dataclass(slots=True)
class DueBatch:
    """enqueue-put (late ones) and dequeue-get-message → dequeue-put: DueRows to release."""
    rows: bytes

    def __len__(self) -> int:
        return len(self.rows) // DROW


B = TypeVar("B", bound=Sized)


class Link(Generic[B]):
    """A bounded queue of batches of one type that counts items. `put` waits while full (flow
    control). Its producers `close` it when they end; `get` then answers None once it is empty."""

    def __init__(self, name: str, capacity_batches: int, producers: int = 1) -> None:
        self.name = name
        self.capacity = capacity_batches
        self.items = 0
        self._q: deque[B] = deque()
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()
        self._not_full.set()
        self._open_producers = producers

    async def put(self, batch: B) -> None:
        while len(self._q) >= self.capacity:
            self._not_full.clear()
            await self._not_full.wait()
        self._q.append(batch)
        self.items += len(batch)
        self._not_empty.set()

    def get_nowait(self) -> B | None:
        if not self._q:
            return None
        batch = self._q.popleft()
        self.items -= len(batch)
        self._not_full.set()
        return batch

    async def get(self) -> B | None:
        """The next batch; None once every producer closed the link and it is empty."""
        while not self._q:
            if self.closed:
                return None
            self._not_empty.clear()
            await self._not_empty.wait()
        return self.get_nowait()

    async def wait(self, timeout_s: float | None) -> None:
        """Wait until an item is there (or the link closed) or `timeout_s` passes (never loses an item)."""
        if self._q or self.closed:
            return
        self._not_empty.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self._not_empty.wait()
        except TimeoutError:
            pass

    def close(self) -> None:
        """One producer is done."""
        self._open_producers -= 1
        self._not_empty.set()

    @property
    def closed(self) -> bool:
        return self._open_producers <= 0

    def __len__(self) -> int:
        return len(self._q)


class InFlight:
    """Units taken out of the wheel and not yet released or dropped, per slot.

    The checkpoint's read time is the oldest slot with units still in flight: a crash
    re-walks from there, and the message table drops what was already released.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.by_slot: dict[int, int] = {}

    def add(self, slot_time: int, n: int) -> None:
        self.by_slot[slot_time] = self.by_slot.get(slot_time, 0) + n

    def done(self, slot_time: int, n: int = 1) -> None:
        left = self.by_slot.get(slot_time, 0) - n
        if left > 0:
            self.by_slot[slot_time] = left
        else:
            self.by_slot.pop(slot_time, None)

    def read_time(self) -> int:
        return min(self.by_slot, default=self.store.load_time_ms)

    @property
    def count(self) -> int:
        return sum(self.by_slot.values())


# ------------------------------------------------------------------------------ stages

class StageState(enum.Enum):
    """RocketMQ's timer service states."""
    INITIAL = "initial"  # built, not started
    RUNNING = "running"  # working on a batch
    WAITING = "waiting"  # waiting for input, for its time, for room downstream, or for the disk
    END = "end"  # drained (or cancelled) and finished


class Stage:
    name = "stage"

    def __init__(self) -> None:
        self.batches = 0
        self.items = 0
        self.retries = 0
        self.state = StageState.INITIAL
        self.stopping = asyncio.Event()  # set by Pipeline.stop: drain and end

    async def run(self) -> None:
        raise NotImplementedError

    async def pause(self, e: Exception) -> bool:
        """A stage that cannot write (disk full, out of descriptors) waits and then retries the
        same work: nothing is dropped or skipped, and the daemon stays up (produce answers 507
        or 503 meanwhile). Returns False when the pipeline is stopping instead: the work is
        redone from the files at the next start."""
        self.retries += 1
        if self.retries % 120 == 1:  # once a minute, not twice a second
            log.warning("%s: %s (%s); retrying every %.1fs", self.name, type(e).__name__, e, RETRY_S)
        return not await self.sleep(RETRY_S)

    async def sleep(self, seconds: float) -> bool:
        """Wait `seconds` (WAITING); True when interrupted because the pipeline is stopping."""
        state, self.state = self.state, StageState.WAITING
        try:
            async with asyncio.timeout(seconds):
                await self.stopping.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self.state = state

    async def put(self, link: Link[B], batch: B) -> None:
        state, self.state = self.state, StageState.WAITING
        try:
            await link.put(batch)
        finally:
            self.state = state


class EnqueueGet(Stage):
    """Tails the commit log from the indexed offset and hands MessageRows to enqueue-put: the rows
    produce made of what it appended (no second trip through the same bytes), else one read and
    one compiled scan of the log (cancels, group events, roll copies, recovery)."""
    name = "enqueue_get"

    def __init__(self, store: Store, outbox: Link[RowBatch], appended: asyncio.Event, batch: int = 2048,
                 limit: Callable[[], int] | None = None) -> None:
        super().__init__()
        self.store, self.outbox, self.appended, self.batch = store, outbox, appended, batch
        self.pos = store.indexed
        # Replication: the primary indexes (and so releases) only up to the high watermark, what
        # every in-sync member has fsynced. None: up to the log end.
        self.limit = limit

    async def run(self) -> None:
        store, commit = self.store, self.store.commit
        try:
            while not self.stopping.is_set():
                self.state = StageState.RUNNING
                if self.limit is None:
                    end = commit.end
                    rows, pos = store.handed_rows(self.pos)
                    if not rows:
                        rows, pos = batch.read_rows(commit, self.pos, self.batch, store.next_handed())
                else:
                    end = min(commit.end, self.limit())
                    rows, pos = batch.read_rows(commit, self.pos, self.batch, end) if end > self.pos else (b"", 0)
                if not rows:
                    self.appended.clear()
                    if end > self.pos:
                        await asyncio.sleep(0)
                        continue
                    self.state = StageState.WAITING
                    if commit.end > end:  # held back by the limit, not at the log's end
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(LIMIT_POLL_S):
                                await self.appended.wait()
                    else:
                        await self.appended.wait()  # Pipeline.stop sets it too
                    continue
                self.pos = pos
                self.batches += 1
                self.items += len(rows) // MROW
                await self.put(self.outbox, RowBatch(rows))
        finally:
            self.outbox.close()


class EnqueuePut(Stage):
    """Writes TimerLog units and wheel slots (Indexer.index_rows); sends messages whose slot
    already passed straight to dequeue-put."""
    name = "enqueue_put"

    def __init__(self, store: Store, inbox: Link[RowBatch], late: Link[DueBatch] | None, clock: Clock,
                 inflight: InFlight) -> None:
        super().__init__()
        self.indexer, self.precision_ms = store.indexer, store.cfg.precision_ms
        self.inbox, self.outbox, self.clock, self.inflight = inbox, late, clock, inflight

    async def run(self) -> None:
        try:
            while True:
                self.state = StageState.WAITING
                got = await self.inbox.get()
                if got is None:
                    return
                self.state = StageState.RUNNING
                if not await self._index(got.rows):
                    return
                self.batches += 1
        finally:
            if self.outbox is not None:
                self.outbox.close()

    async def _index(self, rows: bytes) -> bool:
        while rows:
            try:
                result = self.indexer.index_rows(rows, self.clock.now_ms())
            except TRANSIENT as e:
                if not transient(e):
                    raise
                # Nothing of the batch was indexed (a write that fails half way reports the part
                # done instead): the same rows are indexed again; schedule counts count once.
                if not await self.pause(e):
                    return False
                continue
            if result.late and self.outbox is not None:  # (a follower releases nothing: no outbox)
                # Each is also a unit in slot `slot_time`, not loaded yet, and dequeue-put marks it
                # done there when released: count it in flight there until then, or that release
                # would let the checkpoint's read time pass a slot whose own units are still held
                # (lost on kill -9: found by the torture test).
                for slot_time, n in batch.ops.tally(result.late, DROW, 40).items():
                    self.inflight.add(slot_time, n)
                await self.put(self.outbox, DueBatch(result.late))
            self.items += result.consumed
            rows = rows[result.consumed * MROW:]
            if result.blocked and await self.sleep(self.precision_ms / 1000):
                # The slot's previous lap is not dispatched yet (only after a long stop): wait
                # for dequeue-get to catch up rather than overwrite it. Stopping: redone at start.
                return False
        return True


class DequeueGet(Stage):
    """Loads each slot `lookahead_ms` before it starts and passes its units on."""
    name = "dequeue_get"

    def __init__(self, store: Store, outbox: Link[SlotBatch], clock: Clock, inflight: InFlight,
                 lookahead_ms: int) -> None:
        super().__init__()
        self.dispatch = store.dispatch
        self.outbox, self.clock, self.inflight, self.lookahead_ms = outbox, clock, inflight, lookahead_ms

    async def run(self) -> None:
        idle = 0
        try:
            while not self.stopping.is_set():
                t = self.dispatch.load_time_ms
                wait_ms = t - self.lookahead_ms - self.clock.now_ms()
                if wait_ms > 0:
                    await self.sleep(wait_ms / 1000)
                    continue
                self.state = StageState.RUNNING
                # The slot stays "in flight" until its walk ends, so the checkpoint's read time
                # cannot pass it while units are still to come.
                self.inflight.add(t, 1)
                n = 0
                for chunk in self.dispatch.open_slot(t, RESOLVE_CHUNK):
                    k = len(chunk) // UROW
                    self.inflight.add(t, k)
                    n += k
                    await self.put(self.outbox, SlotBatch(t, chunk))
                    await asyncio.sleep(0)  # a put into a link with room does not yield by itself
                self.inflight.done(t)
                if n:
                    self.items += n
                    self.batches += 1
                else:
                    idle += 1
                    if idle % 256 == 0:  # catching up over empty slots: let the loop breathe
                        await asyncio.sleep(0)
        finally:
            self.outbox.close()


class Carry(Stage):
    """A replication follower's dequeue side (Dispatch.carry): follows the primary's dequeue
    cursor, `target()`, releasing nothing; what is still pending in the slots it passes moves
    along, so the wheel keeps indexing and a promoted follower starts where its primary was."""
    name = "dequeue_carry"

    def __init__(self, store: Store, target: Callable[[], int]) -> None:
        super().__init__()
        self.dispatch, self.target = store.dispatch, target

    async def run(self) -> None:
        while not self.stopping.is_set():
            target = self.target()
            if target <= self.dispatch.load_time_ms:
                if await self.sleep(CARRY_POLL_S):
                    return
                continue
            self.state = StageState.RUNNING
            try:
                self.items += self.dispatch.carry(target)
                self.batches += 1
            except TRANSIENT as e:
                if not transient(e):
                    raise
                if not await self.pause(e):
                    return
            await asyncio.sleep(0)  # one bounded call at a time: let the enqueue side in


class DequeueGetMessage(Stage):
    """Reads each unit's record (Dispatch.resolve): drops cancelled, delivered and stale units,
    rolls far ones forward (re-appended to the commit log), passes due messages on."""
    name = "dequeue_get_message"

    def __init__(self, store: Store, inbox: Link[SlotBatch], outbox: Link[DueBatch], inflight: InFlight,
                 appended: asyncio.Event) -> None:
        super().__init__()
        self.dispatch = store.dispatch
        self.inbox, self.outbox, self.inflight, self.appended = inbox, outbox, inflight, appended
        self.dropped = 0
        self.rolled = 0
        self.unreadable = 0

    async def run(self) -> None:
        try:
            while True:
                self.state = StageState.WAITING
                got = await self.inbox.get()
                if got is None:
                    return
                self.state = StageState.RUNNING
                if not await self._resolve(got):
                    return
        finally:
            self.outbox.close()

    async def _resolve(self, got: SlotBatch) -> bool:
        slot_time = got.slot_time
        while True:
            try:
                res = self.dispatch.resolve(got.units, slot_time)
                break
            except TRANSIENT as e:
                if not transient(e):
                    raise
                if not await self.pause(e):
                    return False
        for unit, err in res.unreadable:
            # A damaged record (bit rot, a bad sector) loses that one message; letting the stage
            # die would stop delivery of all of them, again at every restart.
            log.error("message %d (seq): its commit-log record at %d is unreadable (%s: %s); dropped",
                      unit.seq, unit.commit_offset, type(err).__name__, err)
            self.dispatch.drop_unreadable(unit)
        self.unreadable += len(res.unreadable)
        if res.roll:
            while True:
                try:
                    self.dispatch.roll_forward(res.roll, res.roll_sizes)
                    break
                except TRANSIENT as e:
                    if not transient(e):
                        raise
                    if not await self.pause(e):
                        return False
            self.rolled += len(res.roll_sizes) // 4
            self.appended.set()
        self.dropped += res.dropped
        n, due = len(got), len(res.due) // DROW
        self.inflight.done(slot_time, n - due)
        self.items += n
        self.batches += 1
        if due:
            await self.put(self.outbox, DueBatch(res.due))
        await asyncio.sleep(0)  # let dequeue-put release between chunks
        return True


class DequeuePut(Stage):
    """Holds due messages until their own `deliver_at` millisecond, then releases them into
    their topic's ready queue (Dispatch.release). Never early: release needs clock >= deliver_at.
    The messages it holds are DueRows in the compiled core's heap, ordered by (deliver_at, seq)."""
    name = "dequeue_put"

    def __init__(self, store: Store, inbox: Link[DueBatch], clock: Clock, inflight: InFlight, capacity: int,
                 on_release: Callable[[Released, int], None], appended: asyncio.Event) -> None:
        super().__init__()
        self.dispatch = store.dispatch
        self.inbox, self.clock, self.inflight, self.appended = inbox, clock, inflight, appended
        self.capacity, self.on_release = capacity, on_release
        self.heap = batch.ops.DueHeap()

    async def run(self) -> None:
        heap = self.heap
        while True:
            now = self.clock.now_ms()
            while len(heap) < self.capacity:
                got = self.inbox.get_nowait()
                if got is None:
                    break
                heap.push(got.rows)
            due = heap.pop(now, RELEASE_BATCH)
            if due:
                self.state = StageState.RUNNING
                if not await self._release(due, now):
                    return
                await asyncio.sleep(0)
                continue
            if self.inbox.closed and not len(self.inbox):
                return  # drained: what is held for later stays in the wheel (walked again at start)
            self.state = StageState.WAITING
            next_due = heap.next_due()
            timeout = None if next_due is None else max(0.0, (next_due - now) / 1000)
            if len(heap) >= self.capacity:
                await asyncio.sleep(timeout or 0)
            else:
                await self.inbox.wait(timeout)

    async def _release(self, due: bytes, now: int) -> bool:
        try:
            released = self.dispatch.release(due, now)
        except TRANSIENT as e:
            if not transient(e):
                raise
            # What was released before the failing topic is marked delivered (a retry drops it);
            # the rest was not queued: hold them all and retry.
            self.heap.push(due)
            return await self.pause(e)
        for slot_time, n in batch.ops.tally(due, DROW, 40).items():
            self.inflight.done(slot_time, n)
        self.items += released.count
        self.batches += 1
        if released.count:
            # Its RELEASE records: enqueue-get steps over them now, so the indexed offset reaches
            # the log's end (a listing waits for that) without waiting for the next produce.
            self.appended.set()
            self.on_release(released, now)
        return True

    @property
    def holding(self) -> int:
        return len(self.heap)


# ------------------------------------------------------------------------------ group commit

class GroupCommit:
    """fsync policy `always`: one fsync serves every append that happened before it started.

    Appends are synchronous; a caller then awaits `durable()`. The committer fsyncs in a
    thread of its own (storage.fsyncer), so requests keep appending while the disk works, and
    their waiters ride the next fsync.
    """

    def __init__(self, store: Store, policy: str, interval_ms: int,
                 on_fsync: Callable[[float], None] | None = None,
                 on_durable: Callable[[int], None] | None = None) -> None:
        self.store, self.policy, self.interval_ms = store, policy, interval_ms
        self.on_fsync = on_fsync  # told each fsync's duration in seconds (metrics)
        self.on_durable = on_durable  # told the new durable_end after each fsync (a replicated watermark)
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self.fsyncs = 0
        self.durable_end = store.commit.end  # the commit log is fsynced up to here (policy `always`)
        self.last_error: BaseException | None = None
        self.fsyncer = Fsyncer()  # the fsyncs, in a thread that never takes the GIL (storage.fsyncer)

    async def durable(self) -> None:
        if self.policy != "always":
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._wake.set()
        await fut

    async def run(self) -> None:
        try:
            self.fsyncer.start()
            await self._rounds()
        finally:
            self.fsyncer.close()  # after the fsync under way, if any

    async def _rounds(self) -> None:
        while True:
            if self.policy == "always":
                await self._wake.wait()
                self._wake.clear()
            else:
                await asyncio.sleep(self.interval_ms / 1000)
                if self.policy == "never":
                    continue
            waiters, self._waiters = self._waiters, []
            end = self.store.commit.end  # what this fsync covers
            try:
                try:
                    fds = self.store.commit_handles()  # dup()s, for the fsync in the Fsyncer's thread
                except OSError as e:
                    if e.errno not in DESCRIPTOR_ERRNOS:
                        raise
                    # No descriptor to spare for a dup: fsync through the open ones, here on the
                    # event loop (a few ms), rather than fail produces for lack of descriptors.
                    fds = []
                    self.store.commit.files.sync_in_place()
                    self.fsyncs += 1
                if fds:
                    started = time.monotonic()
                    await self.fsyncer.sync(fds)
                    self.fsyncs += 1
                    if self.on_fsync is not None:
                        self.on_fsync(time.monotonic() - started)
            except OSError as e:
                self.last_error = e
                log.error("commit-log fsync failed: %s", e)
                # Its waiters answer 507; the next round must fsync these appends again rather
                # than let a later waiter through on an fsync that did not cover them.
                self.store.commit.files.mark_dirty()
                for w in waiters:
                    if not w.done():
                        err = NotDurable(f"commit-log fsync failed: {e}")
                        err.__cause__ = e
                        w.set_exception(err)
                continue
            self.durable_end = max(self.durable_end, end)
            for w in waiters:
                if not w.done():
                    w.set_result(None)
            if self.on_durable is not None:
                self.on_durable(self.durable_end)


# ------------------------------------------------------------------------------ the pipeline

class Pipeline:
    """The five stages, their links, and the tasks that run them."""

    def __init__(self, store: Store, clock: Clock, *, lookahead_ms: int, queue_batches: int,
                 release_capacity: int, on_release: Callable[[Released, int], None], follower: bool = False,
                 limit: Callable[[], int] | None = None, carry_to: Callable[[], int] | None = None) -> None:
        self.store = store
        self.clock = clock
        self.appended = asyncio.Event()
        self.inflight = InFlight(store)
        self.records: Link[RowBatch] = Link("enqueue_put", queue_batches)
        self.units: Link[SlotBatch] = Link("dequeue_get_message", queue_batches)
        # Two producers: enqueue-put (late ones) and dequeue-get-message.
        self.dues: Link[DueBatch] = Link("dequeue_put", queue_batches * 4, producers=2)
        self.enqueue_get = EnqueueGet(store, self.records, self.appended, limit=limit)
        self.dequeue_put = DequeuePut(store, self.dues, clock, self.inflight, release_capacity, on_release,
                                      self.appended)
        self.follower = follower
        if follower:
            # A replication follower runs the enqueue side only: it indexes the primary's records
            # (and derives its ready queues from their RELEASE records) and releases nothing, so
            # a promoted follower's wheel holds everything and delivered messages drop out of it;
            # its cursor follows the primary's (`carry_to`).
            self.stages: list[Stage] = [self.enqueue_get, EnqueuePut(store, self.records, None, clock, self.inflight)]
            if carry_to is not None:
                self.stages.append(Carry(store, carry_to))
        else:
            self.stages = [
                self.enqueue_get,
                EnqueuePut(store, self.records, self.dues, clock, self.inflight),
                DequeueGet(store, self.units, clock, self.inflight, lookahead_ms),
                DequeueGetMessage(store, self.units, self.dues, self.inflight, self.appended),
                self.dequeue_put,
            ]
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for st in self.stages:
            self.tasks.append(asyncio.create_task(self._guard(st), name=st.name))

    async def _guard(self, stage: Stage) -> None:
        try:
            await stage.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            # A stage that dies silently would stall delivery: make it loud and fatal.
            log.exception("pipeline stage %s failed; stopping the daemon", stage.name)
            raise
        finally:
            stage.state = StageState.END

    async def stop(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Drain: sources stop, every stage finishes its inbox, then ends. Stages still running
        after `timeout_s` are cancelled. Returns whether everything drained in time."""
        for st in self.stages:
            st.stopping.set()
        self.appended.set()  # wake enqueue-get
        drained = True
        if self.tasks:
            _done, pending = await asyncio.wait(self.tasks, timeout=timeout_s)
            if pending:
                drained = False
                log.warning("pipeline: %s did not drain within %.1fs; cancelled",
                            ", ".join(t.get_name() for t in pending), timeout_s)
                for t in pending:
                    t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
        # What the stages took out of the wheel and did not release (loaded ahead, held until due)
        # is walked again by whatever dequeues next: a pipeline started in this one's place (a
        # replicated member that changes role, e.g. a primary demoted and elected again with no
        # other primary releasing in between), as the next start's recovery does after a stop.
        self.store.dispatch.rewind(self.inflight.read_time())
        return drained

    def depths(self) -> dict[str, int]:
        """What waits in front of each stage. enqueue-get's queue is the commit log itself, so
        its depth is in bytes not yet read; dequeue-get's is in slots it is behind the clock;
        the others count messages (dequeue-put's includes those it holds until due)."""
        behind = (self.clock.now_ms() - self.store.load_time_ms) // self.store.cfg.precision_ms
        return {"enqueue_get": max(0, self.store.commit.end - self.enqueue_get.pos),
                "enqueue_put": self.records.items, "dequeue_get": max(0, behind),
                "dequeue_get_message": self.units.items, "dequeue_put": self.dues.items + self.dequeue_put.holding}

    def states(self) -> dict[str, str]:
        """Each stage's StageState, by stage name."""
        return {st.name: st.state.value for st in self.stages}

    def failed(self) -> BaseException | None:
        for t in self.tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                return t.exception()
        return None
