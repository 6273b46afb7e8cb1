"""`Client`: the blocking twin of `AsyncClient`.

It owns a private event loop running in one daemon thread and forwards every call to an
`AsyncClient` on that loop, so both clients behave identically (retries, sharding, encoding). The
thread is started by the constructor and joined by `close()` (or `with Client(...)`); a client that
is garbage-collected without `close()` is shut down by a finalizer, so no thread outlives it.
A `Client` may be shared by several threads.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import Coroutine, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from delayd.client.aio import DEFAULT_URL, AsyncClient, Push, Receipts, Urls
from delayd.client.codec import Body, Encoding, OutgoingMessage
from delayd.client.http import RetryPolicy, TlsOption
from delayd.client.listing import SyncListing
from delayd.client.models import (
    AckResult,
    CancelResult,
    DeadLetter,
    ExtendResult,
    Message,
    NackResult,
    NodeInfo,
    ReceivedMessage,
    RedriveResult,
    ScheduleBucket,
    SendResult,
    Stats,
    Subscription,
    SubscriptionStatus,
)
from delayd.client.ring import DEFAULT_VNODES

T = TypeVar("T")
_thread_numbers = itertools.count(1)


class LoopThread:
    """An event loop running forever in its own daemon thread, until `stop()`."""

    def __init__(self, name: str = "delayd-client") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=f"{name}-{next(_thread_numbers)}", daemon=True)
        self._stopped = False
        self._lock = threading.Lock()
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the loop and block until it is done (cancelling it if interrupted)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking Client call was made from the client's own event loop thread; "
                               "use AsyncClient there")
        if self._stopped:
            coro.close()
            raise RuntimeError("client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except BaseException:
            future.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> Any:
        """Schedule `coro` without waiting; returns a `concurrent.futures.Future`."""
        if self._stopped:
            coro.close()
            raise RuntimeError("client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        """Cancel what is left on the loop, stop it, join the thread. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if threading.current_thread() is self._thread:
            self.loop.stop()  # cannot join ourselves; the loop ends after this callback
            return
        asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _cancel_all() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _shutdown(runner: LoopThread, aio: AsyncClient) -> None:
    try:
        if not runner._stopped:
            runner.run(aio.close())
    finally:
        runner.stop()


class Client(SyncListing):
    """Blocking delayd client; same arguments and methods as `AsyncClient` (see its docstring for
    sharding, `tls`, and the retry rule: produce is retried only when every message has a `key`).

        with Client("http://127.0.0.1:7070") as c:
            c.send("orders", b"close order 42", delay_ms=1_800_000, key="order-42")
    """

    def __init__(self, url: Urls = DEFAULT_URL, token: str | None = None, *, encoding: str | Encoding = "msgpack",
                 timeout_s: float = 30.0, retry: RetryPolicy | None = None, vnodes: int = DEFAULT_VNODES,
                 tls: TlsOption = None) -> None:
        self.aio = AsyncClient(url, token, encoding=encoding, timeout_s=timeout_s, retry=retry, vnodes=vnodes,
                               tls=tls)
        self.runner = LoopThread()
        self._finalizer = weakref.finalize(self, _shutdown, self.runner, self.aio)

    def __enter__(self) -> Client:
        """`with Client(...) as c:` closes the client at the end of the block."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the client (see `close`)."""
        self.close()

    def close(self) -> None:
        """Close connections and join the private thread. Idempotent."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        """True once `close()` ran."""
        return not self._finalizer.alive

    @property
    def urls(self) -> list[str]:
        """The broker base URLs this client talks to, in the order given."""
        return self.aio.urls

    @property
    def shards(self) -> dict[str, list[str]]:
        """Each shard's member URLs by shard name, once known (see `AsyncClient.shards`)."""
        return self.aio.shards

    @property
    def primaries(self) -> dict[str, str | None]:
        """The primary each shard's requests go to now (see `AsyncClient.primaries`)."""
        return self.aio.primaries

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def send(self, topic: str, body: Body, *, delay_ms: int | float | timedelta | None = None,
             deliver_at: int | float | datetime | None = None, key: str | None = None, tag: str | None = None,
             headers: Mapping[str, str] | None = None, replace: bool = False) -> SendResult:
        """Produce one message, due after `delay_ms`, at `deliver_at` (epoch ms or an aware
        `datetime`), or now. A `key` makes it idempotent; `replace=True` reschedules the pending
        message with that key instead."""
        return self._run(self.aio.send(topic, body, delay_ms=delay_ms, deliver_at=deliver_at, key=key, tag=tag,
                                       headers=headers, replace=replace))

    def send_batch(self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]) -> list[SendResult]:
        """Produce many messages (all-or-nothing per broker request); results in the same order."""
        return self._run(self.aio.send_batch(topic, list(messages)))

    def cancel(self, id: str) -> CancelResult:
        """Cancel a pending message. Idempotent; raises `AlreadyDelivered` (409) or `NotFound`."""
        return self._run(self.aio.cancel(id))

    def cancel_key(self, topic: str, key: str) -> CancelResult:
        """Cancel the pending message of `topic` that has `key`."""
        return self._run(self.aio.cancel_key(topic, key))

    def get(self, id: str) -> Message:
        """A message by id, with its state (scheduled, delivered, cancelled); `NotFound` if none."""
        return self._run(self.aio.get(id))

    def get_key(self, topic: str, key: str) -> Message:
        """The pending message of `topic` that has `key`."""
        return self._run(self.aio.get_key(topic, key))

    def subscribe(self, topic: str, group: str, start: str | None = None,
                  max_attempts: int | None = None, push: Push = None) -> Subscription:
        """Create or update a subscription group; `start` is "earliest" or "latest"; `push` makes it a
        push subscription (PushSettings or a dict), False turns it back into pull (docs/push.md)."""
        return self._run(self.aio.subscribe(topic, group, start, max_attempts, push))

    def get_subscription(self, topic: str, group: str) -> SubscriptionStatus:
        """A group's settings and counts; `NotFound` if it does not exist (looking never creates it)."""
        return self._run(self.aio.get_subscription(topic, group))

    def delete_subscription(self, topic: str, group: str) -> None:
        """Delete a group with its position, leases and dead letters (admin right); `NotFound` if none."""
        return self._run(self.aio.delete_subscription(topic, group))

    def pull(self, topic: str, group: str, max: int = 100, wait_ms: int | timedelta = 0,
             lease_ms: int | timedelta = 30_000, tags: Iterable[str] | None = None,
             fields: Iterable[str] | None = None) -> list[ReceivedMessage]:
        """Lease up to `max` due messages, waiting up to `wait_ms` for the first one. `fields`:
        only these are sent (with id, receipt and deliver_at; the others keep their defaults)."""
        return self._run(self.aio.pull(topic, group, max, wait_ms, lease_ms, tags, fields))

    def ack(self, topic: str, group: str, receipts: Receipts) -> AckResult:
        """Acknowledge messages (receipts, or the `ReceivedMessage`s themselves)."""
        return self._run(self.aio.ack(topic, group, receipts))

    def nack(self, topic: str, group: str, receipts: Receipts, delay_ms: int | timedelta | None = None
             ) -> NackResult:
        """Hand messages back for redelivery after `delay_ms` (default: the broker's backoff)."""
        return self._run(self.aio.nack(topic, group, receipts, delay_ms))

    def extend(self, topic: str, group: str, receipts: Receipts, lease_ms: int | timedelta = 30_000
               ) -> ExtendResult:
        """Renew leases to `lease_ms` from now."""
        return self._run(self.aio.extend(topic, group, receipts, lease_ms))

    def dead(self, topic: str, group: str, limit: int = 100) -> list[DeadLetter]:
        """Dead letters of a group (at most `limit`, over all shards)."""
        return self._run(self.aio.dead(topic, group, limit))

    def redrive(self, topic: str, group: str, ids: Iterable[str] | None = None) -> RedriveResult:
        """Re-queue dead letters (the given ids, or all of them)."""
        return self._run(self.aio.redrive(topic, group, None if ids is None else list(ids)))

    def stats(self) -> Stats:
        """`GET /v1/stats` of every shard, merged (counts summed; each shard in `.shards`)."""
        return self._run(self.aio.stats())

    def schedule(self, from_ms: int | datetime, to_ms: int | datetime, step_ms: int | timedelta
                 ) -> list[ScheduleBucket]:
        """How many pending messages fall due in each `step_ms` bucket of [from_ms, to_ms)."""
        return self._run(self.aio.schedule(from_ms, to_ms, step_ms))

    def info(self) -> list[NodeInfo]:
        """`GET /v1/info` of every URL given (node id, version; role and primary of a replica), in
        URL order."""
        return self._run(self.aio.info())

    def cluster(self) -> dict[str, dict[str, Any]]:
        """`GET /v1/cluster` of every shard, by shard name (see `AsyncClient.cluster`)."""
        return self._run(self.aio.cluster())
