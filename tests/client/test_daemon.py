"""The SDK against the real daemon (`python -m delayd serve` on loopback): every method on both
clients, the producer, the consumer runner down to dead letters, the CLI, and a sharded client over
three daemons s0, s1, s2. Each test uses its own topics, so the daemons are shared per module."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from delayd.client import (
    AckResult,
    AlreadyDelivered,
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    Client,
    Consumer,
    DeadLetter,
    InvalidMessage,
    InvalidName,
    MessageState,
    NotFound,
    ReceivedMessage,
    RetryPolicy,
)
from delayd.client.cli import main as cli_main
from delayd.client.ring import HashRing

from tests.client.helpers import Either, until, until_async
from tests.support.daemon import ROOT, DaemonProcess

_names = itertools.count()


def fresh(prefix: str = "t") -> str:
    """A topic name no other test uses."""
    return f"{prefix}-{next(_names)}-{int(time.time() * 1000) % 100_000}"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("daemon") / "data").start()
    yield d
    assert d.stop() == 0, d.log_tail()


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[DaemonProcess]]:
    base = tmp_path_factory.mktemp("shards")
    ds = [DaemonProcess(base / f"s{i}", extra_args=["--node-id", f"s{i}"]) for i in range(3)]
    try:
        for d in ds:
            d.start(wait_ready=False)
        for d in ds:
            d.wait_ready()
        yield ds
    finally:
        for d in ds:
            d.stop()


@pytest.fixture(params=[("async", "msgpack"), ("sync", "json")], ids=lambda p: "-".join(p))
async def c(request: pytest.FixtureRequest, daemon: DaemonProcess) -> AsyncIterator[Either]:
    either = Either(request.param[0], daemon.url, request.param[1])
    yield either
    await either.close()


async def test_produce_inspect_cancel(c: Either) -> None:
    topic = fresh()
    due = datetime.now(UTC) + timedelta(hours=1)
    r = await c("send", topic, "héllo", deliver_at=due, key="o-1", tag="t", headers={"h": "v"})
    assert r.id.startswith("d-") and not r.duplicate and r.deliver_at == int(due.timestamp() * 1000)
    m = await c("get", r.id)
    assert (m.id, m.topic, m.key, m.tag, m.headers, m.body, m.state) == \
        (r.id, topic, "o-1", "t", {"h": "v"}, "héllo".encode(), MessageState.SCHEDULED)
    assert m.produced_at is not None and m.produced_at <= int(time.time() * 1000)
    assert (await c("get_key", topic, "o-1")).id == r.id

    dup = await c("send", topic, "again", delay_ms=timedelta(seconds=5), key="o-1")
    assert dup.duplicate and (dup.id, dup.deliver_at) == (r.id, r.deliver_at)
    moved = await c("send", topic, b"\xff\x00", delay_ms=timedelta(hours=2), key="o-1", replace=True)
    assert not moved.duplicate and moved.id != r.id
    assert (await c("get", r.id)).state == MessageState.CANCELLED
    assert (await c("get_key", topic, "o-1")).body == b"\xff\x00"

    assert (await c("cancel_key", topic, "o-1")).id == moved.id
    assert (await c("cancel", moved.id)).state == "cancelled"  # idempotent
    with pytest.raises(NotFound):
        await c("cancel_key", topic, "o-1")
    with pytest.raises(NotFound):
        await c("get", "d-999999999")
    with pytest.raises(InvalidName):
        await c("send", ".bad", "x")


async def test_batch(c: Either) -> None:
    topic = fresh()
    rs = await c("send_batch", topic, [{"body": "a"}, {"body": "b", "key": "k"}, {"body": "c", "key": "k"},
                                       {"body_b64": "AAE=", "delay_ms": 60_000}])
    assert [r.duplicate for r in rs] == [False, False, True, False] and rs[1].id == rs[2].id
    with pytest.raises(InvalidMessage) as info:
        await c("send_batch", topic, [{"body": "ok"}, {"body": "x", "key": "k" * 300}])
    assert info.value.index == 1 and info.value.status == 400


async def test_a_batch_over_the_broker_request_limits_is_sent_in_parts(c: Either) -> None:
    """The broker refuses a request over 16 MiB or 250,000 elements (413): send_batch splits."""
    topic = fresh()
    big = [{"body_b64": base64.b64encode(bytes([65 + i]) * 1_000_000).decode(), "delay_ms": 3_600_000}
           for i in range(20)]
    rs = await c("send_batch", topic, big)
    assert len({r.id for r in rs}) == 20
    assert (await c("get", rs[13].id)).body == bytes([65 + 13]) * 1_000_000
    many = [{"body": str(i), "headers": {f"h{j}": "v" for j in range(64)}} for i in range(2500)]
    assert len(await c("send_batch", topic, many)) == 2500  # 130 elements each: 325,000


async def test_consume_cycle(c: Either) -> None:
    topic = fresh()
    sub = await c("subscribe", topic, "g", start="earliest", max_attempts=2)
    assert (sub.topic, sub.group) == (topic, "g")
    sent = await c("send_batch", topic, [{"body": f"m{i}", "tag": "a" if i % 2 else "b"} for i in range(4)])
    got = []
    await until_async(lambda: _pull_into(c, topic, got, tags=["a", "b"]), what="4 messages")
    assert sorted(m.id for m in got) == sorted(r.id for r in sent)
    assert all(m.attempt == 1 and m.receipt.startswith(m.id + ".") for m in got)
    ack = await c("ack", topic, "g", got[0])
    assert (ack.acked, ack.stale) == (1, [])
    again = await c("ack", topic, "g", got[0].receipt)
    assert again.acked == 0 and again.stale == [got[0].receipt]
    ext = await c("extend", topic, "g", got[1:], lease_ms=timedelta(seconds=20))
    assert ext.extended == 3 and ext.stale == []
    await c("ack", topic, "g", got[2:])
    await c("nack", topic, "g", got[1], delay_ms=0)
    [redelivered] = await c("pull", topic, "g", max=10, wait_ms=5_000)
    assert (redelivered.id, redelivered.attempt) == (got[1].id, 2)
    await c("nack", topic, "g", redelivered, delay_ms=0)  # 2 of max_attempts 2: dead
    dead = await until_async(lambda: c("dead", topic, "g", limit=10), what="dead letter")
    assert [(d.id, d.body) for d in dead] == [(got[1].id, got[1].body)] and dead[0].attempt == 2
    assert (await c("redrive", topic, "g")).redriven == 1
    [back] = await c("pull", topic, "g", max=10, wait_ms=5_000)
    assert back.id == got[1].id
    await c("ack", topic, "g", back)
    with pytest.raises(AlreadyDelivered):
        await c("cancel", got[0].id)


async def test_pull_of_chosen_fields(c: Either) -> None:
    topic = fresh()
    await c("subscribe", topic, "g", start="earliest")
    (sent,) = await c("send_batch", topic, [{"body": "payload", "key": "k", "tag": "a", "headers": {"h": "v"}}])
    [m] = await until_async(lambda: c("pull", topic, "g", max=10, wait_ms=1_000, fields=["body"]), what="1 message")
    assert (m.id, m.topic, m.body, m.deliver_at) == (sent.id, topic, b"payload", sent.deliver_at)
    assert (m.key, m.tag, m.headers, m.attempt, m.delivered_at) == (None, None, {}, 1, sent.deliver_at), \
        "fields not asked for keep their defaults"
    assert (await c("ack", topic, "g", m)).acked == 1


async def _pull_into(c: Either, topic: str, got: list[ReceivedMessage], **kw: object) -> bool:
    got += await c("pull", topic, "g", max=10, wait_ms=1_000, lease_ms=10_000, **kw)
    return len(got) >= 4


async def test_message_is_never_early(c: Either) -> None:
    topic = fresh()
    r = await c("send", topic, "soon", delay_ms=300)
    [m] = await c("pull", topic, "g", wait_ms=10_000)
    assert m.id == r.id and int(time.time() * 1000) >= r.deliver_at and m.deliver_at == r.deliver_at
    await c("ack", topic, "g", m)


async def test_observe(c: Either) -> None:
    topic = fresh()
    base = (int(time.time() * 1000) // 60_000 + 10) * 60_000
    before = await c("schedule", base, base + 180_000, timedelta(minutes=1))  # other tests' messages
    await c("send_batch", topic, [{"body": "x", "deliver_at": base + i * 30_000} for i in range(5)])
    stats = await c("stats")
    assert stats.scheduled >= 5 and stats.topics[topic]["scheduled"] == 5
    assert {"p50", "p99", "max"} <= set(stats.lateness_ms)
    after = await c("schedule", base, base + 180_000, timedelta(minutes=1))
    assert [b.start_ms - base for b in after] == [0, 60_000, 120_000]
    assert [a.count - b.count for a, b in zip(after, before, strict=True)] == [2, 2, 1]
    [info] = await c("info")
    assert info.node_id == "d" and info.version


async def test_producer(daemon: DaemonProcess) -> None:
    topic = fresh()
    async with AsyncClient(daemon.url) as client:
        async with AsyncProducer(client, linger_ms=10, max_batch=100, max_buffered=150) as p:
            futures = [await p.send(topic, f"m{i}", key=f"k{i}", delay_ms=600_000) for i in range(500)]
        results = [f.result() for f in futures]
        assert len({r.id for r in results}) == 500 and p.batches_sent >= 5
        # (pending: by key is the pending message with that key)
        assert (await client.get_key(topic, "k499")).text == "m499"


@pytest.mark.parametrize("fields", [None, ["body"]])
async def test_consumer_runner_dead_letters(daemon: DaemonProcess, fields: list[str] | None) -> None:
    topic = fresh()
    attempts: dict[str, list[int]] = {}
    tags: set[str | None] = set()

    async def handler(m: ReceivedMessage) -> None:
        attempts.setdefault(m.text, []).append(m.attempt)
        tags.add(m.tag)
        if m.text.startswith("bad"):
            raise RuntimeError("handler failed")

    async with AsyncClient(daemon.url) as client:
        await client.subscribe(topic, "workers", max_attempts=3)
        await client.send_batch(topic, [{"body": b, "tag": "t"} for b in ("good-1", "bad-1", "good-2", "bad-2")])
        consumer = AsyncConsumer(client, topic, "workers", handler, concurrency=4, wait_ms=200,
                                 retry_delay_ms=lambda attempt: 20, fields=fields)
        async with consumer:
            dead = await until_async(lambda: _dead_count(client, topic, 2), timeout_s=15, what="2 dead letters")
        assert sorted(d.body.decode() for d in dead) == ["bad-1", "bad-2"]
        assert attempts["bad-1"] == [1, 2, 3] and attempts["good-1"] == [1], "the attempt comes with any fields"
        assert tags == ({"t"} if fields is None else {None}), "only the fields asked for"
        assert consumer.stats.succeeded == 2 and consumer.stats.failed == 6
        stats = await client.stats()
        assert stats.groups[f"{topic}/workers"]["dead"] == 2


async def _dead_count(client: AsyncClient, topic: str, n: int) -> list[DeadLetter] | None:
    dead = await client.dead(topic, "workers")
    return dead if len(dead) >= n else None


async def test_consumer_runner_acks_many_in_few_requests(daemon: DaemonProcess) -> None:
    """Handlers of two pulls finish together: their acks go to the real daemon in a few requests
    (receipts of two leases in one), every message is acked once and none comes back."""
    topic = fresh()
    go = asyncio.Event()
    seen: list[str] = []

    async def handler(m: ReceivedMessage) -> None:
        seen.append(m.id)
        await go.wait()

    async with AsyncClient(daemon.url) as client:
        await client.send_batch(topic, [{"body": f"m{i}"} for i in range(300)])
        acks: list[int] = []
        ack = client.ack

        async def counted_ack(topic: str, group: str, receipts: list[ReceivedMessage]) -> AckResult:
            acks.append(len(receipts))
            return await ack(topic, group, receipts)

        client.ack = counted_ack  # type: ignore[method-assign]
        consumer = AsyncConsumer(client, topic, "g", handler, concurrency=300, wait_ms=200, lease_ms=60_000)
        async with consumer:
            await until(lambda: len(consumer._active) == 300, what="300 running")
            go.set()
            await until(lambda: consumer.stats.succeeded == 300 and not consumer._active, what="all handled")
        assert sum(acks) == 300 and len(acks) <= 10, f"ack requests of {acks} receipts"
        assert len(set(seen)) == 300
        stats = await client.stats()
        assert stats.groups[f"{topic}/g"]["inflight"] == 0
        assert await client.pull(topic, "g", max=10, wait_ms=0) == []  # acked, not redelivered


def test_sync_consumer_and_lease_extension(daemon: DaemonProcess) -> None:
    topic = fresh()
    with Client(daemon.url) as client:
        client.send(topic, "slow")
        consumer: Consumer

        def handler(m: ReceivedMessage) -> None:
            # Keep working until the runner has renewed the 1 s lease twice.
            deadline = time.monotonic() + 15
            while consumer.stats.extended < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)

        consumer = Consumer(client, topic, "g", handler, lease_ms=1_000, wait_ms=200, max_messages=1)
        stats = consumer.run()
        assert stats.succeeded == 1 and stats.extended >= 2
        assert client.pull(topic, "g", wait_ms=0) == []  # acked, not redelivered


def test_cli_against_daemon(daemon: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topic = fresh()
    f = tmp_path / "m.jsonl"
    f.write_text("".join(json.dumps({"body": f"b{i}", "key": f"k{i}"}) + "\n" for i in range(50))
                 + json.dumps({"body": "later", "key": "later", "delay_ms": 600_000}) + "\n")
    assert cli_main(["send", topic, "--file", str(f), "--url", daemon.url]) == 0
    # By key is the pending message with that key: the one not due yet.
    assert cli_main(["get", "--topic", topic, "--key", "later", "--url", daemon.url, "--json"]) == 0
    capsys.readouterr()
    assert cli_main(["consume", topic, "g", "--count", "50", "--json", "--url", daemon.url]) == 0
    bodies = sorted(json.loads(line)["body"] for line in capsys.readouterr().out.splitlines())
    assert bodies == sorted(f"b{i}" for i in range(50))
    assert cli_main(["stats", "--url", daemon.url]) == 0
    assert cli_main(["schedule", "--hours", "1", "--url", daemon.url]) == 0


async def test_show_and_delete_subscription(c: Either) -> None:
    topic = fresh()
    with pytest.raises(NotFound):
        await c("get_subscription", topic, "g")
    await c("subscribe", topic, "g", max_attempts=3)
    await c("send_batch", topic, [{"body": "a"}, {"body": "b"}])
    (m,) = await until_async(lambda: c("pull", topic, "g", max=1, wait_ms=500), what="a message")
    s = await c("get_subscription", topic, "g")
    assert (s.topic, s.group, s.max_attempts, s.inflight, s.dead) == (topic, "g", 3, 1, 0)
    assert s.backlog == 1 and s.oldest_unacked_age_ms >= 0
    assert await c("delete_subscription", topic, "g") is None
    with pytest.raises(NotFound):
        await c("get_subscription", topic, "g")
    with pytest.raises(NotFound):
        await c("delete_subscription", topic, "g")
    assert (await c("ack", topic, "g", m)).stale == [m.receipt], "the lease went with the group"


def test_public_methods_of_both_clients_have_docstrings() -> None:
    for cls in (Client, AsyncClient):
        missing = [name for name, member in vars(cls).items()
                   if not name.startswith("_") and callable(getattr(member, "fget", member))
                   and not (getattr(member, "fget", member).__doc__ or "").strip()]
        assert not missing, f"{cls.__name__} methods without a docstring: {missing}"
        assert (cls.__doc__ or "").strip()


def test_cli_subscribe_ack_dead_redrive(daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]) -> None:
    topic = fresh()
    url = ["--url", daemon.url]

    def cli(*argv: str) -> tuple[int, str, str]:
        code = cli_main([*argv, *url])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, _ = cli("subscribe", "create", topic, "g", "--max-attempts", "1")
    assert code == 0 and f"{topic}/g" in out and "max_attempts: 1" in out
    with Client(daemon.url) as client:
        client.send(topic, "poison")
        (m,) = client.pull(topic, "g", wait_ms=5_000)
        client.nack(topic, "g", m)  # one attempt allowed: straight to dead letters
    code, out, _ = cli("dead", topic, "g")
    assert code == 0 and m.id in out and "nacked" in out and "poison" in out
    code, out, _ = cli("dead", topic, "g", "--json")
    assert [json.loads(line)["id"] for line in out.splitlines()] == [m.id]
    code, _, err = cli("redrive", topic, "g")
    assert code == 2 and "--all" in err, "redrive without ids asks for --all"
    code, out, _ = cli("redrive", topic, "g", m.id)
    assert code == 0 and "redriven 1" in out
    with Client(daemon.url) as client:
        (again,) = client.pull(topic, "g", wait_ms=5_000)
    code, out, _ = cli("ack", topic, "g", again.receipt)
    assert code == 0 and out.strip() == "acked 1"
    code, out, _ = cli("ack", topic, "g", again.receipt, "--json")
    assert code == 4 and json.loads(out) == {"acked": 0, "stale": [again.receipt]}
    code, out, _ = cli("subscribe", "show", topic, "g", "--json")
    shown = json.loads(out)
    assert code == 0 and (shown["backlog"], shown["inflight"], shown["dead"]) == (0, 0, 0)
    code, out, _ = cli("subscribe", "delete", topic, "g")
    assert code == 0 and out.strip() == f"deleted {topic}/g"
    code, _, err = cli("subscribe", "show", topic, "g")
    assert code == 3 and "no subscription" in err, err
    code, _, err = cli("subscribe", "delete", topic, "g")
    assert code == 3


def run_example(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "examples" / "order_timeout.py"), "--url", url,
                           "--orders", "8", "--timeout-ms", "600", "--deadline-s", "20"],
                          capture_output=True, text=True, timeout=60)


def test_order_timeout_example(daemon: DaemonProcess) -> None:
    done = run_example(daemon.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 still open, 0 paid-but-closed" in done.stdout


# ------------------------------------------------------------------------------------------- sharded

async def test_sharded_client(shards: list[DaemonProcess]) -> None:
    ring = HashRing(["s0", "s1", "s2"])
    topic = fresh("sh")
    async with AsyncClient([d.url for d in shards]) as client:
        assert [i.node_id for i in await client.info()] == ["s0", "s1", "s2"]
        sent = await client.send_batch(topic, [{"body": f"m{i}", "key": f"k{i}"} for i in range(60)])
        for i, r in enumerate(sent):
            assert r.id.split("-", 1)[0] == ring.owner_of(topic, f"k{i}")
        assert {r.id.split("-", 1)[0] for r in sent} == {"s0", "s1", "s2"}
        unkeyed = await client.send_batch(topic, [{"body": "u1"}, {"body": "u2"}])
        assert len({r.id.split("-", 1)[0] for r in unkeyed}) == 1

        later = await client.send_batch(topic, [{"body": "l", "key": f"c{i}", "delay_ms": 600_000}
                                                for i in range(10)])
        assert (await client.get(later[5].id)).key == "c5"
        assert (await client.get_key(topic, "c6")).id == later[6].id
        assert (await client.cancel_key(topic, "c7")).id == later[7].id
        assert (await client.cancel(later[8].id)).state == "cancelled"
        with pytest.raises(AlreadyDelivered):
            await client.cancel(sent[0].id)  # due at once: already being delivered

        got: list[ReceivedMessage] = []

        async def pulled_all() -> bool:
            batch = await client.pull(topic, "g", max=7, wait_ms=500)
            assert len(batch) <= 7
            got.extend(batch)
            return len(got) >= 62
        await until_async(pulled_all, timeout_s=20, what="62 messages from 3 shards")
        assert {m.id for m in got} == {r.id for r in sent + unkeyed}
        assert {m.id.split("-", 1)[0] for m in got} == {"s0", "s1", "s2"}
        ack = await client.ack(topic, "g", got)
        assert ack.acked == 62 and ack.stale == []
        stats = await client.stats()
        assert set(stats.shards) == {"s0", "s1", "s2"} and stats.topics[topic]["delivered_total"] >= 60


async def test_sharded_cancel_key_after_adding_a_shard(shards: list[DaemonProcess]) -> None:
    topic = fresh("grow")
    async with AsyncClient([d.url for d in shards[:2]]) as two:
        await two.send_batch(topic, [{"body": "x", "key": f"k{i}", "delay_ms": 600_000} for i in range(30)])
    ring = HashRing(["s0", "s1", "s2"])
    moved = [f"k{i}" for i in range(30) if ring.owner_of(topic, f"k{i}") == "s2"]
    assert moved
    with Client([d.url for d in shards]) as three:
        for k in moved:
            assert three.get_key(topic, k).key == k
            assert three.cancel_key(topic, k).state == "cancelled"


def test_sharded_consumer(shards: list[DaemonProcess]) -> None:
    topic = fresh("shc")
    seen: set[str] = set()
    with Client(",".join(d.url for d in shards)) as client:
        client.send_batch(topic, [{"body": f"m{i}", "key": f"k{i}"} for i in range(30)])
        stats = Consumer(client, topic, "g", lambda m: seen.add(m.id), concurrency=4, wait_ms=200,
                         max_messages=30).run()
    assert stats.succeeded == 30 and len(seen) == 30


async def test_daemon_restart_is_survived_by_retries(daemon: DaemonProcess) -> None:
    """kill -9 and restart the shared daemon (same data directory) under a client's feet."""
    topic = fresh("restart")
    # Generous retries: ride out the whole restart (connection refused, then 503 until ready).
    async with AsyncClient(daemon.url, retry=RetryPolicy(attempts=100, base_delay_ms=20, max_delay_ms=200)) as client:
        r = await client.send(topic, "x", key="k", delay_ms=600_000)
        daemon.kill9()
        restart = asyncio.ensure_future(asyncio.to_thread(daemon.start, False))
        # A keyed produce is retried through the outage, and the broker's dedup makes it a no-op.
        again = await client.send(topic, "x", key="k", delay_ms=600_000)
        assert again.duplicate and again.id == r.id
        await restart
        assert (await client.get(r.id)).state == MessageState.SCHEDULED
    daemon.wait_ready()
