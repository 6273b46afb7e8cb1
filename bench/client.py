"""The benchmark's own delayd client: aiohttp + msgpack, written against shared/API.md.

Why not the SDK (`delayd.client.AsyncClient`): the load generator shares the machine's cores with
the server it measures, so every client microsecond per message is taken from the daemon. The
SDK builds an `OutgoingMessage` per produced message and a `SendResult` / `ReceivedMessage` per
answer: measured in-process, 3.6 µs per produced message against 0.7 µs for plain dicts and one
`msgpack.packb`, and 2.5 µs per pulled message, which would also sit between reading a pull
answer and taking its receive time (the lateness figures). This client takes the receive time
as soon as the answer's bytes are read and keeps the raw dicts.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgpack

from bench.harness import now_ms_f, percentile

MSGPACK = "application/msgpack"
HDRS = {"Content-Type": MSGPACK, "Accept": MSGPACK}


class HttpError(RuntimeError):
    pass


@dataclass
class ClientStats:
    encode_s: float = 0.0  # building message dicts + msgpack.packb (delayd) / building mappings (redis)
    decode_s: float = 0.0  # msgpack.unpackb of responses
    requests: int = 0
    retries_429: int = 0
    batch_rtt_ms: list[float] = field(default_factory=list)  # produce request -> answer, per batch

    def rtt_summary(self) -> dict[str, float | None]:
        s = sorted(self.batch_rtt_ms)
        return {
            "batch_rtt_p50_ms": percentile(s, 50),
            "batch_rtt_p99_ms": percentile(s, 99),
            "batch_rtt_max_ms": s[-1] if s else None,
        }


class Delayd:
    """`async with Delayd(url, connections) as d:` - one connection pool to one daemon."""

    def __init__(self, url: str, connections: int) -> None:
        self.url = url
        self.connections = connections
        self.session: aiohttp.ClientSession | None = None
        self.stats = ClientStats()

    async def __aenter__(self) -> Delayd:
        conn = aiohttp.TCPConnector(limit=self.connections, force_close=False)
        self.session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def post(self, path: str, payload: bytes, *, timeout_s: float = 120) -> tuple[float, Any]:
        """POST msgpack bytes; returns (wall-clock ms when the answer was read, decoded answer)."""
        assert self.session is not None
        while True:
            async with self.session.post(
                self.url + path, data=payload, headers=HDRS, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                raw = await r.read()
                recv = now_ms_f()
                self.stats.requests += 1
                if r.status == 429:
                    self.stats.retries_429 += 1
                    await asyncio.sleep(float(r.headers.get("Retry-After", "0.05") or 0.05))
                    continue
                t0 = time.perf_counter()
                body = msgpack.unpackb(raw, raw=False) if raw else None
                self.stats.decode_s += time.perf_counter() - t0
                if r.status != 200:
                    raise HttpError(f"POST {path} -> {r.status}: {body!r}"[:2000])
                return recv, body

    async def get_json(self, path: str) -> Any:
        assert self.session is not None
        async with self.session.get(self.url + path, timeout=aiohttp.ClientTimeout(total=30)) as r:
            raw = await r.read()
            if r.status != 200:
                raise HttpError(f"GET {path} -> {r.status}: {raw[:500]!r}")
            return json.loads(raw)

    async def produce(self, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        payload = msgpack.packb({"messages": messages}, use_bin_type=True)
        self.stats.encode_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        _, body = await self.post(f"/v1/topics/{topic}/messages", payload)
        self.stats.batch_rtt_ms.append((time.perf_counter() - t1) * 1000)
        out: list[dict[str, Any]] = body["messages"]
        if len(out) != len(messages):
            raise HttpError(f"produce answered {len(out)} results for {len(messages)} messages")
        return out

    async def pull(
        self, topic: str, group: str, max_n: int, wait_ms: int, lease_ms: int = 600_000,
        fields: list[str] | None = None,
    ) -> tuple[float, list[dict[str, Any]]]:
        """`fields`: only these (and id, receipt) in each message; None: every field."""
        request: dict[str, Any] = {"max": max_n, "wait_ms": wait_ms, "lease_ms": lease_ms}
        if fields is not None:
            request["fields"] = fields
        payload = msgpack.packb(request)
        recv, body = await self.post(
            f"/v1/topics/{topic}/subscriptions/{group}/pull", payload, timeout_s=wait_ms / 1000 + 60
        )
        return recv, body["messages"]

    async def ack(self, topic: str, group: str, receipts: list[str]) -> dict[str, Any]:
        payload = msgpack.packb({"receipts": receipts})
        _, body = await self.post(f"/v1/topics/{topic}/subscriptions/{group}/ack", payload)
        return dict(body)


class Acker:
    """Acks receipts in batches on its own connection(s), off the pull loop's critical path."""

    def __init__(self, client: Delayd, topic: str, group: str, workers: int = 2) -> None:
        self.client, self.topic, self.group = client, topic, group
        self.queue: asyncio.Queue[list[str] | None] = asyncio.Queue()
        self.acked = 0
        self.stale = 0
        self.tasks = [asyncio.create_task(self._run()) for _ in range(workers)]

    async def _run(self) -> None:
        while True:
            receipts = await self.queue.get()
            if receipts is None:
                return
            res = await self.client.ack(self.topic, self.group, receipts)
            self.acked += int(res.get("acked", 0))
            self.stale += len(res.get("stale", []))

    def put(self, receipts: list[str]) -> None:
        self.queue.put_nowait(receipts)

    async def close(self) -> None:
        """Wait until every queued receipt is acked."""
        for _ in self.tasks:
            self.queue.put_nowait(None)
        await asyncio.gather(*self.tasks)
