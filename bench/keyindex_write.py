"""The key index's checkpoint write: its CPU a key, with and without the gap write.

    .venv/bin/python -m bench.keyindex_write [--rounds 3] [--random-keys]

Twelve checkpoints of 100,000 keys each (100 `put_run`s of 1,000, as produce queues them) are
written by `KeyIndex.apply`, whose thread CPU is summed: the part of a keyed produce that the
checkpoint's worker thread pays. Keys in order (order-r<checkpoint>-<batch>-<i>, the keyed rounds
of `bench.produce_keys_bench`) or random (16 hex digits). Rounds alternate the index as it is and
with `_in_gap` answering no (every stretch into `recent`, moved into `keys` later: the write
before keys in a gap went straight into `keys`), so both see the same machine.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from array import array
from pathlib import Path

from delayd.storage.keyindex import KeyIndex

CHECKPOINTS = 12
KEYS_A_CHECKPOINT = 100_000
BATCH = 1000


def write(gap: bool, random_keys: bool) -> tuple[float, float]:
    """(thread CPU, wall seconds) of the checkpoints' `apply`."""
    rng = random.Random(5)
    with tempfile.TemporaryDirectory() as tmp:
        ki = KeyIndex(Path(tmp) / "keys.sqlite")
        if not gap:
            ki._in_gap = lambda *args: False  # type: ignore[method-assign]
        seq, cpu, wall = 1, 0.0, 0.0
        dues = array("q", [1_800_000_000_000 + i for i in range(BATCH)])
        for r in range(CHECKPOINTS):
            for b in range(KEYS_A_CHECKPOINT // BATCH):
                keys = ([f"{rng.getrandbits(64):016x}" for _ in range(BATCH)] if random_keys else
                        [f"order-r{r}-{b}-{i}" for i in range(BATCH)])
                ki.put_run("bench", keys, seq, dues)
                seq += BATCH
            t, w = time.thread_time(), time.perf_counter()
            ki.apply(ki.take_ops(), seq)
            ki.applied()
            cpu += time.thread_time() - t
            wall += time.perf_counter() - w
        ki.close()
        return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--random-keys", action="store_true")
    args = ap.parse_args()
    n = CHECKPOINTS * KEYS_A_CHECKPOINT
    what = "random" if args.random_keys else "ordered"
    for _ in range(args.rounds):
        for gap in (False, True):
            cpu, wall = write(gap, args.random_keys)
            print(f"{n:,} {what} keys, gap write {'on ' if gap else 'off'}: writer CPU {cpu:.2f} s "
                  f"({cpu / n * 1e6:.2f} us a key), wall {wall:.2f} s", flush=True)


if __name__ == "__main__":
    main()
