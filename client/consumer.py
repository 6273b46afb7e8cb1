"""Consumer runners: pull, call a handler per message, settle the lease.

* Up to `concurrency` handlers run at once; the runner pulls only as many messages as it has free
  slots, so nothing sits leased in a local queue.
* Handler returns -> ack. Handler raises -> nack with `retry_delay_ms(attempt)` (default: the
  broker's exponential backoff); after the subscription's `max_attempts` the broker dead-letters it.
* Acks go together: the first is sent at once; those of handlers that finish while it is on its
  way go in the next request, up to `ack_batch_max` receipts (SQS's DeleteMessageBatch, with no
  wait added); a whole batch goes at once, beside the one on its way. Nacks of one retry delay go
  together the same way. A handler's slot is free again once the broker has answered.
* A handler still busy when half its lease is gone gets the lease extended by `lease_ms`.
* `max_messages` stops after that many deliveries; `idle_timeout_s` stops once nothing has arrived
  (and nothing is running) for that long.
* `stop()` is graceful: no new pulls, messages pulled but not started are handed back (zero-delay
  nack), running handlers get `drain_timeout_s` to finish and are settled normally.

Handlers may be coroutine functions (awaited on the loop) or plain functions (run in a thread pool of
`concurrency` threads, so they may block and may use a blocking `Client`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from delayd.client.aio import AsyncClient
from delayd.client.errors import DelaydError
from delayd.client.models import ReceivedMessage
from delayd.client.sync import Client

log = logging.getLogger("delayd.client.consumer")

Handler = Callable[[ReceivedMessage], Any] | Callable[[ReceivedMessage], Awaitable[Any]]
RetryDelay = int | Callable[[int], int | None] | None

ERROR_PAUSE_S = (0.1, 5.0)  # pause after a failed pull, doubled per consecutive failure up to the cap
ACK_BATCH_MAX = 1_000  # receipts an ack or nack request carries at most by default (the broker takes 10,000)


@dataclass
class ConsumerStats:
    received: int = 0
    succeeded: int = 0   # handler returned (ack sent)
    failed: int = 0      # handler raised (nack sent)
    released: int = 0    # pulled after stop() and handed back untouched
    extended: int = 0    # lease extensions granted
    pull_errors: int = 0


@dataclass
class _Lease:
    message: ReceivedMessage
    expires: float  # monotonic


class AsyncConsumer:
    def __init__(self, client: AsyncClient, topic: str, group: str, handler: Handler, *, concurrency: int = 8,
                 lease_ms: int = 30_000, wait_ms: int = 1_000, tags: Iterable[str] | None = None,
                 retry_delay_ms: RetryDelay = None, max_messages: int | None = None,
                 idle_timeout_s: float | None = None, drain_timeout_s: float = 30.0,
                 fields: Iterable[str] | None = None, ack_batch_max: int = ACK_BATCH_MAX) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if not 1 <= ack_batch_max <= 10_000:
            raise ValueError("ack_batch_max must be within 1..10000 (the broker's receipts per request)")
        if lease_ms < 1_000:
            raise ValueError("lease_ms must be >= 1000 (the broker's minimum)")
        self.client = client
        self.topic = topic
        self.group = group
        self.handler = handler
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.tags = None if tags is None else list(tags)
        # Only these fields of each message (pull's `fields`); the attempt always, for retry_delay_ms.
        self.fields = None if fields is None else [*fields, "attempt"]
        self.retry_delay_ms = retry_delay_ms
        self.max_messages = max_messages
        self.idle_timeout_s = idle_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.ack_batch_max = ack_batch_max
        self.stats = ConsumerStats()
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None))  # noqa: B004 - an object with an async __call__
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        self._leases: dict[str, _Lease] = {}
        self._active: set[asyncio.Task[None]] = set()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._task: asyncio.Task[ConsumerStats] | None = None
        # Acks, and nacks by delay, waiting for a request (`_settle`), and the tasks sending them.
        self._waiting: dict[tuple[str, int | None], list[tuple[ReceivedMessage, asyncio.Future[None]]]] = {}
        self._senders: dict[tuple[str, int | None], set[asyncio.Task[None]]] = {}

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Ask the runner to stop (returns at once; `run()` / `join()` end after draining).
        Safe to call from any thread, including a handler's."""
        self._stop_requested = True
        if self._stop is None or self._loop is None:
            return
        try:
            same_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            same_loop = False
        if same_loop:
            self._stop.set()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    def start(self) -> asyncio.Task[ConsumerStats]:
        """Run in the background; `await join()` (or `async with`) to wait for the end."""
        if self._task is None:
            self._task = asyncio.ensure_future(self.run())
        return self._task

    async def join(self) -> ConsumerStats:
        if self._task is None:
            return self.stats
        return await self._task

    async def __aenter__(self) -> AsyncConsumer:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
        await self.join()

    # ------------------------------------------------------------------ main loop

    async def run(self) -> ConsumerStats:
        """Consume until `stop()` (or `max_messages` handled); returns the counters."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested:
            self._stop.set()
        if not self._is_async:
            self._executor = concurrent.futures.ThreadPoolExecutor(self.concurrency,
                                                                   thread_name_prefix="delayd-consumer")
        extender = asyncio.ensure_future(self._extend_leases())
        try:
            await self._pull_loop()
        finally:
            drained = await self._drain()
            senders = {task for tasks in self._senders.values() for task in tasks}
            if senders:  # acks and nacks of handlers the drain cancelled
                await asyncio.wait(senders, timeout=self.drain_timeout_s)
                for task in senders:
                    task.cancel()
            extender.cancel()
            await asyncio.gather(extender, return_exceptions=True)
            if self._executor is not None:
                # Idle workers exit at once; a handler stuck past the drain timeout is not waited for.
                self._executor.shutdown(wait=drained, cancel_futures=True)
                self._executor = None
        return self.stats

    async def _pull_loop(self) -> None:
        assert self._stop is not None
        failures = 0
        last_busy = time.monotonic()
        while not self._stop.is_set():
            budget = self.concurrency - len(self._active)
            if self.max_messages is not None:
                budget = min(budget, self.max_messages - self.stats.received)
                if budget <= 0 and not self._active:
                    return
            if budget <= 0:
                stop_wait = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait({*self._active, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                continue
            pulled_at = time.monotonic()
            try:
                messages = await self.client.pull(self.topic, self.group, max=budget, wait_ms=self.wait_ms,
                                                  lease_ms=self.lease_ms, tags=self.tags, fields=self.fields)
            except DelaydError as e:
                failures += 1
                self.stats.pull_errors += 1
                pause = min(ERROR_PAUSE_S[1], ERROR_PAUSE_S[0] * 2 ** (failures - 1))
                log.warning("pull %s/%s failed (%s); retrying in %.1fs", self.topic, self.group, e, pause)
                try:
                    async with asyncio.timeout(pause):
                        await self._stop.wait()
                except TimeoutError:
                    pass
                continue
            failures = 0
            if self._stop.is_set():
                await self._release(messages)
                return
            if messages or self._active:
                last_busy = time.monotonic()
            elif self.idle_timeout_s is not None and time.monotonic() - last_busy >= self.idle_timeout_s:
                return
            for m in messages:
                self.stats.received += 1
                self._leases[m.receipt] = _Lease(m, pulled_at + self.lease_ms / 1000)
                task = asyncio.ensure_future(self._handle(m))
                self._active.add(task)
                task.add_done_callback(self._active.discard)

    async def _drain(self) -> bool:
        """Wait for running handlers; True when all finished within the drain timeout."""
        if not self._active:
            return True
        done, pending = await asyncio.wait(set(self._active), timeout=self.drain_timeout_s)
        for task in pending:
            task.cancel()  # async handlers stop; a thread cannot be interrupted and its lease lapses
        if pending:
            log.warning("%d handler(s) still running after %.1fs; their messages will be redelivered",
                        len(pending), self.drain_timeout_s)
            await asyncio.gather(*pending, return_exceptions=True)
        return not pending

    async def _release(self, messages: list[ReceivedMessage]) -> None:
        if not messages:
            return
        self.stats.released += len(messages)
        try:
            await self.client.nack(self.topic, self.group, messages, delay_ms=0)
        except DelaydError as e:
            log.warning("could not hand back %d message(s) (%s); they return when the lease ends",
                        len(messages), e)

    # ------------------------------------------------------------------ one message

    async def _handle(self, m: ReceivedMessage) -> None:
        try:
            if self._is_async:
                await self.handler(m)
            else:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._executor, self.handler, m)
        except asyncio.CancelledError:
            self._leases.pop(m.receipt, None)
            raise
        except Exception as e:
            self._leases.pop(m.receipt, None)
            self.stats.failed += 1
            delay = self._retry_delay(m.attempt)
            # WARNING with the traceback: a failing handler is the consumer's bug to see and fix.
            log.warning("handler failed on %s (attempt %d): %r; nack delay_ms=%s", m.id, m.attempt, e, delay,
                        exc_info=True)
            await self._settle("nack", m, delay)
        else:
            self._leases.pop(m.receipt, None)
            self.stats.succeeded += 1
            await self._settle("ack", m, None)

    def _retry_delay(self, attempt: int) -> int | None:
        if self.retry_delay_ms is None or isinstance(self.retry_delay_ms, int):
            return self.retry_delay_ms
        return self.retry_delay_ms(attempt)

    async def _settle(self, action: str, m: ReceivedMessage, delay_ms: int | None) -> None:
        """Ack or nack `m` with whatever others of the same kind wait (nacks: of the same delay);
        returns once the broker has answered (a failure or a stale receipt is logged)."""
        kind = (action, delay_ms)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(kind, [])
        waiting.append((m, done))
        senders = self._senders.setdefault(kind, set())
        # A sender is done once it found nothing waiting, but leaves the set only when its done
        # callback runs: in between, one that counted as busy would leave this entry unsent (and
        # its handler's slot taken for good).
        whole = len(waiting) >= self.ack_batch_max  # a whole batch need not wait
        if whole or all(task.done() for task in senders):
            task = asyncio.ensure_future(self._send(kind))
            senders.add(task)
            task.add_done_callback(senders.discard)
        await done

    async def _send(self, kind: tuple[str, int | None]) -> None:
        """Send what waits of one kind, `ack_batch_max` at a time, until none waits. A handler
        cancelled while it waits (the drain timeout) still has its ack or nack sent."""
        action, delay_ms = kind
        waiting = self._waiting[kind]
        while waiting:
            batch = waiting[:self.ack_batch_max]
            del waiting[:self.ack_batch_max]
            messages = [m for m, _ in batch]
            try:
                if action == "ack":
                    stale = set((await self.client.ack(self.topic, self.group, messages)).stale)
                else:
                    stale = set((await self.client.nack(self.topic, self.group, messages, delay_ms=delay_ms)).stale)
            except DelaydError as e:
                log.warning("%s of %d message(s) (%s, ...) failed (%s); they return when their leases end",
                            action, len(batch), batch[0][0].id, e)
                stale = set()
            except asyncio.CancelledError:
                for _, done in batch + waiting:
                    done.cancel()
                waiting.clear()
                raise
            except Exception as e:  # not an answer of the broker's: each waiting handler raises it
                for _, done in batch:
                    if not done.done():
                        done.set_exception(e)
                continue
            for m, done in batch:
                if m.receipt in stale:
                    log.warning("%s of %s was stale: its lease had expired, so it may be delivered again",
                                action, m.id)
                if not done.done():
                    done.set_result(None)

    async def _extend_leases(self) -> None:
        """Renew leases of slow handlers before half of the lease is gone."""
        half = self.lease_ms / 2000
        tick = max(0.05, min(1.0, self.lease_ms / 8000))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            due = [lease for lease in self._leases.values() if lease.expires - now < half]
            if not due:
                continue
            asked_at = time.monotonic()
            try:
                result = await self.client.extend(self.topic, self.group, [d.message for d in due],
                                                  lease_ms=self.lease_ms)
            except DelaydError as e:
                log.warning("extending %d lease(s) failed: %s", len(due), e)
                continue
            stale = set(result.stale)
            self.stats.extended += result.extended
            for lease in due:
                if lease.message.receipt in stale:
                    self._leases.pop(lease.message.receipt, None)
                    log.warning("lease of %s was lost before it could be extended", lease.message.id)
                else:
                    lease.expires = asked_at + self.lease_ms / 1000


class Consumer:
    """Blocking twin of `AsyncConsumer` on a `Client`'s private loop.

    `run()` blocks until `stop()` is called from another thread (or a handler), `max_messages` is
    reached, or Ctrl-C (which stops gracefully and re-raises). `start()` runs it in the background.
    """

    def __init__(self, client: Client, topic: str, group: str, handler: Handler, **options: Any) -> None:
        self.client = client
        self.aio = AsyncConsumer(client.aio, topic, group, handler, **options)
        self._future: concurrent.futures.Future[ConsumerStats] | None = None

    @property
    def stats(self) -> ConsumerStats:
        return self.aio.stats

    def start(self) -> Consumer:
        if self._future is None:
            self._future = self.client.runner.submit(self.aio.run())
        return self

    def run(self) -> ConsumerStats:
        self.start()
        assert self._future is not None
        try:
            return self._future.result()
        except KeyboardInterrupt:
            self.stop()
            raise

    def stop(self, wait: bool = True, timeout_s: float | None = None) -> ConsumerStats:
        self.aio.stop()
        if wait and self._future is not None:
            return self._future.result(timeout_s)
        return self.aio.stats

    def __enter__(self) -> Consumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
