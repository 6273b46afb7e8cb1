"""The SDK against replicated shards (docs/api.md, "Replication"): fakes answering 421 `not_primary`
and 503 `no_primary` / `insufficient_replicas` / `under_replicated` as a follower and a primary would.

What the real daemons do (election, fencing, copies) is tested in tests/replication; here it is the
client's side: following the primary, remembering it, failing over, and retrying only where it is safe.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from delayd.client import (
    AsyncClient,
    Client,
    InsufficientReplicas,
    NoPrimary,
    NotPrimary,
    RetryPolicy,
    UnderReplicated,
)
from delayd.client.replicas import MAX_REDIRECTS

from tests.client.fakebroker import FakeBroker, ReplicaSet, Reply
from tests.client.helpers import FAST_RETRY, Either

PRODUCE = "POST /v1/topics/t/messages"


@pytest.fixture
def rs() -> Iterator[ReplicaSet]:
    replicas = ReplicaSet("s0", 3, primary=0)
    yield replicas
    replicas.stop()


def count(b: FakeBroker, what: str) -> int:
    return sum(1 for p in b.paths() if p == what)


def error(status: int, code: str, retry_after: str | None = None, **extra: object) -> Reply:
    return Reply(status, {"error": {"code": code, "message": code, **extra}},
                 {"Retry-After": retry_after} if retry_after is not None else {})


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_follower_redirects_and_the_primary_is_remembered(rs: ReplicaSet, kind: str) -> None:
    a, b, _ = rs.members
    c = Either(kind, b.url)  # given only a follower's URL
    try:
        r = await c("send", "t", "x")
        assert r.id.startswith("s0-")
        assert count(b, PRODUCE) == 1 and count(a, PRODUCE) == 1, "the follower said 421, the primary stored it"
        assert c.client.primaries == {b.url: a.url}
        await c("send", "t", "y")
        assert count(b, PRODUCE) == 1 and count(a, PRODUCE) == 2, "the second request went to the primary at once"
        assert (await c("get", r.id)).state == "scheduled"
        assert count(b, f"GET /v1/messages/{r.id}") == 0
    finally:
        await c.close()


async def test_members_of_one_shard_are_one_shard_and_the_primary_is_asked_first(rs: ReplicaSet) -> None:
    a, b, c3 = rs.members
    rs.promote(2)
    async with AsyncClient([a.url, b.url, c3.url], retry=FAST_RETRY) as c:
        r = await c.send("t", "x", key="k")
        assert c.shards == {"s0": [a.url, b.url, c3.url]} and not c.sharded
        assert count(c3, PRODUCE) == 1 and count(a, PRODUCE) == 0 and count(b, PRODUCE) == 0, \
            "/v1/info named c the primary, so nothing went to a follower"
        assert (await c.cancel(r.id)).state == "cancelled"
        assert [i.role for i in await c.info()] == ["follower", "follower", "primary"]


async def test_two_replicated_shards_route_by_node_id() -> None:
    s0, s1 = ReplicaSet("s0", 2, primary=1), ReplicaSet("s1", 2, primary=0)
    try:
        urls = [s0.members[0].url, s1.members[1].url, s0.members[1].url, s1.members[0].url]
        async with AsyncClient(urls, retry=FAST_RETRY) as c:
            sent = await c.send_batch("t", [{"body": "x", "key": f"k{i}"} for i in range(40)])
            assert c.shards == {"s0": [urls[0], urls[2]], "s1": [urls[1], urls[3]]} and c.sharded
            assert {r.id.split("-")[0] for r in sent} == {"s0", "s1"}
            for r in sent[:6]:
                assert (await c.cancel(r.id)).state == "cancelled"
            assert c.primaries == {"s0": s0.members[1].url, "s1": s1.members[0].url}
            # The mapping form names the members and skips discovery.
        async with AsyncClient({"s0": s0.urls, "s1": ",".join(s1.urls)}, retry=FAST_RETRY) as m:
            assert (await m.get(sent[10].id)).id == sent[10].id
            assert count(s0.members[0], "GET /v1/info") == 1, "asked by the first client only"
    finally:
        s0.stop()
        s1.stop()


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_failover_to_another_member_when_the_primary_is_gone(rs: ReplicaSet, kind: str) -> None:
    a, b, c3 = rs.members
    c = Either(kind, [a.url, b.url, c3.url])
    try:
        first = await c("send", "t", "before", key="k1")
        assert c.client.primaries == {"s0": a.url}
        a.stop()          # the primary dies ...
        rs.promote(2)     # ... and c is elected
        started = time.monotonic()
        r = await c("send", "t", "after")  # unkeyed: refused connections are safe to retry elsewhere
        assert time.monotonic() - started < 1.0, "no backoff while another member was left to try"
        assert c.client.primaries == {"s0": c3.url}
        # b (tried after a) answered 421 naming c; c stored it.
        assert count(b, PRODUCE) == 1 and count(c3, PRODUCE) == 1
        assert (await c("get", first.id)).body == b"before" and (await c("get", r.id)).body == b"after"
    finally:
        await c.close()


async def test_no_primary_is_waited_out_with_retry_after(rs: ReplicaSet) -> None:
    a, b, _ = rs.members
    rs.promote(None)
    rs.retry_after_s = 1
    async with AsyncClient(b.url, retry=RetryPolicy(attempts=4, base_delay_ms=5, max_delay_ms=20)) as c:
        async def elect() -> None:
            await asyncio.sleep(0.3)
            rs.promote(0)
        started = time.monotonic()
        r, _ = await asyncio.gather(c.send("t", "x"), elect())  # unkeyed produce: nothing was stored
        assert time.monotonic() - started >= 1.0, "Retry-After: 1 was honoured"
        assert r.id.startswith("s0-") and count(a, PRODUCE) == 1
        assert c.primaries == {b.url: a.url}
    rs.promote(None)
    async with AsyncClient(b.url, retry=RetryPolicy(attempts=2, base_delay_ms=5, max_delay_ms=20)) as c:
        with pytest.raises(NoPrimary) as e:
            await c.send("t", "x")
        assert e.value.status == 503 and e.value.retry_after == 1


async def test_insufficient_replicas_is_retried_after_retry_after_even_unkeyed(rs: ReplicaSet) -> None:
    a = rs.members[0]
    a.script = [error(503, "insufficient_replicas", "0.2")]
    async with AsyncClient(a.url, retry=FAST_RETRY) as c:
        started = time.monotonic()
        r = await c.send("t", "x")
        assert time.monotonic() - started >= 0.2
        assert r.duplicate is False and count(a, PRODUCE) == 2
        a.script = [error(503, "insufficient_replicas", "0")] * FAST_RETRY.attempts
        with pytest.raises(InsufficientReplicas) as e:
            await c.send("t", "y")
        assert e.value.code == "insufficient_replicas" and count(a, PRODUCE) == 2 + FAST_RETRY.attempts


async def test_under_replicated_is_retried_only_where_a_retry_cannot_duplicate(rs: ReplicaSet) -> None:
    a = rs.members[0]
    async with AsyncClient(a.url, retry=FAST_RETRY) as c:
        a.script = [error(503, "under_replicated", "0")]
        with pytest.raises(UnderReplicated):
            await c.send("t", "unkeyed")  # may be stored: a retry could store it twice
        assert count(a, PRODUCE) == 1

        a.script = [error(503, "under_replicated", "0")]
        r = await c.send("t", "keyed", key="k")  # the broker deduplicates by key
        assert count(a, PRODUCE) == 3 and not r.duplicate

        a.script = [error(503, "under_replicated", "0")]
        assert (await c.cancel(r.id)).state == "cancelled"
        assert count(a, f"DELETE /v1/messages/{r.id}") == 2

        await c.send("t", "due")
        (m,) = await c.pull("t", "g", max=1, wait_ms=2000)
        a.script = [error(503, "under_replicated", "0")]
        assert (await c.ack("t", "g", m)).acked == 1
        assert count(a, "POST /v1/topics/t/subscriptions/g/ack") == 2


async def test_redirects_are_bounded(rs: ReplicaSet) -> None:
    a, b, _ = rs.members
    # Two members that keep naming each other (a split view of who is primary) cannot loop forever.
    a.script = [error(421, "not_primary", primary=b.url) for _ in range(10)]
    b.script = [error(421, "not_primary", primary=a.url) for _ in range(10)]
    async with AsyncClient(a.url, retry=FAST_RETRY) as c:
        with pytest.raises(NotPrimary) as e:
            await c.send("t", "x")
    assert count(a, PRODUCE) + count(b, PRODUCE) == MAX_REDIRECTS + 1
    assert e.value.status == 421 and e.value.primary in (a.url, b.url)


async def test_a_follower_that_knows_no_primary_is_left_for_another_member(rs: ReplicaSet) -> None:
    a, b, c3 = rs.members
    b.script = [error(421, "not_primary", primary=None)]
    async with AsyncClient({"s0": [b.url, a.url, c3.url]}, retry=FAST_RETRY) as c:
        r = await c.send("t", "x")
    assert r.id.startswith("s0-") and count(b, PRODUCE) == 1 and count(a, PRODUCE) == 1


async def test_advertised_urls_are_mapped_to_the_urls_given(rs: ReplicaSet) -> None:
    """Members advertise names the client cannot use (inside a compose network); /v1/cluster,
    asked once at discovery, maps them to the URLs the client was given."""
    a, b, c3 = rs.members
    for i, m in enumerate(rs.members):
        m.advertise_url = f"http://delayd-s0-{'abc'[i]}:7070"
    rs.promote(2)
    async with AsyncClient([b.url, c3.url, a.url], retry=FAST_RETRY) as c:
        await c.send("t", "first")
        assert c.primaries == {"s0": c3.url}, "discovery: c said it is primary"
        rs.promote(0)  # c is a follower now: its 421 names a by a name only the members resolve
        r = await c.send("t", "x")
        assert r.id.startswith("s0-") and c.primaries == {"s0": a.url}
        assert count(c3, PRODUCE) == 2 and count(a, PRODUCE) == 1
        assert c.shards == {"s0": [b.url, c3.url, a.url]}, "no unusable advertised URL was added"


async def test_a_member_down_at_discovery_is_placed_by_its_shard(rs: ReplicaSet) -> None:
    a, b, c3 = rs.members
    c3.stop()
    async with AsyncClient([a.url, b.url, c3.url], retry=FAST_RETRY) as c:
        await c.send("t", "x")
        assert c.shards == {"s0": [a.url, b.url, c3.url]}
    # A URL no live member names cannot be placed: it could be a shard of its own.
    lone = FakeBroker("zz").start()
    lone.stop()
    with Client([a.url, lone.url], retry=FAST_RETRY) as sc, pytest.raises(Exception) as e:
        sc.send("t", "x")
    assert e.value.__class__.__name__ == "ConnectionFailed"


async def test_cluster_view_per_shard(rs: ReplicaSet, fake: FakeBroker) -> None:
    async with AsyncClient(rs.urls, retry=FAST_RETRY) as c:
        view = await c.cluster()
        assert list(view) == ["s0"] and view["s0"]["primary"]["url"] == rs.members[0].url
        assert [m["role"] for m in view["s0"]["members"]] == ["primary", "follower", "follower"]
    async with AsyncClient(fake.url) as c:
        assert await c.cluster() == {fake.url: {"replication": False, "shard": "d", "role": "primary"}}
