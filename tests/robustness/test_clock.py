"""The wall clock jumps: in process, with broker.clock.Clock(wall_ms=fake).

Semantics (docs/reliability.md): the broker reads the wall clock once, at start, and then
advances it with the monotonic clock. A step of the wall clock while it runs is reported
(`wall_clock_skew_ms` in /v1/stats) and otherwise ignored: nothing is released early, nothing
is held. A restart re-reads the wall clock and trusts it: by the new clock nothing is early
and nothing is lost; a clock set back holds what was due, a clock set forward releases what
the new clock says is due (early by the old clock, as after any long downtime).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from delayd.broker.clock import Clock
from delayd.broker.config import Config
from delayd.broker.http import make_app
from delayd.broker.metrics import Metrics
from delayd.broker.service import Broker

from tests.support.daemon import free_port

HOUR_MS = 3_600_000


class FakeWall:
    """The real wall clock plus an offset the test moves."""

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms

    def __call__(self) -> float:
        return time.time() * 1000 + self.offset_ms


def real_ms() -> int:
    return int(time.time() * 1000)


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.s, self.url = session, url

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.s.request(method, self.url + path, json=body) as r:
            return r.status, await r.json()

    async def produce(self, topic: str, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        status, body = await self.call("POST", f"/v1/topics/{topic}/messages", {"messages": msgs})
        assert status == 200, body
        return body["messages"]

    async def pull(self, topic: str, wait_ms: int = 200) -> list[dict[str, Any]]:
        """Pull, ack, and stamp each message with the real time it arrived."""
        status, body = await self.call("POST", f"/v1/topics/{topic}/subscriptions/g/pull",
                                       {"max": 1000, "wait_ms": wait_ms})
        assert status == 200, body
        got = body["messages"]
        for m in got:
            m["real_received"] = real_ms()
        if got:
            status, res = await self.call("POST", f"/v1/topics/{topic}/subscriptions/g/ack",
                                          {"receipts": [m["receipt"] for m in got]})
            assert status == 200 and res["acked"] == len(got), res
        return got

    async def state(self, mid: str) -> str:
        status, body = await self.call("GET", f"/v1/messages/{mid}")
        assert status == 200, body
        return str(body["state"])


@asynccontextmanager
async def running(data_dir: Path, wall: Callable[[], float]) -> AsyncIterator[Client]:
    """One broker incarnation on `data_dir` with its own clock, served on loopback."""
    port = free_port()
    cfg = Config(data_dir=str(data_dir), listen=f"127.0.0.1:{port}", precision_ms=100,
                 roll_window_ms=600_000, checkpoint_interval_ms=200).validate()
    broker = Broker(cfg, Clock(wall_ms=wall))
    runner = web.AppRunner(make_app(broker, cfg, Metrics(broker)), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    await broker.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Client(session, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
        await broker.stop()


async def pull_until(c: Client, topic: str, want: set[str], timeout_s: float) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while not want <= {m["id"] for m in got}:
        assert time.monotonic() < deadline, f"{len(want - {m['id'] for m in got})} of {len(want)} missing"
        got += await c.pull(topic)
    return got


async def test_wall_clock_jumps_while_running(tmp_path):
    wall = FakeWall()
    async with running(tmp_path / "data", wall) as c:
        sent = {m["id"]: m["deliver_at"] for m in await c.produce(
            "jump", [{"body": str(i), "delay_ms": 30 * i} for i in range(100)])}
        got: list[dict[str, Any]] = []
        jumps = {20: 3 * HOUR_MS, 45: -3 * HOUR_MS, 70: HOUR_MS, 90: -HOUR_MS}
        deadline = time.monotonic() + 20
        while len(got) < len(sent):
            assert time.monotonic() < deadline, f"{len(sent) - len(got)} messages never arrived"
            got += await c.pull("jump")
            for at, offset in list(jumps.items()):
                if len(got) >= at:
                    wall.offset_ms = offset  # the wall clock steps by hours under the broker
                    del jumps[at]
                    status, stats = await c.call("GET", "/v1/stats")
                    assert abs(stats["wall_clock_skew_ms"] - offset) < 5000, stats
        assert sorted(m["id"] for m in got) == sorted(sent), "lost or duplicated across the jumps"
        for m in got:
            assert m["deliver_at"] == sent[m["id"]]
            assert m["delivered_at"] >= m["deliver_at"], "early by the broker's clock"
            assert m["real_received"] >= m["deliver_at"] - 5, "early by the real clock"
            assert m["real_received"] - m["deliver_at"] < 2000, "held back by a backward jump"
        # Produce while the wall clock is off: delay_ms counts from the broker's clock.
        wall.offset_ms = -2 * HOUR_MS
        late = await c.produce("jump", [{"body": "after", "delay_ms": 300}])
        assert abs(late[0]["deliver_at"] - (real_ms() + 300)) < 1000
        more = await pull_until(c, "jump", {late[0]["id"]}, 10)
        assert more[0]["delivered_at"] >= more[0]["deliver_at"] <= more[0]["real_received"] + 5


async def test_restart_with_the_wall_clock_set_back_and_forward(tmp_path):
    data = tmp_path / "data"
    t0 = real_ms()
    async with running(data, FakeWall()) as c:
        soon = await c.produce("rc", [{"body": f"s{i}", "deliver_at": t0 + 3000 + 10 * i} for i in range(20)])
        far = await c.produce("rc", [{"body": f"f{i}", "deliver_at": t0 + HOUR_MS + 10_000 + 10 * i}
                                     for i in range(10)])
        assert await c.pull("rc", wait_ms=0) == []
    soon_ids = {m["id"] for m in soon}
    far_ids = {m["id"] for m in far}
    deliver_at = {m["id"]: m["deliver_at"] for m in soon + far}
    delivered: dict[str, dict[str, Any]] = {}

    def record(batch: list[dict[str, Any]], offset_ms: int) -> None:
        for m in batch:
            assert m["id"] not in delivered, f"{m['id']} delivered twice"
            assert m["delivered_at"] >= m["deliver_at"], "early by the broker's clock"
            assert m["real_received"] + offset_ms >= m["deliver_at"] - 5, "early by the (new) wall clock"
            delivered[m["id"]] = m

    # Restart with the wall clock an hour behind: `soon` is now an hour away. Held, not lost.
    async with running(data, FakeWall(-HOUR_MS)) as c:
        extra = await c.produce("rc", [{"body": "during", "delay_ms": 500}])
        deliver_at[extra[0]["id"]] = extra[0]["deliver_at"]
        record(await pull_until(c, "rc", {extra[0]["id"]}, 10), -HOUR_MS)
        while real_ms() < t0 + 3000 + 20 * 10 + 500:  # until well past when `soon` was due
            record(await c.pull("rc"), -HOUR_MS)
        assert set(delivered) == {extra[0]["id"]}, "released early by the new clock"
        for mid in soon_ids | far_ids:
            assert await c.state(mid) == "scheduled"
        status, stats = await c.call("GET", "/v1/stats")
        assert stats["scheduled"] == 30, stats

    # The clock is right again: `soon` is overdue and comes at once; `far` stays.
    async with running(data, FakeWall()) as c:
        record(await pull_until(c, "rc", soon_ids, 10), 0)
        assert [await c.state(mid) for mid in sorted(far_ids)] == ["scheduled"] * len(far_ids)

    # Forward by an hour (as after an hour of downtime, with laps of a 10-minute wheel in between):
    # `far` is due within seconds by the new clock; rolled units fire, nothing is lost.
    async with running(data, FakeWall(HOUR_MS)) as c:
        record(await pull_until(c, "rc", far_ids, 30), HOUR_MS)
        assert await c.pull("rc", wait_ms=300) == []
        status, stats = await c.call("GET", "/v1/stats")
        assert stats["scheduled"] == 0, stats
    assert set(delivered) == soon_ids | far_ids | {extra[0]["id"]}
    assert all(delivered[i]["deliver_at"] == deliver_at[i] for i in delivered)
