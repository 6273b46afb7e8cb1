"""The SDK's consumer runner (`AsyncConsumer`) draining due messages from one real daemon: its
acks coalesced (the default, `ack_batch_max` 1,000) against one request an ack
(`ack_batch_max=1`, what the runner did before), alternating on one daemon.

    .venv/bin/python -m bench.consumer_bench [--n 50000] [--concurrency 256] [--rounds 3]

Each round sends `--n` messages due at once to a topic of its own, then runs a consumer with a
no-op coroutine handler until it has handled them all (`max_messages`), and checks that nothing
is left leased. Prints, per mode, the medians of: messages a second, the daemon's CPU a message
(psutil, the whole process), the consumer process's CPU a message, and receipts an ack request.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import psutil
from delayd.client import AckResult, AsyncClient, AsyncConsumer, ReceivedMessage

from bench.produce_keys_bench import cpu_s
from tests.support.daemon import DaemonProcess

MODES = {"coalesced": 1_000, "one request an ack": 1}


async def drain(url: str, proc: psutil.Process, topic: str, n: int, concurrency: int,
                ack_batch_max: int) -> tuple[float, float, float, float]:
    """(msg/s, daemon CPU µs a message, consumer CPU µs a message, receipts an ack request)."""
    async with AsyncClient(url) as client:
        for i in range(0, n, 1000):
            await client.send_batch(topic, [{"body": b"x" * 64} for _ in range(min(1000, n - i))])
        sizes: list[int] = []
        ack = client.ack

        async def counted_ack(topic: str, group: str, receipts: list[ReceivedMessage]) -> AckResult:
            sizes.append(len(receipts))
            return await ack(topic, group, receipts)

        client.ack = counted_ack  # type: ignore[method-assign]

        async def handler(m: ReceivedMessage) -> None:
            return None

        consumer = AsyncConsumer(client, topic, "g", handler, concurrency=concurrency, wait_ms=200,
                                 max_messages=n, ack_batch_max=ack_batch_max, fields=[])
        d0, c0, t0 = cpu_s(proc), time.process_time(), time.perf_counter()
        stats = await consumer.run()
        wall, d1, c1 = time.perf_counter() - t0, cpu_s(proc), time.process_time()
        inflight = (await client.stats()).groups[f"{topic}/g"]["inflight"]
        assert stats.succeeded == n and sum(sizes) == n and inflight == 0, (stats, sum(sizes), inflight)
    return n / wall, (d1 - d0) / n * 1e6, (c1 - c0) / n * 1e6, n / len(sizes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    got: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp) / "data").start()
        try:
            proc = psutil.Process(d.proc.pid)
            for r in range(args.rounds):
                for mode, batch_max in MODES.items():
                    row = asyncio.run(drain(d.url, proc, f"c{r}-{batch_max}", args.n, args.concurrency, batch_max))
                    got[mode].append(row)
                    print(f"round {r + 1}, {mode}: {row[0]:,.0f} msg/s, daemon CPU {row[1]:.2f} us a message, "
                          f"consumer CPU {row[2]:.2f} us a message, {row[3]:.1f} receipts an ack request", flush=True)
        finally:
            d.stop()
    for mode, rows in got.items():
        rate, daemon, consumer, per_ack = (statistics.median(col) for col in zip(*rows, strict=True))
        print(f"median, {mode}: {rate:,.0f} msg/s, daemon CPU {daemon:.2f} us a message, "
              f"consumer CPU {consumer:.2f} us a message, {per_ack:.1f} receipts an ack request")


if __name__ == "__main__":
    main()
