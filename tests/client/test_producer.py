"""Auto-batching producers: batching by linger and size, backpressure, per-message failures, flush."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from delayd.client import AsyncClient, AsyncProducer, Client, InvalidMessage, Producer, Unavailable

from tests.client.fakebroker import FakeBroker, Reply
from tests.client.helpers import FAST_RETRY


def batch_sizes(fake: FakeBroker) -> list[int]:
    return [len(r.body["messages"]) for r in fake.requests if r.path.endswith("/messages")]


async def test_messages_sent_together_share_a_request(fake: FakeBroker) -> None:
    async with AsyncClient(fake.url) as c:
        async with AsyncProducer(c, linger_ms=50, max_batch=100) as p:
            futures = [await p.send("t", f"m{i}", key=f"k{i}") for i in range(250)]
            results = await asyncio.gather(*futures)
    assert batch_sizes(fake) == [100, 100, 50]
    assert [r.id for r in results] == [f"d-{i}" for i in range(1, 251)]  # each future has its own result


async def test_linger_bounds_the_wait_of_a_lone_message(fake: FakeBroker) -> None:
    async with AsyncClient(fake.url) as c:
        p = AsyncProducer(c, linger_ms=30, max_batch=1000)
        started = time.monotonic()
        result = await (await p.send("t", "alone"))
        assert 0.025 <= time.monotonic() - started < 2
        assert result.id == "d-1"
        await p.close()
        with pytest.raises(RuntimeError):
            await p.send("t", "late")


async def test_topics_are_batched_separately(fake: FakeBroker) -> None:
    async with AsyncClient(fake.url) as c, AsyncProducer(c, linger_ms=20) as p:
        fs = [await p.send(t, "x") for t in ("a", "b", "a", "b", "a")]
    assert sorted(batch_sizes(fake)) == [2, 3]
    assert all(f.done() for f in fs)


async def test_send_waits_while_the_buffer_is_full(fake: FakeBroker) -> None:
    gate = threading.Event()
    held = {"messages": [{"id": "d-100", "deliver_at": 1, "duplicate": False},
                         {"id": "d-101", "deliver_at": 1, "duplicate": False}]}
    fake.script.append(Reply(200, held, hold=gate))  # the first batch hangs until the gate opens
    async with AsyncClient(fake.url) as c:
        p = AsyncProducer(c, linger_ms=1, max_batch=2, max_buffered=4, max_in_flight=1)
        first = [await p.send("t", f"m{i}", key=f"k{i}") for i in range(4)]  # fills the buffer
        assert p.outstanding == 4
        fifth = asyncio.ensure_future(p.send("t", "m4", key="k4"))
        # Nothing can free space while the gate is shut; give the producer every chance to misbehave.
        done, _ = await asyncio.wait({fifth}, timeout=0.1)
        assert not done
        gate.set()
        f5 = await asyncio.wait_for(fifth, 5)
        await p.close()
        assert [f.result().id for f in first] == ["d-100", "d-101", "d-1", "d-2"]
        assert (await f5).id == "d-3"
        assert p.outstanding == 0


async def test_one_bad_message_fails_alone(fake: FakeBroker) -> None:
    async with AsyncClient(fake.url) as c, AsyncProducer(c, linger_ms=20) as p:
        fs = [await p.send("t", f"m{i}", tag="poison" if i == 2 else None) for i in range(5)]
        await p.flush()
    assert isinstance(fs[2].exception(), InvalidMessage)
    assert [f.result().id for i, f in enumerate(fs) if i != 2] == ["d-1", "d-2", "d-3", "d-4"]
    assert batch_sizes(fake) == [5, 4]


async def test_a_failed_batch_fails_every_future(fake: FakeBroker) -> None:
    fake.script.append(Reply(503, {"error": {"code": "unavailable", "message": "down"}}))
    async with AsyncClient(fake.url, retry=FAST_RETRY) as c, AsyncProducer(c, linger_ms=5) as p:
        fs = [await p.send("t", "x") for _ in range(3)]  # unkeyed: a 503 is not retried
        await p.flush()
    assert all(isinstance(f.exception(), Unavailable) for f in fs)


async def test_bad_input_is_refused_at_send(fake: FakeBroker) -> None:
    async with AsyncClient(fake.url) as c, AsyncProducer(c) as p:
        with pytest.raises(ValueError):
            await p.send("t", "x", delay_ms=1, deliver_at=5)
        assert p.outstanding == 0


def test_sync_producer(fake: FakeBroker, no_thread_leak: None) -> None:
    with Client(fake.url) as c:
        # A linger longer than the test: only a full batch and close() send (a short linger also
        # sent whenever the sending thread was descheduled for that long on a busy machine).
        with Producer(c, linger_ms=60_000, max_batch=50) as p:
            futures = [p.send("t", f"m{i}") for i in range(120)]
        assert all(f.done() for f in futures)  # close() flushed
        assert len({f.result().id for f in futures}) == 120
    assert batch_sizes(fake) == [50, 50, 20]


def test_sync_producer_blocks_when_full(fake: FakeBroker, no_thread_leak: None) -> None:
    gate = threading.Event()
    fake.script.append(lambda seen: Reply(200, {"messages": [{"id": "d-9", "deliver_at": 1, "duplicate": False}]},
                                          hold=gate))
    with Client(fake.url) as c, Producer(c, linger_ms=1, max_batch=1, max_buffered=1, max_in_flight=1) as p:
        first = p.send("t", "a")
        returned = threading.Event()

        def second() -> None:
            p.send("t", "b")
            returned.set()
        t = threading.Thread(target=second)
        t.start()
        assert not returned.wait(0.1)  # blocked behind the held first batch
        gate.set()
        assert returned.wait(5)
        t.join()
        assert first.result(5).id == "d-9"
