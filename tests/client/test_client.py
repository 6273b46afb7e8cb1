"""Every client method, on both clients and both encodings, against the in-memory fake broker."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from delayd.client import (
    AlreadyDelivered,
    AsyncClient,
    Client,
    InvalidMessage,
    MessageState,
    NotFound,
    OutgoingMessage,
)

from tests.client.fakebroker import FakeBroker
from tests.client.helpers import Either


@pytest.fixture(params=[("async", "msgpack"), ("async", "json"), ("sync", "msgpack"), ("sync", "json")],
                ids=lambda p: "-".join(p))
async def c(request: pytest.FixtureRequest, fake: FakeBroker) -> AsyncIterator[Either]:
    either = Either(request.param[0], fake.url, request.param[1])
    yield either
    await either.close()


async def test_send_get_cancel(c: Either) -> None:
    due = datetime.now(UTC) + timedelta(hours=1)
    r = await c("send", "orders", "héllo", deliver_at=due, key="o-1", tag="t", headers={"h": "v"})
    assert r.id.startswith("d-") and not r.duplicate
    assert r.deliver_at == int(due.timestamp() * 1000) and r.deliver_at_dt == due.replace(
        microsecond=due.microsecond // 1000 * 1000)
    m = await c("get", r.id)
    assert (m.topic, m.key, m.tag, m.headers, m.text, m.state) == ("orders", "o-1", "t", {"h": "v"}, "héllo",
                                                                   MessageState.SCHEDULED)
    assert (await c("get_key", "orders", "o-1")).id == r.id
    dup = await c("send", "orders", "again", delay_ms=5, key="o-1")
    assert dup.duplicate and dup.id == r.id and dup.deliver_at == r.deliver_at
    assert (await c("cancel", r.id)).state == "cancelled"
    assert (await c("cancel", r.id)).state == "cancelled"  # idempotent
    assert (await c("get", r.id)).state == MessageState.CANCELLED
    with pytest.raises(NotFound):
        await c("cancel_key", "orders", "o-1")
    with pytest.raises(NotFound):
        await c("get", "d-999")


async def test_replace_and_cancel_by_key(c: Either) -> None:
    first = await c("send", "orders", b"\xff\x00", delay_ms=timedelta(minutes=5), key="k")
    second = await c("send", "orders", b"\xfe", delay_ms=60_000, key="k", replace=True)
    assert second.id != first.id and not second.duplicate
    assert (await c("get", first.id)).state == "cancelled"
    assert (await c("get_key", "orders", "k")).body == b"\xfe"
    assert (await c("cancel_key", "orders", "k")).id == second.id


async def test_batch_results_in_order_and_error_index(c: Either) -> None:
    results = await c("send_batch", "t", [{"body": "a"}, OutgoingMessage("b", key="kb"), {"body": "c", "key": "kb"}])
    assert [r.duplicate for r in results] == [False, False, True] and results[1].id == results[2].id
    with pytest.raises(InvalidMessage) as info:
        await c("send_batch", "t", [{"body": "ok"}, {"body": "bad", "tag": "poison"}])
    assert info.value.index == 1 and info.value.status == 400
    with pytest.raises(InvalidMessage) as local:
        await c("send_batch", "t", [{"body": "ok"}, {"body": "x", "delay_ms": 1, "deliver_at": 2}])
    assert local.value.index == 1  # caught before anything was sent
    assert await c("send_batch", "t", []) == []


async def test_consume_cycle(c: Either) -> None:
    sub = await c("subscribe", "jobs", "g", start="earliest", max_attempts=2)
    assert (sub.topic, sub.group, sub.start, sub.max_attempts) == ("jobs", "g", "earliest", 2)
    sent = await c("send_batch", "jobs", [{"body": f"m{i}", "tag": "a" if i % 2 else "b"} for i in range(4)])
    assert await c("pull", "jobs", "g", max=10, tags=["zzz"]) == []
    got = await c("pull", "jobs", "g", max=3, lease_ms=5_000, tags=["a", "b"])
    assert len(got) == 3 and all(m.attempt == 1 and m.group == "g" for m in got)
    assert {m.id for m in got} <= {r.id for r in sent}
    rest = await c("pull", "jobs", "g", max=10)
    assert len(rest) == 1
    ack = await c("ack", "jobs", "g", got[0])
    assert (ack.acked, ack.stale) == (1, [])
    again = await c("ack", "jobs", "g", [got[0].receipt, "d-1.999"])
    assert again.acked == 0 and set(again.stale) == {got[0].receipt, "d-1.999"}
    ext = await c("extend", "jobs", "g", got[1:], lease_ms=timedelta(seconds=10))
    assert ext.extended == 2
    nack = await c("nack", "jobs", "g", got[1], delay_ms=0)
    assert nack.nacked == 1
    redelivered = await c("pull", "jobs", "g", max=10, wait_ms=2_000)
    assert [(m.id, m.attempt) for m in redelivered] == [(got[1].id, 2)]
    await c("nack", "jobs", "g", redelivered[0], delay_ms=0)  # attempt 2 of 2: dead
    dead = await c("dead", "jobs", "g", limit=10)
    assert [(d.id, d.attempt, d.body) for d in dead] == [(got[1].id, 2, got[1].body)]
    assert (await c("redrive", "jobs", "g")).redriven == 1
    assert await c("dead", "jobs", "g") == []
    back = await c("pull", "jobs", "g", max=10, wait_ms=2_000)
    assert [m.id for m in back] == [got[1].id]
    with pytest.raises(AlreadyDelivered):
        await c("cancel", got[0].id)


async def test_long_poll_waits_for_the_first_message(c: Either, fake: FakeBroker) -> None:
    await c("send", "lp", "soon", delay_ms=300)
    started = time.monotonic()
    got = await c("pull", "lp", "g", wait_ms=5_000)
    assert len(got) == 1 and 0.2 < time.monotonic() - started < 4
    assert got[0].deliver_at <= int(time.time() * 1000)


async def test_observe(c: Either) -> None:
    base = (int(time.time() * 1000) // 60_000 + 1) * 60_000
    await c("send_batch", "obs", [{"body": "x", "deliver_at": base + i * 30_000} for i in range(5)])
    s = await c("stats")
    assert s.scheduled == 5 and s.topics["obs"]["scheduled"] == 5 and s.lateness_ms["max"] == 7
    assert s.to_dict()["scheduled"] == 5
    buckets = await c("schedule", base, base + 180_000, timedelta(minutes=1))
    assert [(b.start_ms - base, b.count) for b in buckets] == [(0, 2), (60_000, 2), (120_000, 1)]
    [info] = await c("info")
    assert info.node_id == "d" and info.version == "fake"


def test_sync_client_joins_its_thread(fake: FakeBroker, no_thread_leak: None) -> None:
    with Client(fake.url) as client:
        assert client.send("t", "x").id == "d-1"
        names = {t.name for t in threading.enumerate()}
        assert any(n.startswith("delayd-client") for n in names)
    assert client.closed
    client.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        client.send("t", "x")


def test_garbage_collected_sync_client_stops_its_thread(fake: FakeBroker, no_thread_leak: None) -> None:
    client = Client(fake.url)
    client.send("t", "x")
    thread = client.runner.thread
    del client
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_sync_client_shared_by_threads(fake: FakeBroker, no_thread_leak: None) -> None:
    with Client(fake.url) as client:
        ids: list[str] = []
        workers = [threading.Thread(target=lambda n=n: ids.extend(
            client.send("t", f"{n}-{i}").id for i in range(20))) for n in range(5)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert len(set(ids)) == 100


async def test_async_client_refuses_use_after_close(fake: FakeBroker) -> None:
    c = AsyncClient(fake.url)
    await c.send("t", "x")
    await c.close()
    await c.close()
    with pytest.raises(RuntimeError, match="closed"):
        await c.send("t", "x")
