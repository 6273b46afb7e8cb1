"""A burst of keyed messages against the same burst without keys, against one real daemon a round.

    .venv/bin/python -m bench.burst_keys_bench [--m 200000] [--rounds 2]

Each round, keyless then keyed (a fresh daemon each, fsync `always`): `--m` messages (100-byte
bodies; keyed: a random key of 16 hex digits each, like an idempotency key) filled over four
connections, all due in one second a few seconds ahead; then one consumer pulls them as
`bench.daemon_vs_redis`'s burst does (batches of 1,000, only `deliver_at` asked besides id and
receipt, acks on two other connections). Prints, a round and as medians of each kind: seconds
from the due second's start until the last message was pulled, and the daemon's CPU a delivered
message over that drain and with what the drain leaves to the next checkpoints (the key index's
write of when each keyed message was delivered, in the checkpoint's thread), as
`bench.produce_keys_bench` counts a produce's. `bench.daemon_vs_redis`'s burst target is keyless;
this is what a key adds to it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from bench.client import Acker, Delayd
from bench.produce_keys_bench import cpu_s, settled_cpu_s
from tests.support.daemon import DaemonProcess

BATCH = 1000
LEAD_S = 2.0  # the due second begins at least this long after the fill
FILL_RATE_GUESS = 50_000  # msg/s (keyed, 2 cores: 150-300 thousand)


async def fill(url: str, m: int, keyed: bool, due_ms: int) -> None:
    rng = random.Random(5)
    async with Delayd(url, 4) as client:
        async def worker(first: int) -> None:
            for _ in range(first, m, 4 * BATCH):
                msgs = [{"body": b"x" * 100, "deliver_at": due_ms + rng.randrange(1000)} for _i in range(BATCH)]
                if keyed:
                    for msg in msgs:
                        msg["key"] = f"{rng.getrandbits(64):016x}"
                await client.produce("burst", msgs)
        await asyncio.gather(*(worker(w * BATCH) for w in range(4)))


async def drain(url: str, m: int, due_ms: int) -> float:
    """Seconds from `due_ms` until the last of m messages was pulled."""
    async with Delayd(url, 1) as pulls, Delayd(url, 2) as acks:
        acker = Acker(acks, "burst", "g")
        seen: set[str] = set()
        last = 0.0
        while len(seen) < m:
            recv, msgs = await pulls.pull("burst", "g", BATCH, 1000, 600_000, ["deliver_at"])
            if msgs:
                last = recv
                acker.put([msg["receipt"] for msg in msgs])
                seen.update(msg["id"] for msg in msgs)
        await acker.close()
        return (last - due_ms) / 1000


def one(m: int, keyed: bool) -> tuple[float, float, float]:
    """(seconds to drain, daemon CPU µs a message during it, and with its index write)."""
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp) / "data").start()
        try:
            proc = psutil.Process(d.proc.pid)
            c = cpu_s(proc)
            time.sleep(1)
            idle_per_s = cpu_s(proc) - c
            # The due second: after the fill at FILL_RATE_GUESS msg/s, and LEAD_S more.
            due_ms = (int(time.time() * 1000) + int((m / FILL_RATE_GUESS + LEAD_S) * 1000)) // 1000 * 1000 + 1000
            t0 = time.time()
            asyncio.run(fill(d.url, m, keyed, due_ms))
            fill_s = time.time() - t0
            if time.time() * 1000 > due_ms - 500:
                raise SystemExit(f"the fill took {fill_s:.1f} s, past the due second: ask for a smaller --m")
            # The group is made by its first pull: before the messages are due.
            asyncio.run(first_pull(d.url))
            while time.time() * 1000 < due_ms - 200:
                time.sleep(0.05)
            c0 = cpu_s(proc)
            took = asyncio.run(drain(d.url, m, due_ms))
            c1 = cpu_s(proc)
            c2 = settled_cpu_s(proc, idle_per_s)
            print(f"  {'keyed' if keyed else 'keyless'}: filled in {fill_s:.1f} s", flush=True)
            return took, (c1 - c0) / m * 1e6, (c2 - c0) / m * 1e6
        finally:
            d.stop(120)


async def first_pull(url: str) -> None:
    async with Delayd(url, 1) as client:
        await client.pull("burst", "g", 1, 0, 600_000, ["deliver_at"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    got: dict[str, list[tuple[float, float, float]]] = {"keyless": [], "keyed": []}
    for r in range(args.rounds):
        for kind in got:
            got[kind].append(one(args.m, kind == "keyed"))
        print(f"round {r + 1}: " + "; ".join(
            f"{kind} all pulled {v[-1][0]:.2f} s after due, daemon CPU a message {v[-1][1]:.2f} us "
            f"({v[-1][2]:.2f} with its index write)" for kind, v in got.items()), flush=True)
    med = {kind: [statistics.median(x[i] for x in v) for i in range(3)] for kind, v in got.items()}
    print("median: " + "; ".join(f"{kind} {v[0]:.2f} s, {v[1]:.2f} / {v[2]:.2f} us a message" for kind, v in med.items()))


if __name__ == "__main__":
    main()
