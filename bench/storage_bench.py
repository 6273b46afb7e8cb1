#!/usr/bin/env python3
"""Micro-benchmark of the per-message storage path, in-process (no HTTP, no asyncio).

Phases, each timed on its own, all through the calls the daemon makes (storage.batch `ops`: the
compiled batch core, or its Python reference with `--pure`):

  produce  encode_produce_raw of a msgpack body + Store.append_packed + flush_commit (fsync) per
           batch: the durable produce path, minus HTTP
  index    the MessageRows produce handed over (Store.handed_rows) + Indexer.index_rows: TimerLog
           units, wheel slots, message-table flags (enqueue-get and enqueue-put)
  release  Dispatch.open_slot + resolve + release for the slots the messages fall due in
           (dequeue-get, dequeue-get-message, dequeue-put), every message into its ready queue

N messages (default 300,000) with 100-byte bodies in batches of 1,000, due over the next
--spread-s seconds (default 60: a burst, so the release phase walks few slots). Each run uses a
fresh data directory with the default StoreConfig. Prints, per phase, messages per second and
microseconds of this process's CPU per message (steadier than wall time on a shared machine),
the median of --runs runs.

    .venv/bin/python -m bench.storage_bench [-n 300000] [--batch 1000] [--runs 3] [--pure] [--dir /tmp]
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

import msgpack

T0 = 1_700_000_000_000
LIMITS = (1 << 20, 3650 * 86_400_000, 128, 255, 256, 64, 8192)
PHASES = ("produce", "index", "release")


def one_run(n: int, batch_size: int, spread_s: int, base_dir: str | None, seed: int) -> dict[str, tuple[float, float]]:
    """{phase: (wall s, CPU s)}"""
    from delayd.storage import batch
    from delayd.storage.recovery import open_store
    from delayd.storage.store import StoreConfig

    rng = random.Random(seed)
    body = bytes(rng.randrange(256) for _ in range(100))
    bodies = [msgpack.packb({"messages": [{"body": body, "deliver_at": T0 + rng.randrange(1, spread_s * 1000)}
                                          for _ in range(batch_size)]}) for _ in range(n // batch_size)]
    d = Path(tempfile.mkdtemp(prefix="storage-bench-", dir=base_dir))
    clock = [T0]
    out: dict[str, tuple[float, float]] = {}
    try:
        store, _report = open_store(d, StoreConfig(), lambda: clock[0])
        t0, c0 = time.perf_counter(), time.process_time()
        for raw in bodies:
            got = batch.ops.encode_produce_raw(raw, b"bench", T0, store.next_seq, LIMITS, 10_000, 250_000, None)
            assert got is not None
            store.append_packed("bench", got[0], got[1], T0)
            store.flush_commit()
        out["produce"] = (time.perf_counter() - t0, time.process_time() - c0)

        t0, c0 = time.perf_counter(), time.process_time()
        done, pos = 0, store.indexed
        while True:
            rows, pos = store.handed_rows(pos)
            if not rows:
                rows, pos = batch.read_rows(store.commit, pos, batch_size, store.next_handed())
            if not rows:
                break
            result = store.indexer.index_rows(rows, T0)
            assert not result.blocked and not result.late, "the bench must stay inside the wheel, due later"
            done += result.consumed
        out["index"] = (time.perf_counter() - t0, time.process_time() - c0)
        assert done == len(bodies) * batch_size == store.scheduled, (done, n, store.scheduled)

        dispatch = store.dispatch
        clock[0] = T0 + spread_s * 1000 + 1000
        released = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while dispatch.load_time_ms <= clock[0]:
            slot = dispatch.load_time_ms
            for chunk in dispatch.open_slot(slot, 256):
                res = dispatch.resolve(chunk, slot)
                released += dispatch.release(res.due, clock[0]).count
        out["release"] = (time.perf_counter() - t0, time.process_time() - c0)
        assert released == done, (released, done)
        store.close()
        return out
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
    ap.add_argument("--batch", type=int, default=1_000, help="messages per produce batch (and fsync)")
    ap.add_argument("--spread-s", type=int, default=60, help="messages fall due over this many seconds")
    ap.add_argument("--runs", type=int, default=3, help="runs; the median is reported")
    ap.add_argument("--pure", action="store_true", help="the Python reference instead of the compiled core")
    ap.add_argument("--dir", default=None, help="where to create the data directories (default: $TMPDIR)")
    args = ap.parse_args()
    if args.pure:
        os.environ["DELAYD_PURE"] = "1"  # before storage.batch picks its implementation
    from delayd.storage import native

    n = args.n - args.n % args.batch
    impl = "compiled core" if native.compiled() is not None else "Python reference"
    print(f"storage bench ({impl}): N={n:,} body=100 B batch={args.batch:,} due over {args.spread_s} s, "
          f"{args.runs} runs; python {platform.python_version()}, {os.cpu_count()} CPUs ({cpu_model()})")
    runs = []
    for i in range(args.runs):
        r = one_run(n, args.batch, args.spread_s, args.dir, seed=i)
        runs.append(r)
        print(f"  run {i + 1}: " + "   ".join(f"{p} {n / r[p][0]:>10,.0f} msg/s {r[p][1] / n * 1e6:5.2f} µs CPU/msg"
                                             for p in PHASES))
    print("median: " + ", ".join(
        f"{p} {statistics.median(n / r[p][0] for r in runs):,.0f} msg/s "
        f"{statistics.median(r[p][1] / n * 1e6 for r in runs):.2f} µs CPU/msg" for p in PHASES))


if __name__ == "__main__":
    main()
