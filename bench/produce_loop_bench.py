"""The event loop's CPU a produced message, keyless and keyed, in process.

    .venv/bin/python -m bench.produce_loop_bench [--rounds 6] [--batches 100] [--held 3000000]

One Broker in this process, no HTTP and no client: rounds alternate keyless and keyed, each
`--batches` msgpack bodies of 1,000 messages (100-byte bodies due in 1-48 h; keyed: a new key
each, order-<round>-<batch>-<i>) through `Broker.produce_raw`, the answer's fsync included. What is
timed is the calling thread's CPU (`time.thread_time`), which leaves out the checkpoint's worker
thread (the key index's SQLite write): the part of a keyed produce that the event loop pays. A
1.2 s pause before each round lets a checkpoint run. Prints each round's microseconds a message,
the medians, and keyless/keyed. `bench.produce_keys_bench` measures the same over HTTP against a
daemon, the throughput target's own figure, with more noise on 2 cores.

`--held N`: first N keyed messages (other keys, not timed) are produced and written to the key
index, so that the rounds' new keys meet a big index and its key filter: past about 2M keys the
filter answers "maybe" for some new keys (0.7 % at 3M, 2.2 % at 5M, `bench.keyindex_costs`),
each looked up in the index, and the batch's check for a repeated key takes another way.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time

import msgpack
from delayd.broker import errors
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


async def hold(broker: Broker, n: int) -> None:
    """Produce n keyed messages (not timed) and wait until the key index has written them."""
    for b in range(n // BATCH):
        body = msgpack.packb({"messages": [{"body": b"x", "delay_ms": 3_600_000, "key": f"held-{b}-{i}"}
                                           for i in range(BATCH)]})
        while True:
            try:
                await broker.produce_raw("bench", body, False)
                break
            except errors.Backpressure:  # the key index is behind: its checkpoint comes
                await asyncio.sleep(0.1)
    assert broker.store is not None
    keys = broker.store.keys
    while keys.unwritten or not keys.filter_ready:
        await asyncio.sleep(0.1)


async def run(rounds: int, batches: int, held: int = 0) -> dict[str, list[float]]:
    us: dict[str, list[float]] = {"keyless": [], "keyed": []}
    with tempfile.TemporaryDirectory() as d:
        broker = Broker(Config(data_dir=d))
        await broker.start()
        try:
            await hold(broker, held)
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
    ap.add_argument("--held", type=int, default=0, help="keys held in the index before the rounds")
    args = ap.parse_args()
    us = asyncio.run(run(args.rounds, args.batches, args.held))
    keyless, keyed = statistics.median(us["keyless"]), statistics.median(us["keyed"])
    print(f"median event-loop CPU a message: keyless {keyless:.2f} us, keyed {keyed:.2f} us, "
          f"keyless/keyed {keyless / keyed:.2f}")


if __name__ == "__main__":
    main()
