"""The event loop's CPU a produced message, keyless and keyed, in process.

    .venv/bin/python -m bench.produce_loop_bench [--rounds 6] [--batches 100]

One Broker in this process, no HTTP and no client: rounds alternate keyless and keyed, each
`--batches` msgpack bodies of 1,000 messages (100-byte bodies due in 1-48 h; keyed: a new key
each, order-<round>-<batch>-<i>) through `Broker.produce_raw`, the answer's fsync included. What is
timed is the calling thread's CPU (`time.thread_time`), which leaves out the checkpoint's worker
thread (the key index's SQLite write): the part of a keyed produce that the event loop pays. A
1.2 s pause before each round lets a checkpoint run. Prints each round's microseconds a message,
the medians, and keyless/keyed. `bench.produce_keys_bench` measures the same over HTTP against a
daemon, the throughput target's own figure, with more noise on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time

import msgpack
from delayd.broker.config import Config
from delayd.broker.service import Broker

BATCH = 1000


def bodies(batches: int, keyed: bool, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for b in range(batches):
        msgs = [{"body": b"x" * 100, "delay_ms": rng.randint(3_600_000, 48 * 3_600_000)} for _ in range(BATCH)]
        if keyed:
            for i, m in enumerate(msgs):
                m["key"] = f"order-{seed}-{b}-{i}"
        out.append(msgpack.packb({"messages": msgs}))
    return out


async def run(rounds: int, batches: int) -> dict[str, list[float]]:
    us: dict[str, list[float]] = {"keyless": [], "keyed": []}
    with tempfile.TemporaryDirectory() as d:
        broker = Broker(Config(data_dir=d))
        await broker.start()
        try:
            for r in range(rounds):
                for kind in us:
                    raws = bodies(batches, kind == "keyed", 2 * r + (kind == "keyed"))
                    await asyncio.sleep(1.2)
                    start = time.thread_time()
                    for raw in raws:
                        if await broker.produce_raw("bench", raw, False) is None:
                            raise SystemExit("the batch core did not take the body")
                    us[kind].append((time.thread_time() - start) / (batches * BATCH) * 1e6)
                print(f"round {r + 1}: keyless {us['keyless'][-1]:.2f} us, keyed {us['keyed'][-1]:.2f} us a message")
        finally:
            await broker.stop()
    return us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batches", type=int, default=100, help="bodies of 1,000 messages a round")
    args = ap.parse_args()
    us = asyncio.run(run(args.rounds, args.batches))
    keyless, keyed = statistics.median(us["keyless"]), statistics.median(us["keyed"])
    print(f"median event-loop CPU a message: keyless {keyless:.2f} us, keyed {keyed:.2f} us, "
          f"keyless/keyed {keyless / keyed:.2f}")


if __name__ == "__main__":
    main()
