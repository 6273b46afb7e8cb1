"""Consumer runners against the fake broker: ack/nack, dead letters, concurrency, lease extension, stop."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from delayd.client import AsyncClient, AsyncConsumer, Client, Consumer, ReceivedMessage

from tests.client.fakebroker import FakeBroker, Reply, Seen
from tests.client.helpers import until


async def test_failing_handler_ends_in_dead_letters(fake: FakeBroker) -> None:
    seen: list[tuple[str, int]] = []

    async def handler(m: ReceivedMessage) -> None:
        seen.append((m.text, m.attempt))
        if m.text == "bad":
            raise ValueError("cannot process")

    async with AsyncClient(fake.url) as c:
        await c.subscribe("jobs", "workers", max_attempts=3)
        await c.send_batch("jobs", [{"body": "good"}, {"body": "bad"}, {"body": "fine"}])
        consumer = AsyncConsumer(c, "jobs", "workers", handler, concurrency=2, wait_ms=200,
                                 retry_delay_ms=lambda attempt: 10 * attempt)
        async with consumer:
            await until(lambda: consumer.stats.failed == 3, what="three failures")
            dead = await c.dead("jobs", "workers")
        assert [(d.body, d.attempt) for d in dead] == [(b"bad", 3)]
        assert consumer.stats.succeeded == 2 and consumer.stats.failed == 3
        assert sorted(a for t, a in seen if t == "bad") == [1, 2, 3]
        assert fake.groups[("jobs", "workers")].acked == {"d-1", "d-3"}


async def test_handler_failures_are_logged_at_warning_with_the_traceback(
        fake: FakeBroker, caplog: pytest.LogCaptureFixture) -> None:
    def broken_handler(m: ReceivedMessage) -> None:
        raise KeyError("order-42 not in the database")

    async with AsyncClient(fake.url) as c:
        await c.send("jobs-log", "x")
        consumer = AsyncConsumer(c, "jobs-log", "w", broken_handler, wait_ms=100, retry_delay_ms=60_000)
        with caplog.at_level("WARNING", logger="delayd.client.consumer"):
            async with consumer:
                await until(lambda: consumer.stats.failed == 1, what="one failure")
    (record,) = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert record.levelname == "WARNING" and record.exc_info is not None
    assert "order-42 not in the database" in caplog.text and "broken_handler" in caplog.text, "the traceback"


async def test_concurrency_is_bounded(fake: FakeBroker) -> None:
    running = 0
    peak = 0
    release = asyncio.Event()

    async def handler(m: ReceivedMessage) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    async with AsyncClient(fake.url) as c:
        await c.send_batch("t", [{"body": str(i)} for i in range(10)])
        consumer = AsyncConsumer(c, "t", "g", handler, concurrency=4, wait_ms=100)
        consumer.start()
        await until(lambda: running == 4, what="4 handlers running")
        pulls = sum(r.path.endswith("/pull") for r in fake.requests)
        assert sum(len(g.leases) for g in fake.groups.values()) == 4  # no prefetch beyond free slots
        release.set()
        await until(lambda: consumer.stats.succeeded == 10, what="all handled")
        consumer.stop()
        stats = await consumer.join()
    assert peak == 4 and stats.received == 10 and pulls >= 1


def _ack_sizes(fake: FakeBroker) -> list[int]:
    return [len(r.body["receipts"]) for r in fake.requests if r.path.endswith("/ack")]


async def test_acks_that_come_while_one_is_on_its_way_go_together(fake: FakeBroker) -> None:
    """The first ack goes alone, at once; the nine that finish while it is held by the broker go in
    one request after it (one request a message without the coalescing)."""
    finish = {str(i): asyncio.Event() for i in range(10)}
    held = threading.Event()

    async def handler(m: ReceivedMessage) -> None:
        await finish[m.text].wait()

    def hold_the_first_ack(seen: Seen) -> Reply:
        assert seen.path.endswith("/ack"), seen.path
        return Reply(200, {"acked": len(seen.body["receipts"]), "stale": []}, hold=held)

    async with AsyncClient(fake.url) as c:
        await c.send_batch("t", [{"body": str(i)} for i in range(10)])
        consumer = AsyncConsumer(c, "t", "g", handler, concurrency=10, wait_ms=100)
        consumer.start()
        await until(lambda: consumer.stats.received == 10 and len(consumer._active) == 10, what="10 running")
        fake.script.append(hold_the_first_ack)
        finish["0"].set()
        await until(lambda: _ack_sizes(fake) == [1], what="the first ack on its way")
        for e in finish.values():
            e.set()
        await until(lambda: consumer.stats.succeeded == 10, what="all handled")
        await asyncio.sleep(0.05)  # room for acks that should not come on their own
        assert _ack_sizes(fake) == [1], "nothing more goes out while the first is held"
        held.set()
        await until(lambda: len(fake.groups[("t", "g")].acked) == 9, what="the other nine acked")
        consumer.stop()
        await consumer.join()
    assert _ack_sizes(fake) == [1, 9]


async def test_ack_batch_max_bounds_each_ack(fake: FakeBroker) -> None:
    go = asyncio.Event()

    async def handler(m: ReceivedMessage) -> None:
        await go.wait()

    async with AsyncClient(fake.url) as c:
        await c.send_batch("t", [{"body": str(i)} for i in range(50)])
        consumer = AsyncConsumer(c, "t", "g", handler, concurrency=50, wait_ms=100, ack_batch_max=20)
        consumer.start()
        await until(lambda: len(consumer._active) == 50, what="50 running")
        go.set()
        await until(lambda: len(fake.groups[("t", "g")].acked) == 50, what="all acked")
        consumer.stop()
        await consumer.join()
    sizes = _ack_sizes(fake)
    assert sum(sizes) == 50 and max(sizes) <= 20 and len(sizes) >= 3, sizes


async def test_nacks_of_one_delay_go_together(fake: FakeBroker) -> None:
    go = asyncio.Event()

    async def handler(m: ReceivedMessage) -> None:
        await go.wait()
        raise RuntimeError("downstream is down")

    async with AsyncClient(fake.url) as c:
        await c.send_batch("t", [{"body": str(i)} for i in range(10)])
        consumer = AsyncConsumer(c, "t", "g", handler, concurrency=10, wait_ms=100, retry_delay_ms=60_000)
        consumer.start()
        await until(lambda: len(consumer._active) == 10, what="10 running")
        go.set()
        await until(lambda: consumer.stats.failed == 10 and not consumer._active, what="all failed")
        consumer.stop()
        await consumer.join()
    nacks = [r.body for r in fake.requests if r.path.endswith("/nack")]
    assert sum(len(b["receipts"]) for b in nacks) == 10 and len(nacks) <= 2, nacks
    assert all(b["delay_ms"] == 60_000 for b in nacks)
    later = fake.groups[("t", "g")].available_at.values()
    assert len(later) == 10 and min(later) > time.time() * 1000 + 50_000, "each nacked with its delay"


async def test_a_failed_ack_is_logged_once_for_its_batch(
        fake: FakeBroker, caplog: pytest.LogCaptureFixture) -> None:
    go = asyncio.Event()

    async def handler(m: ReceivedMessage) -> None:
        await go.wait()

    async with AsyncClient(fake.url) as c:
        await c.send_batch("t", [{"body": str(i)} for i in range(5)])
        consumer = AsyncConsumer(c, "t", "g", handler, concurrency=5, wait_ms=100)
        consumer.start()
        await until(lambda: len(consumer._active) == 5, what="5 running")
        fake.script.append(Reply(400, {"error": {"code": "invalid_parameter", "message": "no"}}))
        with caplog.at_level("WARNING", logger="delayd.client.consumer"):
            go.set()
            await until(lambda: consumer.stats.succeeded == 5 and not consumer._active, what="all handled")
        consumer.stop()
        await consumer.join()
    assert _ack_sizes(fake) == [5] and not fake.groups[("t", "g")].acked
    (record,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert "ack of 5 message(s)" in record.getMessage() and "invalid_parameter" in record.getMessage()


async def test_slow_handler_keeps_its_lease(fake: FakeBroker) -> None:
    async with AsyncClient(fake.url) as c:
        await c.send("slow", "x")
        consumer: AsyncConsumer

        async def handler(m: ReceivedMessage) -> None:
            # Work until the lease has been extended twice - well past the 1 s lease it started with.
            await until(lambda: consumer.stats.extended >= 2, timeout_s=10, what="extensions")

        consumer = AsyncConsumer(c, "slow", "g", handler, lease_ms=1_000, wait_ms=100)
        async with consumer:
            await until(lambda: consumer.stats.succeeded == 1, what="ack")
    group = fake.groups[("slow", "g")]
    assert group.acked == {"d-1"} and group.attempts["d-1"] == 1  # never redelivered


async def test_stop_lets_running_handlers_finish(fake: FakeBroker) -> None:
    started = asyncio.Event()
    finish = asyncio.Event()

    async def handler(m: ReceivedMessage) -> None:
        started.set()
        await finish.wait()

    async with AsyncClient(fake.url) as c:
        await c.send("t", "x")
        consumer = AsyncConsumer(c, "t", "g", handler, wait_ms=100)
        consumer.start()
        await asyncio.wait_for(started.wait(), 5)
        consumer.stop()
        join = asyncio.ensure_future(consumer.join())
        done, _ = await asyncio.wait({join}, timeout=0.1)
        assert not done  # waiting for the running handler
        finish.set()
        stats = await asyncio.wait_for(join, 5)
    assert stats.succeeded == 1 and fake.groups[("t", "g")].acked == {"d-1"}


async def test_idle_timeout_and_max_messages(fake: FakeBroker) -> None:
    async def handler(m: ReceivedMessage) -> None:
        return None

    async with AsyncClient(fake.url) as c:
        await c.send_batch("t", [{"body": str(i)} for i in range(5)])
        stats = await asyncio.wait_for(AsyncConsumer(c, "t", "g", handler, max_messages=3, wait_ms=50).run(), 5)
        assert stats.received == 3 and stats.succeeded == 3
        stats = await asyncio.wait_for(
            AsyncConsumer(c, "t", "g", handler, idle_timeout_s=0.2, wait_ms=50).run(), 5)
        assert stats.received == 2


async def test_an_ack_made_right_after_the_sender_finished_is_sent() -> None:
    """A handler that settles after the ack sender found nothing more to send, but before the
    sender's done callback took it out of its set, gets a sender of its own. It waited forever
    (and its slot with it: test_sync_consumer_with_blocking_handler hung once under load)."""
    sent: list[list[str]] = []

    class InstantClient:  # answers without suspending, as a broker that is quick enough can
        async def ack(self, topic: str, group: str, messages: list[SimpleNamespace]) -> SimpleNamespace:
            sent.append([m.receipt for m in messages])
            return SimpleNamespace(stale=[])

    consumer = AsyncConsumer(InstantClient(), "t", "g", lambda m: None)  # type: ignore[arg-type]
    m1, m2 = (SimpleNamespace(id=str(i), receipt=f"r{i}") for i in (1, 2))

    async def second() -> None:
        await asyncio.sleep(0)  # runs right after the sender ends, its done callback still queued
        await consumer._settle("ack", m2, None)  # type: ignore[arg-type]

    await asyncio.wait_for(asyncio.gather(consumer._settle("ack", m1, None), second()), 5)  # type: ignore[arg-type]
    assert sent == [["r1"], ["r2"]]


def test_sync_consumer_with_blocking_handler(fake: FakeBroker, no_thread_leak: None) -> None:
    threads: set[str] = set()

    def handler(m: ReceivedMessage) -> None:
        threads.add(threading.current_thread().name)
        if m.text == "boom" and m.attempt == 1:
            raise RuntimeError("first try fails")

    with Client(fake.url) as c:
        c.send_batch("t", [{"body": "a"}, {"body": "boom"}, {"body": "b"}])
        stats = Consumer(c, "t", "g", handler, concurrency=2, wait_ms=100, retry_delay_ms=0,
                         max_messages=4).run()
    assert (stats.received, stats.succeeded, stats.failed) == (4, 3, 1)
    assert all(n.startswith("delayd-consumer") for n in threads)


def test_sync_consumer_stopped_from_a_handler(fake: FakeBroker, no_thread_leak: None) -> None:
    with Client(fake.url) as c:
        c.send("t", "stop")
        consumer: Consumer

        def handler(m: ReceivedMessage) -> None:
            consumer.stop(wait=False)

        consumer = Consumer(c, "t", "g", handler, wait_ms=100)
        stats = consumer.run()
    assert stats.succeeded == 1


def test_bad_options() -> None:
    with pytest.raises(ValueError):
        AsyncConsumer(AsyncClient(), "t", "g", print, concurrency=0)
    with pytest.raises(ValueError):
        AsyncConsumer(AsyncClient(), "t", "g", print, lease_ms=10)
    for bad in (0, 10_001):
        with pytest.raises(ValueError, match="ack_batch_max"):
            AsyncConsumer(AsyncClient(), "t", "g", print, ack_batch_max=bad)
