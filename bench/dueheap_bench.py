#!/usr/bin/env python3
"""Micro-benchmark of dequeue-put's DueHeap (the compiled core's, in-process): N DueRows due
over one second, pushed in chunks (a burst's slot chunks are 256, in log order, which is not
deliver_at order), then popped 1,000 at a time once all are due. Prints nanoseconds per row
for the pushes and for the pops, the median of --runs runs.

    .venv/bin/python -m bench.dueheap_bench [-n 1000000] [--chunk 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def one_run(rows: list[bytes], chunk: int) -> tuple[float, float]:
    from delayd.storage import batch

    heap = batch.ops.DueHeap()
    chunks = [b"".join(rows[k:k + chunk]) for k in range(0, len(rows), chunk)]
    t0 = time.perf_counter()
    for c in chunks:
        heap.push(c)
    t1 = time.perf_counter()
    while len(heap):
        heap.pop(1 << 62, 1000)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from delayd.storage import batch

    rnd = random.Random(1)
    rows = [batch.DUE.pack(1_000 + rnd.randrange(1_000), seq, rnd.randrange(1 << 40), 150, 3, 7, 0, 0)
            for seq in range(args.n)]
    runs = [one_run(rows, args.chunk) for _ in range(args.runs)]
    push = statistics.median(r[0] for r in runs) / args.n * 1e9
    pop = statistics.median(r[1] for r in runs) / args.n * 1e9
    print(f"DueHeap ({'compiled' if batch.ops is not batch else 'reference'}), {args.n:,} rows in chunks of "
          f"{args.chunk}: push {push:.0f} ns/row, pop {pop:.0f} ns/row, together {push + pop:.0f} ns/row "
          f"(median of {args.runs})")


if __name__ == "__main__":
    main()
