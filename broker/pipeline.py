"""The RIP-43 timer pipeline: five stages linked by bounded queues.

    produce ─▶ commit log ─▶ enqueue-get ─▶ enqueue-put ─▶ TimerLog + wheel
                                                               │
    ready queue ◀─ dequeue-put ◀─ dequeue-get-message ◀─ dequeue-get (walks due slots)

A full link makes the stage before it wait; nothing is ever dropped. The commit log absorbs
bursts: produce only waits for the commit log (and its fsync), indexing catches up.
Every stage is a small class with a name, an inbox, an outbox and counters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from delayd.broker.clock import Clock
from delayd.storage.commitlog import Record
from delayd.storage.errors import CorruptData, DiskFull
from delayd.storage.segments import fsync_all
from delayd.storage.store import Due, Store

log = logging.getLogger("delayd.pipeline")

DISK_FULL_RETRY_S = 0.5


RELEASE_BATCH = 4096  # messages released per event-loop turn
RESOLVE_CHUNK = 256  # units resolved per event-loop turn (a big slot must not stall releases)


class Link:
    """A bounded queue of batches that counts items. `put` waits while full (flow control)."""

    def __init__(self, name: str, capacity_batches: int) -> None:
        self.name = name
        self.capacity = capacity_batches
        self.items = 0
        self._q: deque[tuple[int, Any]] = deque()
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()
        self._not_full.set()

    async def put(self, batch: Any, size: int) -> None:
        while len(self._q) >= self.capacity:
            self._not_full.clear()
            await self._not_full.wait()
        self._q.append((size, batch))
        self.items += size
        self._not_empty.set()

    def get_nowait(self) -> Any | None:
        if not self._q:
            return None
        size, batch = self._q.popleft()
        self.items -= size
        self._not_full.set()
        return batch

    async def get(self) -> Any:
        while not self._q:
            self._not_empty.clear()
            await self._not_empty.wait()
        return self.get_nowait()

    async def wait(self, timeout_s: float | None) -> None:
        """Wait until an item is there or `timeout_s` passes (never loses an item)."""
        if self._q:
            return
        self._not_empty.clear()
        try:
            await asyncio.wait_for(self._not_empty.wait(), timeout_s)
        except TimeoutError:
            pass

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


class Stage:
    name = "stage"

    def __init__(self, inbox: Link | None, outbox: Link | None) -> None:
        self.inbox = inbox
        self.outbox = outbox
        self.batches = 0
        self.items = 0
        self.disk_full = 0

    async def run(self) -> None:
        raise NotImplementedError

    async def disk_full_pause(self, e: DiskFull) -> None:
        """A stage that cannot write waits for room and then retries the same work: nothing is
        dropped or skipped, and the daemon stays up (produce answers 507 meanwhile)."""
        self.disk_full += 1
        if self.disk_full % 120 == 1:  # once a minute, not twice a second
            log.warning("%s: disk full (%s); retrying every %.1fs", self.name, e, DISK_FULL_RETRY_S)
        await asyncio.sleep(DISK_FULL_RETRY_S)


class EnqueueGet(Stage):
    """Tails the commit log from the indexed offset and hands records to enqueue-put."""
    name = "enqueue_get"

    def __init__(self, store: Store, outbox: Link, appended: asyncio.Event, batch: int = 2048) -> None:
        super().__init__(None, outbox)
        self.store, self.appended, self.batch = store, appended, batch
        self.pos = store.indexed

    async def run(self) -> None:
        assert self.outbox is not None
        while True:
            records, pos = self.store.read_records(self.pos, self.batch)
            if not records:
                self.appended.clear()
                if self.store.commit.end > self.pos:
                    await asyncio.sleep(0)
                    continue
                await self.appended.wait()
                continue
            self.pos = pos
            self.batches += 1
            self.items += len(records)
            await self.outbox.put(records, len(records))


class EnqueuePut(Stage):
    """Writes TimerLog units and wheel slots; sends messages whose slot already passed
    straight to dequeue-put."""
    name = "enqueue_put"

    def __init__(self, store: Store, inbox: Link, late: Link, clock: Clock, inflight: InFlight) -> None:
        super().__init__(inbox, late)
        self.store, self.clock, self.inflight = store, clock, inflight

    async def run(self) -> None:
        assert self.inbox is not None and self.outbox is not None
        while True:
            records: list[Record] = await self.inbox.get()
            while records:
                try:
                    n = self.store.index(records, self.clock.now_ms())
                except DiskFull as e:
                    # `indexed` did not move, so the same records are indexed again; a unit that
                    # made it to disk the first time is then there twice, and release drops the
                    # second (it checks the message is still scheduled).
                    await self.disk_full_pause(e)
                    continue
                late = self.store.take_late()
                if late:
                    # Each is also a unit in slot `d.slot_time`, not loaded yet, and dequeue-put
                    # marks it done there when released: count it in flight there until then, or
                    # that release would let the checkpoint's read time pass a slot whose own
                    # units are still held (lost on kill -9: found by the torture test).
                    for d in late:
                        self.inflight.add(d.slot_time, 1)
                    await self.outbox.put(late, len(late))
                self.items += n
                records = records[n:]
                if records:
                    # The slot's previous lap is not dispatched yet (only after a long stop):
                    # wait for dequeue-get to catch up rather than overwrite it.
                    await asyncio.sleep(self.store.cfg.precision_ms / 1000)
            self.batches += 1


class DequeueGet(Stage):
    """Loads each slot `lookahead_ms` before it starts and passes its units on."""
    name = "dequeue_get"

    def __init__(self, store: Store, outbox: Link, clock: Clock, inflight: InFlight, lookahead_ms: int) -> None:
        super().__init__(None, outbox)
        self.store, self.clock, self.inflight, self.lookahead_ms = store, clock, inflight, lookahead_ms

    async def run(self) -> None:
        assert self.outbox is not None
        idle = 0
        while True:
            t = self.store.load_time_ms
            wait_ms = t - self.lookahead_ms - self.clock.now_ms()
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
                continue
            # The slot stays "in flight" until its walk ends, so the checkpoint's read time
            # cannot pass it while units are still to come.
            self.inflight.add(t, 1)
            n = 0
            for chunk in self.store.open_slot(t, RESOLVE_CHUNK):
                self.inflight.add(t, len(chunk))
                n += len(chunk)
                await self.outbox.put((t, chunk), len(chunk))
                await asyncio.sleep(0)  # a put into a link with room does not yield by itself
            self.inflight.done(t)
            if n:
                self.items += n
                self.batches += 1
            else:
                idle += 1
                if idle % 256 == 0:  # catching up over empty slots: let the loop breathe
                    await asyncio.sleep(0)


class DequeueGetMessage(Stage):
    """Reads each unit's record: drops cancelled, delivered and stale units, rolls far ones
    forward (re-appended to the commit log), passes due messages on."""
    name = "dequeue_get_message"

    def __init__(self, store: Store, inbox: Link, outbox: Link, inflight: InFlight,
                 appended: asyncio.Event) -> None:
        super().__init__(inbox, outbox)
        self.store, self.inflight, self.appended = store, inflight, appended
        self.dropped = 0
        self.rolled = 0
        self.unreadable = 0

    async def run(self) -> None:
        assert self.inbox is not None and self.outbox is not None
        while True:
            slot_time, units = await self.inbox.get()
            dues: list[Due] = []
            for unit, r in zip(units, self.store.resolve_many(units, slot_time), strict=True):
                if isinstance(r, CorruptData):
                    # A damaged record (bit rot, a bad sector) loses that one message; letting
                    # the stage die would stop delivery of all of them, again at every restart.
                    log.error("message %d (seq): its commit-log record at %d is unreadable (%s: %s); dropped",
                              unit.seq, unit.commit_offset, type(r).__name__, r)
                    self.store.drop_unreadable(unit)
                    self.unreadable += 1
                    r = None
                if isinstance(r, Due):
                    dues.append(r)
                    continue
                if isinstance(r, Record):
                    while True:
                        try:
                            self.store.roll_forward(dataclasses.replace(r))  # it bumps roll_count
                            break
                        except DiskFull as e:
                            await self.disk_full_pause(e)
                    self.rolled += 1
                    self.appended.set()
                else:
                    self.dropped += 1
                self.inflight.done(slot_time)
            self.items += len(units)
            self.batches += 1
            if dues:
                await self.outbox.put(dues, len(dues))
            await asyncio.sleep(0)  # let dequeue-put release between chunks


class DequeuePut(Stage):
    """Holds due messages until their own `deliver_at` millisecond, then releases them into
    their topic's ready queue. Never early: release needs clock >= deliver_at."""
    name = "dequeue_put"

    def __init__(self, store: Store, inbox: Link, clock: Clock, inflight: InFlight, capacity: int,
                 on_release: Callable[[list[Due], int], None]) -> None:
        super().__init__(inbox, None)
        self.store, self.clock, self.inflight = store, clock, inflight
        self.capacity, self.on_release = capacity, on_release
        self.heap: list[tuple[int, int, Due]] = []
        self.due_now: list[Due] = []  # already due when they arrived: no need for the heap

    async def run(self) -> None:
        assert self.inbox is not None
        heap, due_now = self.heap, self.due_now
        while True:
            now = self.clock.now_ms()
            while len(heap) + len(due_now) < self.capacity and len(due_now) < RELEASE_BATCH:
                batch = self.inbox.get_nowait()
                if batch is None:
                    break
                for d in batch:
                    if d.deliver_at <= now:
                        due_now.append(d)
                    else:
                        heapq.heappush(heap, (d.deliver_at, d.seq, d))
            if due_now or (heap and heap[0][0] <= now):
                due: list[Due] = due_now[:RELEASE_BATCH]
                del due_now[:RELEASE_BATCH]
                while heap and heap[0][0] <= now and len(due) < RELEASE_BATCH:
                    due.append(heapq.heappop(heap)[2])
                try:
                    released = self.store.release(due, now)
                except DiskFull as e:
                    # Nothing of the failing topic was queued (ReadyQueue.append is all or
                    # nothing) and what was is marked delivered: hold them all and retry.
                    for d in due:
                        heapq.heappush(heap, (d.deliver_at, d.seq, d))
                    await self.disk_full_pause(e)
                    continue
                for d in due:
                    self.inflight.done(d.slot_time)
                self.items += len(released)
                self.batches += 1
                if released:
                    self.on_release(released, now)
                await asyncio.sleep(0)
                continue
            timeout = None if not heap else max(0.0, (heap[0][0] - now) / 1000)
            if len(heap) >= self.capacity:
                await asyncio.sleep(timeout or 0)
            else:
                await self.inbox.wait(timeout)

    @property
    def holding(self) -> int:
        return len(self.heap) + len(self.due_now)


class GroupCommit:
    """fsync policy `always`: one fsync serves every append that happened before it started.

    Appends are synchronous; a caller then awaits `durable()`. The committer fsyncs in a
    worker thread, so requests keep appending while the disk works, and their waiters ride
    the next fsync.
    """

    def __init__(self, store: Store, policy: str, interval_ms: int,
                 on_fsync: Callable[[float], None] | None = None) -> None:
        self.store, self.policy, self.interval_ms = store, policy, interval_ms
        self.on_fsync = on_fsync  # told each fsync's duration in seconds (metrics)
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self.fsyncs = 0
        self.last_error: BaseException | None = None

    async def durable(self) -> None:
        if self.policy != "always":
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._wake.set()
        await fut

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.policy == "always":
                await self._wake.wait()
                self._wake.clear()
            else:
                await asyncio.sleep(self.interval_ms / 1000)
                if self.policy == "never":
                    continue
            waiters, self._waiters = self._waiters, []
            fds = self.store.commit_handles()
            try:
                if fds:
                    started = time.monotonic()
                    await loop.run_in_executor(None, fsync_all, fds)
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
                        w.set_exception(e)
                continue
            for w in waiters:
                if not w.done():
                    w.set_result(None)


class Pipeline:
    """The five stages, their links, and the tasks that run them."""

    def __init__(self, store: Store, clock: Clock, *, lookahead_ms: int, queue_batches: int,
                 release_capacity: int, on_release: Callable[[list[Due], int], None]) -> None:
        self.store = store
        self.clock = clock
        self.appended = asyncio.Event()
        self.inflight = InFlight(store)
        self.records = Link("enqueue_put", queue_batches)
        self.units = Link("dequeue_get_message", queue_batches)
        self.dues = Link("dequeue_put", queue_batches * 4)
        self.stages: list[Stage] = [
            EnqueueGet(store, self.records, self.appended),
            EnqueuePut(store, self.records, self.dues, clock, self.inflight),
            DequeueGet(store, self.units, clock, self.inflight, lookahead_ms),
            DequeueGetMessage(store, self.units, self.dues, self.inflight, self.appended),
            DequeuePut(store, self.dues, clock, self.inflight, release_capacity, on_release),
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

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()

    def depths(self) -> dict[str, int]:
        """What waits in front of each stage. enqueue-get's queue is the commit log itself, so
        its depth is in bytes not yet read; dequeue-get's is in slots it is behind the clock;
        the others count messages (dequeue-put's includes those it holds until due)."""
        get, put = self.stages[0], self.stages[4]
        assert isinstance(get, EnqueueGet) and isinstance(put, DequeuePut)
        behind = (self.clock.now_ms() - self.store.load_time_ms) // self.store.cfg.precision_ms
        return {"enqueue_get": max(0, self.store.commit.end - get.pos), "enqueue_put": self.records.items,
                "dequeue_get": max(0, behind), "dequeue_get_message": self.units.items,
                "dequeue_put": self.dues.items + put.holding}

    def failed(self) -> BaseException | None:
        for t in self.tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                return t.exception()
        return None
