"""Key index micro-benchmark: inserts/s, lookups/s and process RSS as the index grows.

    .venv/bin/python -m bench.keyindex_bench --keys 10000000

Keys look like order ids ("order-<n>"), inserted in batches of 1,000 as the produce path
does (`put_run`), committed once per 100 batches (the broker commits once per checkpoint), then looked
up at random. RSS is read from /proc/self/status.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from delayd.storage.keyindex import KeyIndex


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--lookups", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        ki = KeyIndex(Path(d) / "keys.sqlite")
        rng = random.Random(1)
        # Ids arrive in no particular order: a modular permutation of 0..N-1 (no N-element
        # list in memory, so the RSS below is the index's, not the benchmark's).
        step = 7_919_993 if args.keys % 7_919_993 else 7_919_999
        t0 = time.perf_counter()
        checkpoints = []
        for b in range(0, args.keys, args.batch):
            ns = [(i * step) % args.keys for i in range(b, min(b + args.batch, args.keys))]
            ki.put_run("orders", [f"order-{n}" for n in ns], b + 1, [1_800_000_000_000 + n for n in ns])
            if (b // args.batch) % 100 == 99:
                ki.commit(b)
            done = b + args.batch
            if done % (args.keys // 5) == 0:
                checkpoints.append((done, done / (time.perf_counter() - t0), rss_mb()))
        ki.commit(args.keys)
        insert_s = time.perf_counter() - t0
        probes = [f"order-{rng.randrange(args.keys)}" for _ in range(args.lookups)]
        t1 = time.perf_counter()
        hits = sum(1 for k in probes if ki.lookup("orders", k) is not None)
        lookup_s = time.perf_counter() - t1
        misses = [f"nope-{i}" for i in range(args.lookups // 4)]
        t2 = time.perf_counter()
        for k in misses:
            ki.lookup("orders", k)
        miss_s = time.perf_counter() - t2
        print(f"keys={args.keys:,} inserts/s={args.keys / insert_s:,.0f} lookups/s(hit)={args.lookups / lookup_s:,.0f} "
              f"lookups/s(miss)={len(misses) / miss_s:,.0f} hits={hits} rss_mb={rss_mb():.0f} "
              f"db_mb={ki.disk_bytes() / 1e6:.0f}")
        for n, rate, rss in checkpoints:
            print(f"  after {n:>11,} keys: cumulative inserts/s {rate:,.0f}, rss {rss:.0f} MB")
        ki.close()


if __name__ == "__main__":
    main()
