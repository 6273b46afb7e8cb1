"""Produce throughput with a key on every message vs. none, against one real daemon.

    .venv/bin/python -m bench.produce_keys_bench [--n 100000] [--rounds 3] [--connections 8]

Rounds alternate keyless and keyed so both see the same machine; batches of 1,000 msgpack
messages, 100-byte bodies, delays over 1-48 h, fsync `always`. Prints the median of each and
their ratio (issue 7: keyed must stay within 30% of keyless).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import msgpack

from tests.support.daemon import DaemonProcess


async def produce(url: str, n: int, keyed: str | None, connections: int) -> float:
    rng = random.Random(1)
    body = b"x" * 100
    batches = []
    for b in range(n // 1000):
        msgs = [{"body": body, "delay_ms": rng.randint(3_600_000, 48 * 3_600_000)} for _ in range(1000)]
        if keyed:
            for i, m in enumerate(msgs):
                m["key"] = f"order-{keyed}-{b}-{i}"
        batches.append(msgpack.packb({"messages": msgs}))
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for data in batches:
        queue.put_nowait(data)
    async with aiohttp.ClientSession() as session:
        async def worker() -> None:
            while not queue.empty():
                data = queue.get_nowait()
                async with session.post(url + "/v1/topics/bench/messages", data=data,
                                        headers={"Content-Type": "application/msgpack"}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp) / "data").start()
        try:
            rates: dict[str, list[float]] = {"keyless": [], "keyed": []}
            for r in range(args.rounds):
                rates["keyless"].append(asyncio.run(produce(d.url, args.n, None, args.connections)))
                rates["keyed"].append(asyncio.run(produce(d.url, args.n, f"r{r}", args.connections)))
                print(f"round {r + 1}: keyless {rates['keyless'][-1]:,.0f} msg/s, keyed {rates['keyed'][-1]:,.0f} msg/s")
        finally:
            d.stop()
    keyless, keyed = statistics.median(rates["keyless"]), statistics.median(rates["keyed"])
    print(f"median keyless {keyless:,.0f} msg/s, keyed {keyed:,.0f} msg/s, keyed/keyless {keyed / keyless:.2f}")


if __name__ == "__main__":
    main()
