"""Auto-batching producers: many `send` calls become few `send_batch` requests.

A message waits at most `linger_ms` for companions of the same topic, and a batch leaves as soon as
it holds `max_batch`. At most `max_buffered` messages are accepted but not yet answered; beyond that
`send` waits (async) or blocks (sync) - that bound is the backpressure. Each `send` returns a future
of its own `SendResult`. A batch the broker rejects because of one message (an error with `index`)
fails only that message's future; the rest are sent again. `close()` flushes everything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from delayd.client.aio import AsyncClient
from delayd.client.codec import Body, OutgoingMessage
from delayd.client.errors import DelaydError, InvalidRequest
from delayd.client.models import SendResult
from delayd.client.sync import Client

log = logging.getLogger("delayd.client.producer")

_Pending = tuple[OutgoingMessage, "asyncio.Future[SendResult]"]


class AsyncProducer:
    def __init__(self, client: AsyncClient, *, linger_ms: int = 5, max_batch: int = 500,
                 max_buffered: int = 10_000, max_in_flight: int = 4) -> None:
        if max_batch < 1 or max_buffered < 1 or max_in_flight < 1:
            raise ValueError("max_batch, max_buffered and max_in_flight must be >= 1")
        self.client = client
        self.linger_ms = linger_ms
        self.max_batch = min(max_batch, 10_000)
        self.max_buffered = max_buffered
        self._queues: dict[str, list[_Pending]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._outstanding = 0  # accepted, not yet answered
        self._space = asyncio.Condition()
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._closed = False
        self.batches_sent = 0

    @property
    def outstanding(self) -> int:
        return self._outstanding

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(self, topic: str, body: Body, *, delay_ms: int | float | timedelta | None = None,
                   deliver_at: int | float | datetime | None = None, key: str | None = None,
                   tag: str | None = None, headers: Mapping[str, str] | None = None,
                   replace: bool = False) -> asyncio.Future[SendResult]:
        """Queue one message; waits while the buffer is full. Await the returned future for the result."""
        if self._closed:
            raise RuntimeError("producer is closed")
        msg = OutgoingMessage(body, delay_ms, deliver_at, key, tag, headers, replace)
        msg.to_wire(self.client.encoding)  # bad input fails here, not later in somebody else's batch
        async with self._space:
            await self._space.wait_for(lambda: self._outstanding < self.max_buffered)
            self._outstanding += 1
        if self._closed:
            self._outstanding -= 1
            raise RuntimeError("producer is closed")
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(topic, [])
        queue.append((msg, future))
        if len(queue) >= self.max_batch:
            self._dispatch(topic)
        elif topic not in self._timers:
            self._timers[topic] = asyncio.get_running_loop().call_later(
                self.linger_ms / 1000, self._dispatch, topic)
        return future

    def _dispatch(self, topic: str) -> None:
        """Send what is queued for `topic` now: full batches, and the remainder too."""
        timer = self._timers.pop(topic, None)
        if timer is not None:
            timer.cancel()
        queue = self._queues.pop(topic, [])
        for at in range(0, len(queue), self.max_batch):
            task = asyncio.ensure_future(self._send(topic, queue[at:at + self.max_batch]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, topic: str, batch: list[_Pending]) -> None:
        try:
            async with self._in_flight:
                await self._send_until_settled(topic, batch)
        finally:
            for _, future in batch:
                if not future.done():  # cancelled mid-flight (loop shutting down)
                    future.cancel()
            async with self._space:
                self._outstanding -= len(batch)
                self._space.notify_all()

    async def _send_until_settled(self, topic: str, batch: list[_Pending]) -> None:
        remaining = batch
        while remaining:
            self.batches_sent += 1
            try:
                results = await self.client.send_batch(topic, [m for m, _ in remaining])
            except DelaydError as e:
                partial = getattr(e, "partial", None) or [None] * len(remaining)
                unsent: list[_Pending] = []
                for pending, result in zip(remaining, partial, strict=True):
                    if result is not None:
                        _resolve(pending[1], result)
                    else:
                        unsent.append(pending)
                culprit = remaining[e.index] if isinstance(e, InvalidRequest) and e.index is not None \
                    and 0 <= e.index < len(remaining) and partial[e.index] is None else None
                if culprit is None:
                    for _, future in unsent:
                        _fail(future, e)
                    return
                _fail(culprit[1], e)
                remaining = [p for p in unsent if p is not culprit]
                log.debug("batch of %d to %s rejected message %d (%s); resending the rest",
                          len(partial), topic, e.index, e.code)
                continue
            except Exception as e:  # a bug or cancellation must not leave futures hanging
                for _, future in remaining:
                    _fail(future, e)
                raise
            for (_, future), result in zip(remaining, results, strict=True):
                _resolve(future, result)
            return

    async def flush(self) -> None:
        """Send everything queued and wait until every accepted message has an answer."""
        while self._queues or self._tasks:
            for topic in list(self._queues):
                self._dispatch(topic)
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Refuse new messages, flush the rest. Idempotent."""
        self._closed = True
        await self.flush()


def _resolve(future: asyncio.Future[SendResult], result: SendResult) -> None:
    if not future.done():  # the caller may have cancelled its future; the message is stored anyway
        future.set_result(result)


def _fail(future: asyncio.Future[SendResult], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class Producer:
    """Blocking twin of `AsyncProducer`, running on a `Client`'s private loop. `send` returns a
    `concurrent.futures.Future[SendResult]` and blocks while the buffer is full."""

    def __init__(self, client: Client, *, linger_ms: int = 5, max_batch: int = 500,
                 max_buffered: int = 10_000, max_in_flight: int = 4) -> None:
        self.client = client
        self.aio = AsyncProducer(client.aio, linger_ms=linger_ms, max_batch=max_batch,
                                 max_buffered=max_buffered, max_in_flight=max_in_flight)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, topic: str, body: Body, **options: Any) -> concurrent.futures.Future[SendResult]:
        async def enqueue() -> concurrent.futures.Future[SendResult]:
            outer: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
            inner = await self.aio.send(topic, body, **options)

            def copy(done: asyncio.Future[SendResult]) -> None:
                if outer.cancelled():
                    return
                if done.cancelled():
                    outer.cancel()
                elif done.exception() is not None:
                    outer.set_exception(done.exception())
                else:
                    outer.set_result(done.result())
            inner.add_done_callback(copy)
            return outer
        return self.client.runner.run(enqueue())

    def flush(self) -> None:
        self.client.runner.run(self.aio.flush())

    def close(self) -> None:
        if not self.client.closed:
            self.client.runner.run(self.aio.close())
