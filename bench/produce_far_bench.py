"""Produce throughput of messages due beyond the 2-day roll window (parked far: a ROLL unit and a
far-index row) against messages due within it, alternating on one daemon.

    .venv/bin/python -m bench.produce_far_bench [--n 200000] [--rounds 3]
    .venv/bin/python -m bench.produce_far_bench --sustain 3000000 [--near] [--max-unwritten-far N]

Batches of 1,000 msgpack messages (100-byte bodies) over 8 connections, fsync `always`; "near"
messages are due in 1-2 hours, "far" ones in 3 days plus up to an hour. Prints, per round and as
medians: messages a second, and the daemon's CPU a message (psutil, the whole process) with what
the produce leaves to the next checkpoint (the far index's SQLite write, after the answers).

`--sustain N`: N far messages (`--near`: near ones) produced as fast as the daemon takes them (a
429's Retry-After honoured), the daemon's RSS sampled every 2 s: the sustained rate, the batches
refused, the peak RSS and how long the graceful stop then takes (it writes what is left).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import psutil

from bench.produce_keys_bench import Batch, cpu_s, post_batches, sustain
from tests.support.daemon import DaemonProcess

HOUR_MS = 3_600_000
DELAYS = {"near": HOUR_MS, "far": 72 * HOUR_MS}
SETTLE_S = 2.5  # two checkpoints and a half, at least


async def produce(url: str, n: int, delay_ms: int, seed: int) -> float:
    rng = random.Random(seed)
    batch = due_in(delay_ms)
    return await post_batches(url, [msgpack.packb({"messages": batch(rng)}) for _ in range(n // 1000)], 8)


def settled_cpu_s(proc: psutil.Process) -> float:
    """The daemon's CPU once the checkpoint's index writes of a round are done: after SETTLE_S, and
    then until half a second passes with under 5 % of a core used (at most 60 s)."""
    time.sleep(SETTLE_S)
    c = cpu_s(proc)
    for _ in range(120):
        time.sleep(0.5)
        c, before = cpu_s(proc), c
        if c - before < 0.025:
            break
    return c


def due_in(delay_ms: int) -> Batch:
    """Sustained requests of messages due `delay_ms` plus up to an hour ahead."""
    def batch(rng: random.Random) -> list[dict[str, Any]]:
        return [{"body": b"x" * 100, "delay_ms": delay_ms + rng.randint(0, HOUR_MS)} for _ in range(1000)]
    return batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sustain", type=int, default=0, metavar="N",
                    help="instead: N messages as fast as taken, with RSS and refusals")
    ap.add_argument("--near", action="store_true", help="with --sustain: messages due within the window")
    ap.add_argument("--max-unwritten-far", type=int, help="with --sustain: the daemon's bound (default its own)")
    args = ap.parse_args()
    if args.sustain:
        config = f"max_unwritten_far = {args.max_unwritten_far}\n" if args.max_unwritten_far else None
        kind = "near" if args.near else "far"
        sustain(args.sustain, 8, config, due_in(DELAYS[kind]), f"{kind} messages", stop_s=300)
        return
    got: dict[str, list[tuple[float, float]]] = {kind: [] for kind in DELAYS}
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp) / "data").start()
        try:
            proc = psutil.Process(d.proc.pid)
            for r in range(args.rounds):
                for kind, delay in DELAYS.items():
                    c0 = cpu_s(proc)
                    rate = asyncio.run(produce(d.url, args.n, delay, r))
                    got[kind].append((rate, (settled_cpu_s(proc) - c0) / args.n * 1e6))
                    print(f"round {r + 1}, {kind}: {rate:,.0f} msg/s, daemon CPU with the index writes "
                          f"{got[kind][-1][1]:.2f} us a message", flush=True)
        finally:
            d.stop()
    for kind, rows in got.items():
        print(f"median, {kind}: {statistics.median(r for r, _ in rows):,.0f} msg/s, daemon CPU with the index "
              f"writes {statistics.median(c for _, c in rows):.2f} us a message")


if __name__ == "__main__":
    main()
