#!/usr/bin/env python3
"""Micro-benchmark of the per-message storage path, in-process (no HTTP, no asyncio).

Phases, each timed on its own:

  append  Store.append_messages + flush_commit (fsync) per batch: the durable produce path
  index   Store.read_records + Store.index: commit-log scan, TimerLog unit, wheel slot update
          (what enqueue-get and enqueue-put do for every message)

N messages (default 300,000) with 100-byte bodies in batches of 1,000, due uniformly over the
next 48 h (inside the default 2-day roll window, so every one gets a DEFAULT unit; no rolls).
Each run uses a fresh data directory with the default StoreConfig (1 s precision, 2-day
window). Prints msg/s per phase and combined (N / (append + index)), the median of --runs runs,
and combined messages per CPU-second of this process (less sensitive to a busy machine; the
wall-clock figure includes the fsyncs).

    .venv/bin/python -m bench.storage_bench [-n 300000] [--batch 1000] [--runs 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from delayd.storage.recovery import open_store
from delayd.storage.store import NewMessage, StoreConfig

T0 = 1_700_000_000_000
SPREAD_MS = 48 * 3_600_000


def one_run(n: int, batch: int, base_dir: str | None, seed: int) -> tuple[float, float, float, float]:
    """(append wall s, index wall s, append CPU s, index CPU s)"""
    rng = random.Random(seed)
    body = bytes(rng.randrange(256) for _ in range(100))
    batches = [[NewMessage("bench", body, T0 + rng.randrange(1, SPREAD_MS)) for _ in range(batch)]
               for _ in range(n // batch)]
    d = Path(tempfile.mkdtemp(prefix="storage-bench-", dir=base_dir))
    try:
        store, _report = open_store(d, StoreConfig(), lambda: T0)
        t0, c0 = time.perf_counter(), time.process_time()
        for b in batches:
            store.append_messages(b, T0)
            store.flush_commit()
        t1, c1 = time.perf_counter(), time.process_time()
        done = 0
        while True:
            recs, _pos = store.commit.read_records(store.indexed, batch)
            if not recs:
                break
            result = store.indexer.index(recs, T0)
            assert not result.blocked, "index blocked: the bench must stay inside the wheel"
            done += result.consumed
        t2, c2 = time.perf_counter(), time.process_time()
        assert done == len(batches) * batch, (done, n)
        assert store.scheduled == done
        store.close()
        return t1 - t0, t2 - t1, c1 - c0, c2 - c1
    finally:
        shutil.rmtree(d, ignore_errors=True)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300_000, help="messages per run")
    ap.add_argument("--batch", type=int, default=1_000, help="messages per append batch (and fsync)")
    ap.add_argument("--runs", type=int, default=3, help="runs; the median is reported")
    ap.add_argument("--dir", default=None, help="where to create the data directories (default: $TMPDIR)")
    args = ap.parse_args()
    n = args.n - args.n % args.batch
    print(f"storage bench: N={n:,} body=100 B batch={args.batch:,} delays 0-48 h, {args.runs} runs; "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs ({cpu_model()})")
    appends, indexes, totals, cpu = [], [], [], []
    for i in range(args.runs):
        a, x, ca, cx = one_run(n, args.batch, args.dir, seed=i)
        appends.append(n / a)
        indexes.append(n / x)
        totals.append(n / (a + x))
        cpu.append(n / (ca + cx))
        print(f"  run {i + 1}: append {n / a:>10,.0f} msg/s ({a:.2f} s)   index {n / x:>10,.0f} msg/s ({x:.2f} s)"
              f"   combined {n / (a + x):>10,.0f} msg/s   (per CPU-second: {n / (ca + cx):,.0f})")
    print(f"median: append {statistics.median(appends):,.0f} msg/s, index {statistics.median(indexes):,.0f} msg/s, "
          f"combined {statistics.median(totals):,.0f} msg/s (wall clock); "
          f"{statistics.median(cpu):,.0f} msg per CPU-second")


if __name__ == "__main__":
    main()
