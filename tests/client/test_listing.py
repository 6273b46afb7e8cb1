"""`AsyncClient.list` / `Client.list` and `delayd ls` against real daemons: pages in due order,
bodies, ranges, resuming from a cursor, a sharded listing merged in due order, and the CLI."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from delayd.client import AsyncClient, Client, Forbidden, PendingMessage, PendingPage
from delayd.client.cli import main as cli_main

from tests.support.daemon import DaemonProcess

DAY = 86_400_000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("listing") / "data").start()
    yield d
    assert d.stop() == 0, d.log_tail()


def now_ms() -> int:
    return int(time.time() * 1000)


def order(ms: list[PendingMessage]) -> list[tuple[int, int]]:
    return [(m.deliver_at, int(m.id.split("-")[1], 16)) for m in ms]


async def test_async_pages_in_due_order_with_bodies_and_a_cursor(daemon: DaemonProcess) -> None:
    rng = random.Random(4)
    async with AsyncClient(daemon.url) as c:
        dues = [now_ms() + rng.randrange(60_000, 5 * DAY) for _ in range(45)]
        sent = await c.send_batch("sdk-list", [{"body": f"b{i}", "deliver_at": d, "key": f"k{i}"}
                                               for i, d in enumerate(dues)])
        pages = [p async for p in c.list("sdk-list", page_size=10, body=True)]
        assert [len(p.messages) for p in pages] == [10, 10, 10, 10, 5]
        assert all(isinstance(p, PendingPage) for p in pages) and pages[-1].cursor is None
        got = [m for p in pages for m in p.messages]
        assert order(got) == sorted(order(got)) and {m.id for m in got} == {s.id for s in sent}
        first = next(m for m in got if m.id == sent[0].id)
        assert (first.topic, first.key, first.body, first.body_size, first.deliver_at) == \
            ("sdk-list", "k0", b"b0", 2, dues[0])
        assert first.deliver_at_dt == datetime.fromtimestamp(dues[0] / 1000, UTC)
        # Without bodies, resuming after the second page.
        rest = [m async for p in c.list("sdk-list", page_size=10, cursor=pages[1].cursor) for m in p.messages]
        assert [m.id for m in rest] == [m.id for m in got[20:]] and all(m.body is None for m in rest)
        # A range of due times, as datetimes.
        lo, hi = sorted(dues)[5], sorted(dues)[30]
        ranged = [m async for p in c.list("sdk-list", from_ms=datetime.fromtimestamp(lo / 1000, UTC),
                                          to_ms=hi) for m in p.messages]
        assert [m.deliver_at for m in ranged] == sorted(d for d in dues if lo <= d <= hi)
        with pytest.raises(ValueError):
            c.list("sdk-list", page_size=0)


def test_sync_iterator_and_every_topic(daemon: DaemonProcess) -> None:
    with Client(daemon.url, encoding="json") as c:
        c.send("sdk-sync-a", "x", delay_ms=3_600_000)
        c.send("sdk-sync-b", b"\xff", delay_ms=3_600_001)
        pages = list(c.list(page_size=1, body=True))
        mine = [m for p in pages for m in p.messages if m.topic.startswith("sdk-sync-")]
        assert [(m.topic, m.body) for m in mine] == [("sdk-sync-a", b"x"), ("sdk-sync-b", b"\xff")]
        # Breaking out early closes the listing cleanly.
        for page in c.list("sdk-sync-a"):
            assert page.messages
            break


async def test_sharded_listing_merges_in_due_order(tmp_path: Path) -> None:
    ds = [DaemonProcess(tmp_path / f"s{i}", extra_args=["--node-id", f"s{i}"]) for i in range(2)]
    try:
        for d in ds:
            d.start(wait_ready=False)
        for d in ds:
            d.wait_ready()
        async with AsyncClient([d.url for d in ds]) as c:
            base = now_ms() + 600_000
            # Keyed messages spread over both shards by the ring.
            await c.send_batch("sdk-shard", [{"body": "x", "deliver_at": base + 7 * i, "key": f"k{i}"}
                                             for i in range(60)])
            pages = [p async for p in c.list("sdk-shard", page_size=8)]
            got = [m for p in pages for m in p.messages]
            assert len(got) == 60 and {m.id.split("-")[0] for m in got} == {"s0", "s1"}
            assert [m.deliver_at for m in got] == [base + 7 * i for i in range(60)]
            assert all(len(p.messages) <= 8 and p.cursor is None for p in pages)
            with pytest.raises(ValueError):
                c.list("sdk-shard", cursor="abc")
    finally:
        for d in ds:
            d.stop()


ADMIN, CONSUMER = "adm-sdk-list-1", "cns-sdk-list-2"


async def test_rights_surface_as_exceptions(tmp_path: Path) -> None:
    cfg = f'[[auth.tokens]]\ntoken = "{ADMIN}"\nrights = ["admin"]\n\n' \
          f'[[auth.tokens]]\ntoken = "{CONSUMER}"\nrights = ["consume"]\ntopics = ["mine"]\n'
    d = DaemonProcess(tmp_path / "data", config_text=cfg).start()
    try:
        async with AsyncClient(d.url, ADMIN) as admin, AsyncClient(d.url, CONSUMER) as consumer:
            await admin.send("mine", "m", delay_ms=60_000)
            assert [m.topic async for p in consumer.list("mine") for m in p.messages] == ["mine"]
            with pytest.raises(Forbidden):
                await anext(consumer.list())
    finally:
        d.stop()


def test_cli_ls(daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(daemon.url) as c:
        sent = c.send_batch("cli-ls", [{"body": f"body {i}", "delay_ms": 600_000 + 1000 * i, "key": f"k{i}",
                                        "tag": "t"} for i in range(12)])
    capsys.readouterr()
    assert cli_main(["ls", "cli-ls", "--url", daemon.url, "--json", "--body"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [s.id for s in sent]
    assert rows[3]["key"] == "k3" and rows[3]["body"] == "body 3" and rows[3]["body_size"] == 6
    assert cli_main(["ls", "cli-ls", "--url", daemon.url, "--limit", "5"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["due", "in", "id", "topic"] and len(lines) == 6
    assert sent[0].id in lines[1] and sent[4].id in lines[5] and sent[5].id not in out
    assert "more are pending" in err
    assert cli_main(["ls", "--url", daemon.url, "--all", "--from", str(sent[10].deliver_at)]) == 0
    out = capsys.readouterr().out
    assert sent[10].id in out and sent[11].id in out and sent[9].id not in out
    assert cli_main(["ls", "nothing-here", "--url", daemon.url]) == 0
    assert "nothing pending" in capsys.readouterr().out
    assert cli_main(["ls", ".bad", "--url", daemon.url]) == 2  # bad name: usage error


async def test_listing_sees_what_was_just_produced(daemon: DaemonProcess) -> None:
    """A produce answered before the listing starts is listed: the daemon waits for indexing."""
    async with AsyncClient(daemon.url) as c:
        for round_ in range(3):
            topic = f"sdk-fresh-{round_}"
            sent = await c.send_batch(topic, [{"body": "x", "delay_ms": 60_000 + i} for i in range(200)])
            got = [m.id async for p in c.list(topic, page_size=1000) for m in p.messages]
            assert got == [s.id for s in sent]
