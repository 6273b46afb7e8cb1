"""The etcd v3 JSON-gateway client against a real etcd: every call, endpoint failover, time-outs
and the errors a caller sees."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import aiohttp
import pytest
from delayd.broker.errors import EtcdOutcomeUnknown, EtcdRequestFailed, EtcdUnavailable, EtcdWatchCanceled
from delayd.broker.etcd import (
    Compare,
    CompareTarget,
    Delete,
    EtcdClient,
    EventType,
    Get,
    GrpcCode,
    Put,
    prefix_end,
)

from tests.support.daemon import free_port
from tests.support.etcd import EtcdProcess


def _prefix() -> bytes:
    return f"/test-etcd/{uuid.uuid4().hex}/".encode()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a black hole)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


async def test_put_get_prefix_delete(etcd: EtcdProcess) -> None:
    p = _prefix()
    async with EtcdClient([etcd.endpoint]) as c:
        r1 = await c.put(p + b"a", b"1")
        r2 = await c.put(p + b"b", b"\x00\xffbinary")
        assert r2 > r1
        one = await c.get(p + b"a")
        (kv,) = one.kvs
        assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version) == (p + b"a", b"1", r1, r1, 1)
        both = await c.get(p, prefix=True)
        assert [kv.value for kv in both.kvs] == [b"1", b"\x00\xffbinary"] and both.revision >= r2
        assert (await c.get(p + b"missing")).kvs == ()
        assert await c.delete(p, prefix=True) == 2
        assert (await c.get(p, prefix=True)).kvs == ()


async def test_txn_compares_and_branches(etcd: EtcdProcess) -> None:
    p = _prefix()
    async with EtcdClient([etcd.endpoint]) as c:
        absent = Compare(p + b"k", CompareTarget.CREATE, 0)
        r = await c.txn([absent], [Put(p + b"k", b"v1")], [Get(p + b"k")])
        assert r.succeeded and r.ranges() == ()
        r = await c.txn([absent], [Put(p + b"k", b"v2")], [Get(p + b"k")])
        assert not r.succeeded and [kv.value for kv in r.ranges()] == [b"v1"]
        rev = r.ranges()[0].mod_revision
        r = await c.txn([Compare(p + b"k", CompareTarget.MOD, rev), Compare(p + b"k", CompareTarget.VALUE, b"v1")],
                        [Put(p + b"k", b"v3"), Get(p + b"k")])
        assert r.succeeded and [kv.value for kv in r.ranges()] == [b"v3"]
        r = await c.txn([Compare(p + b"k", CompareTarget.MOD, rev)], [Delete(p + b"k")])
        assert not r.succeeded  # a stale revision loses
        assert (await c.get(p + b"k")).kvs[0].value == b"v3"


async def test_leases(etcd: EtcdProcess) -> None:
    p = _prefix()
    async with EtcdClient([etcd.endpoint]) as c:
        lease = await c.lease_grant(5)
        assert lease.ttl_s == 5
        await c.put(p + b"held", b"x", lease=lease.id)
        assert (await c.get(p + b"held")).kvs[0].lease == lease.id
        assert await c.lease_keepalive(lease.id) == 5
        assert 0 <= await c.lease_time_to_live(lease.id) <= 5
        assert await c.lease_revoke(lease.id) is True
        assert (await c.get(p + b"held")).kvs == ()  # the key went with its lease
        assert await c.lease_keepalive(lease.id) == 0  # never renewed again
        assert await c.lease_time_to_live(lease.id) == -1
        assert await c.lease_revoke(lease.id) is False


async def test_watch_sees_changes_and_times_out_quietly(etcd: EtcdProcess) -> None:
    p = _prefix()
    async with EtcdClient([etcd.endpoint]) as c:
        rev = await c.put(p + b"a", b"1")
        (ev,) = await c.watch_once(p, rev, prefix=True, timeout_s=2)  # history from `rev` on
        assert ev.type is EventType.PUT and ev.kv.value == b"1"
        await c.delete(p + b"a")
        head = (await c.get(p)).revision
        events = await c.watch_once(p, head, prefix=True, timeout_s=2)
        assert [e.type for e in events] == [EventType.DELETE]
        t0 = time.monotonic()
        assert await c.watch_once(p, head + 1, prefix=True, timeout_s=0.3) == ()
        assert time.monotonic() - t0 < 2


async def test_watch_from_a_compacted_revision_is_canceled(etcd: EtcdProcess) -> None:
    p = _prefix()
    async with EtcdClient([etcd.endpoint]) as c:
        old = await c.put(p + b"a", b"1")
        head = await c.put(p + b"a", b"2")
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{etcd.endpoint}/v3/kv/compaction", json={"revision": str(head)}) as r:
                assert r.status == 200
        with pytest.raises(EtcdWatchCanceled, match="compacted"):
            await c.watch_once(p, old, prefix=True, timeout_s=2)


async def test_a_dead_endpoint_is_skipped_and_all_dead_is_a_clear_error(etcd: EtcdProcess) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with EtcdClient([dead, etcd.endpoint]) as c:
        p = _prefix()
        await c.put(p, b"x")  # nothing was sent to the dead one, so even a write moves on
        assert (await c.get(p)).kvs[0].value == b"x"
        assert await c.watch_once(p, (await c.get(p)).revision + 1, timeout_s=0.2) == ()
    dead2 = f"http://127.0.0.1:{free_port()}"
    async with EtcdClient([dead, dead2], timeout_s=1) as c:
        with pytest.raises(EtcdUnavailable, match="no etcd endpoint answered /v3/kv/range") as e:
            await c.get(b"/x")
        assert dead in str(e.value) and dead2 in str(e.value)
        with pytest.raises(EtcdUnavailable, match="no etcd endpoint took the watch"):
            await c.watch_once(b"/x", 1, timeout_s=0.5)


async def test_a_silent_endpoint_times_out_and_leaves_time_for_the_next(etcd: EtcdProcess, silent_port: int) -> None:
    silent = f"http://127.0.0.1:{silent_port}"
    async with EtcdClient([silent], timeout_s=0.3) as c:
        t0 = time.monotonic()
        with pytest.raises(EtcdUnavailable, match="timed out"):
            await c.get(b"/x")
        assert time.monotonic() - t0 < 1.5
        with pytest.raises(EtcdOutcomeUnknown, match="may or may not have been applied"):
            await c.put(b"/x", b"1")
    async with EtcdClient([silent, etcd.endpoint], timeout_s=1.0) as c:
        assert (await c.get(b"/x")).revision > 0  # the silent one got half the time, the real one answered


async def test_etcd_errors_carry_code_and_message(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint]) as c:
        with pytest.raises(EtcdRequestFailed, match="requested lease not found") as e:
            await c.put(b"/x", b"1", lease=12345)
        assert e.value.code == GrpcCode.NOT_FOUND and e.value.http_status == 404
