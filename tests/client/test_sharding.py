"""The sharded client against three fake brokers s0, s1, s2."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from delayd.client import AsyncClient, Client, InvalidMessage, NotFound
from delayd.client.ring import HashRing

from tests.client.fakebroker import FakeBroker

RING = HashRing(["s0", "s1", "s2"])


def owner(topic: str, key: str) -> str:
    return RING.owner_of(topic, key)


async def test_discovery_and_keyed_routing(fakes: list[FakeBroker]) -> None:
    async with AsyncClient([f.url for f in fakes]) as c:
        assert c.sharded
        results = await c.send_batch("orders", [{"body": "x", "key": f"o{i}"} for i in range(60)])
        for i, r in enumerate(results):
            assert r.id.split("-")[0] == owner("orders", f"o{i}")
        assert set(Counter(r.id.split("-")[0] for r in results)) == {"s0", "s1", "s2"}
        single = await c.send("orders", "y", key="o7")
        assert single.duplicate and single.id == results[7].id
        # Each shard got exactly one produce request for the batch, plus discovery.
        for f in fakes:
            assert f.paths()[0] == "GET /v1/info"
        # by id / by key go to the owner only
        for f in fakes:
            f.requests.clear()
        target = results[3]
        assert (await c.get(target.id)).key == "o3"
        assert (await c.get_key("orders", "o3")).id == target.id
        assert (await c.cancel(target.id)).state == "cancelled"
        busy = [f.node_id for f in fakes if f.requests]
        assert busy == [target.id.split("-")[0]]
        with pytest.raises(NotFound):
            await c.get("zz-1")  # no such node


async def test_unkeyed_messages_of_a_batch_stay_together(fakes: list[FakeBroker]) -> None:
    async with AsyncClient([f.url for f in fakes]) as c:
        shards = set()
        for _ in range(30):
            rs = await c.send_batch("t", [{"body": "a"}, {"body": "b"}, {"body": "c"}])
            assert len({r.id.split("-")[0] for r in rs}) == 1
            shards.add(rs[0].id.split("-")[0])
        assert shards == {"s0", "s1", "s2"}  # but spread over the shards


async def test_pull_merges_shards_and_honours_max(fakes: list[FakeBroker]) -> None:
    async with AsyncClient([f.url for f in fakes]) as c:
        sent = await c.send_batch("jobs", [{"body": str(i), "key": f"k{i}"} for i in range(30)])
        got = []
        for _ in range(100):
            batch = await c.pull("jobs", "g", max=4, wait_ms=0)
            assert len(batch) <= 4
            got += batch
            if len(got) == 30:
                break
        assert sorted(m.id for m in got) == sorted(r.id for r in sent)
        ack = await c.ack("jobs", "g", got)
        assert ack.acked == 30 and ack.stale == []
        assert (await c.pull("jobs", "g", max=10)) == []


async def test_long_poll_returns_when_any_shard_has_a_message(fakes: list[FakeBroker]) -> None:
    async with AsyncClient([f.url for f in fakes]) as c:
        await c.send("lp", "later", key="k", delay_ms=300)
        started = time.monotonic()
        got = await c.pull("lp", "g", max=10, wait_ms=10_000)
        assert [m.text for m in got] == ["later"] and time.monotonic() - started < 5
        # The other two shards' long-polls are still running; a message arriving there is kept for the
        # next pull instead of being lost.
        other = next(k for k in (f"x{i}" for i in range(100)) if owner("lp", k) != owner("lp", "k"))
        await c.send("lp", "second", key=other)
        got2 = await c.pull("lp", "g", max=10, wait_ms=10_000)
        assert [m.text for m in got2] == ["second"]
        await c.ack("lp", "g", got + got2)


async def test_close_releases_messages_nobody_claimed(fakes: list[FakeBroker]) -> None:
    c = AsyncClient([f.url for f in fakes])
    keys = {}
    for i in range(200):
        keys.setdefault(owner("rel", f"k{i}"), f"k{i}")
    await c.send("rel", "first", key=keys["s0"])
    got = await c.pull("rel", "g", max=3, wait_ms=5_000)
    assert [m.text for m in got] == ["first"]
    await c.send("rel", "parked", key=keys["s1"])  # picked up by a long-poll still in flight on s1
    s1 = fakes[1]
    deadline = time.monotonic() + 5
    while not s1.groups[("rel", "g")].leases:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await c.close()
    assert any(r.path.endswith("/nack") and r.body["delay_ms"] == 0 for r in s1.requests)
    assert not s1.groups[("rel", "g")].leases


async def test_key_moved_by_a_new_shard_is_still_found(fakes: list[FakeBroker]) -> None:
    async with AsyncClient([f.url for f in fakes[:2]]) as two:
        await two.send_batch("o", [{"body": "x", "key": f"k{i}", "delay_ms": 60_000} for i in range(40)])
    moved = [f"k{i}" for i in range(40) if owner("o", f"k{i}") == "s2"]
    assert moved
    async with AsyncClient([f.url for f in fakes]) as three:
        for k in moved:
            assert (await three.get_key("o", k)).key == k
            assert (await three.cancel_key("o", k)).state == "cancelled"
        with pytest.raises(NotFound):
            await three.cancel_key("o", "never-sent")


async def test_merged_admin_calls(fakes: list[FakeBroker]) -> None:
    async with AsyncClient({f.node_id: f.url for f in fakes}) as c:  # ids given: no discovery
        sub = await c.subscribe("m", "g", max_attempts=1)
        assert sub.max_attempts == 1 and all(("m", "g") in f.groups for f in fakes)
        assert not any(r.path == "/v1/info" for f in fakes for r in f.requests)
        now = int(time.time() * 1000)
        base = (now // 60_000 + 2) * 60_000
        await c.send_batch("m", [{"body": "x", "key": f"k{i}", "deliver_at": base} for i in range(9)])
        stats = await c.stats()
        assert stats.scheduled == 9 and set(stats.shards) == {"s0", "s1", "s2"}
        assert sum(s.scheduled for s in stats.shards.values()) == 9 and stats.disk_bytes == 3000
        assert stats.to_dict()["shards"]["s0"]["disk_bytes"] == 1000
        assert [(b.start_ms, b.count) for b in await c.schedule(base, base + 120_000, 60_000)] == \
            [(base, 9), (base + 60_000, 0)]
        assert [i.node_id for i in await c.info()] == ["s0", "s1", "s2"]
        await c.send_batch("m", [{"body": "now", "key": f"n{i}"} for i in range(9)])
        got = []
        while len(got) < 9:
            got += await c.pull("m", "g", max=9, wait_ms=1000)
        await c.nack("m", "g", got, delay_ms=0)  # max_attempts=1: all dead
        dead = await c.dead("m", "g", limit=100)
        assert len(dead) == 9 and len(await c.dead("m", "g", limit=4)) == 4
        assert (await c.redrive("m", "g", [d.id for d in dead[:5]])).redriven == 5
        assert (await c.redrive("m", "g")).redriven == 4
        ext = await c.extend("m", "g", ["s1-999.1", "nowhere-1.1"], lease_ms=5_000)
        assert ext.extended == 0 and set(ext.stale) == {"s1-999.1", "nowhere-1.1"}


async def test_batch_error_index_is_the_callers(fakes: list[FakeBroker]) -> None:
    async with AsyncClient([f.url for f in fakes]) as c:
        batch = [{"body": "x", "key": f"k{i}"} for i in range(12)]
        batch[9]["tag"] = "poison"
        with pytest.raises(InvalidMessage) as info:
            await c.send_batch("e", batch)
    assert info.value.index == 9
    partial = info.value.partial  # type: ignore[attr-defined]
    poisoned_shard = owner("e", "k9")
    for i, r in enumerate(partial):
        assert (r is None) == (owner("e", f"k{i}") == poisoned_shard)


def test_sync_sharded_client(fakes: list[FakeBroker], no_thread_leak: None) -> None:
    with Client(",".join(f.url for f in fakes)) as c:
        r = c.send("s", "x", key="abc")
        assert r.id.startswith(owner("s", "abc") + "-")
        assert c.cancel_key("s", "abc").id == r.id


def test_the_same_url_twice_is_refused_and_two_urls_of_one_node_are_one_shard(fake: FakeBroker) -> None:
    with pytest.raises(ValueError):
        Client([fake.url, fake.url])
    # Two URLs that report the same node id are two members of one (replicated) shard, not two shards.
    other = fake.url.replace("127.0.0.1", "localhost")
    with Client([fake.url, other]) as c:
        assert c.send("t", "x").id.startswith("d-")
        assert c.shards == {"d": [fake.url, other]} and not c.aio.sharded
