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

`--parts`: also the CPU of each part of the produce that a key adds to (the functions in PARTS,
timed around each call, so a part's time includes the parts under it): where a keyed message's
extra loop time goes, and what is left outside them ("rest").

`--held N`: first N keyed messages (other keys, not timed) are produced and written to the key
index, so that the rounds' new keys meet a big index and its key filter: past about 2M keys the
filter answers "maybe" for some new keys (0.7 % at 3M, 2.2 % at 5M, `bench.keyindex_costs`),
each looked up in the index, and the batch's check for a repeated key takes another way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import random
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
from delayd.broker import errors
from delayd.broker.config import Config
from delayd.broker.service import Broker
from delayd.storage import batch
from delayd.storage.keyfilter import KeyFilter
from delayd.storage.keyindex import KeyIndex
from delayd.storage.overlay import Overlay
from delayd.storage.store import Store

BATCH = 1000
# (owner, attribute, label, depth): the calls a produce makes that a key adds to, each under the
# one before it of a smaller depth. Depth 0 parts are disjoint: "rest" is the round's CPU outside them.
PARTS: list[tuple[Any, str, str, int]] = [
    (batch.ops, "encode_produce_raw", "encode_produce_raw (the body read: records, keys packed)", 0),
    (Broker, "_keyed", "Broker._keyed (which messages are stored)", 0),
    (KeyIndex, "claim_many", "KeyIndex.claim_many", 1),
    (KeyFilter, "claim", "KeyFilter.claim (the filter's pass)", 2),
    (Store, "append_packed", "Store.append_packed (the records stored)", 0),
    (KeyIndex, "put_run", "KeyIndex.put_run", 1),
    (Overlay, "put", "Overlay.put (an entry; its table at a look)", 2),
]


@contextlib.contextmanager
def timed_parts(spent: dict[str, int]) -> Iterator[None]:
    """While inside: each call of a part adds its calling thread's CPU (ns) to spent[label]."""
    def timer(f: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(f)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return f(*args, **kwargs)
            finally:
                spent[label] += time.thread_time_ns() - start
        return timed

    saved = [(owner, name, getattr(owner, name)) for owner, name, _, _ in PARTS]
    try:
        for (owner, name, f), (_, _, label, _) in zip(saved, PARTS, strict=True):
            setattr(owner, name, timer(f, label))
        yield
    finally:
        for owner, name, f in saved:
            setattr(owner, name, f)


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


async def run(rounds: int, batches: int, held: int = 0,
              parts: dict[tuple[str, str], list[float]] | None = None) -> dict[str, list[float]]:
    """Each kind's microseconds a message, a round each; with `parts`, also each part's
    nanoseconds a message, by (kind, label), a round each ("rest": the round's CPU outside the
    parts of depth 0)."""
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
                    spent: dict[str, int] = defaultdict(int)
                    with timed_parts(spent) if parts is not None else contextlib.nullcontext():
                        start = time.thread_time()
                        for raw in raws:
                            if await broker.produce_raw("bench", raw, False) is None:
                                raise SystemExit("the batch core did not take the body")
                        us[kind].append((time.thread_time() - start) / (batches * BATCH) * 1e6)
                    if parts is not None:
                        n = batches * BATCH
                        spent["rest"] = round(us[kind][-1] * 1e3 * n) - sum(spent[label] for _, _, label, depth in PARTS
                                                                            if depth == 0)
                        for _, _, label, _ in [*PARTS, (None, "", "rest", 0)]:
                            parts[(kind, label)].append(spent[label] / n)
                print(f"round {r + 1}: keyless {us['keyless'][-1]:.2f} us, keyed {us['keyed'][-1]:.2f} us a message")
        finally:
            await broker.stop()
    return us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batches", type=int, default=100, help="bodies of 1,000 messages a round")
    ap.add_argument("--held", type=int, default=0, help="keys held in the index before the rounds")
    ap.add_argument("--parts", action="store_true", help="also each part's CPU a message (the module's docstring)")
    args = ap.parse_args()
    parts: dict[tuple[str, str], list[float]] | None = defaultdict(list) if args.parts else None
    us = asyncio.run(run(args.rounds, args.batches, args.held, parts))
    keyless, keyed = statistics.median(us["keyless"]), statistics.median(us["keyed"])
    print(f"median event-loop CPU a message: keyless {keyless:.2f} us, keyed {keyed:.2f} us, "
          f"keyless/keyed {keyless / keyed:.2f}")
    if parts is not None:
        print("median CPU a message by part, ns (keyless, keyed, keyed - keyless):")
        for _, _, label, depth in [*PARTS, (None, "", "rest", 0)]:
            a, b = (statistics.median(parts[(kind, label)]) for kind in ("keyless", "keyed"))
            print(f"  {'  ' * depth}{label:<{60 - 2 * depth}} {a:7.0f} {b:7.0f} {b - a:+7.0f}")


if __name__ == "__main__":
    main()
