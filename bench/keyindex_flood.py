"""The key index's checkpoint write under a keyed flood, in process: the writer's CPU a key, by statement.

    .venv/bin/python -m bench.keyindex_flood [--held 3000000] [--per 250000] [--rounds 6]

A KeyIndex is filled with `--held` random keys, `--per` at a time (each a checkpoint's `apply`
of put_runs of 1,000 keys, as a keyed produce makes them), then `--rounds` more checkpoints of
`--per` new random keys are timed: `--per` is what a flood leaves a checkpoint (one starts once
half of `max_unwritten_keys`, 500,000 by default, wait). Prints each round's writer CPU a key
(`time.thread_time`) with the rows of the tables `recent` and `keys` after it, then the CPU a key
of each SQL statement the writer ran in the timed rounds (by the statement's first words) and
of the commit. A sustained keyed flood's rate (`bench.produce_keys_bench --sustain`) is bound by
this write and by the event loop and the client sharing the machine's cores.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from array import array
from collections import defaultdict
from pathlib import Path
from typing import Any

from delayd.storage.keyindex import KeyIndex

BATCH = 1000


class TimedConnection:
    """The writer's connection, timing each statement and commit (CPU of this thread)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.cpu: dict[str, float] = defaultdict(float)
        self.on = False

    def _timed(self, what: str, call: Any, *args: Any) -> Any:
        t = time.thread_time()
        try:
            return call(*args)
        finally:
            if self.on:
                self.cpu[what] += time.thread_time() - t

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed(" ".join(sql.split()[:5]), self.db.execute, sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed(" ".join(sql.split()[:5]), self.db.executemany, sql, *args)

    def commit(self) -> None:
        self._timed("commit", self.db.commit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--held", type=int, default=3_000_000, help="random keys in the index before the timed rounds")
    ap.add_argument("--per", type=int, default=250_000, help="new keys a checkpoint")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    rng = random.Random(7)
    seq = 1
    with tempfile.TemporaryDirectory() as d:
        ki = KeyIndex(Path(d) / "k.sqlite")
        timed = TimedConnection(ki.writer)
        ki.writer = timed  # type: ignore[assignment]

        def checkpoint(n: int) -> float:
            nonlocal seq
            for _ in range(n // BATCH):
                keys = [f"k{rng.getrandbits(48):x}-{i}" for i in range(BATCH)]
                ki.put_run("bench", keys, seq, array("q", [1] * BATCH))
                seq += BATCH
            ops = ki.take_ops()
            t = time.thread_time()
            ki.apply(ops, seq)
            ki.applied()
            return time.thread_time() - t

        try:
            for _ in range(0, args.held, args.per):
                checkpoint(args.per)
            timed.on = True
            us = []
            for r in range(args.rounds):
                us.append(checkpoint(args.per) / args.per * 1e6)
                print(f"round {r + 1}: writer CPU {us[-1]:.2f} us a key (rows: recent {ki._rows[0]:,}, keys {ki._rows[1]:,})")
            keys = args.per * args.rounds
            print(f"writer CPU a key: median {statistics.median(us):.2f} us, mean {statistics.mean(us):.2f} us")
            for what, cpu in sorted(timed.cpu.items(), key=lambda kv: -kv[1]):
                print(f"  {cpu / keys * 1e6:5.2f} us a key  {what}")
        finally:
            ki.writer = timed.db
            ki.close()


if __name__ == "__main__":
    main()
