#!/usr/bin/env python3
"""What one page of the pending listing costs with a big backlog (storage.browse, in process).

Fills a store through the storage API (append + index, as enqueue-get/put do; a fixed clock) with
N pending messages: a share due inside the 2-day roll window (timer wheel), the rest in the far
future (the far index, up to a year ahead), plus one burst slot of B messages due in the same
second and R messages of a rare topic. Then times pages (store.browse + reading the records, as
the daemon's handler does) at several positions:

  start          from the oldest pending message
  mid-window     a day ahead, inside the wheel
  burst          the first page that reaches the burst slot walks its whole chain once (cold);
                 the next pages through it reuse its sorted view (warm)
  roll-slot      the slot holding the far messages' ROLL units (walked once, like the burst)
  boundary       across the end of the window into the far index
  far            deep in the far index (200 days ahead)
  rare-topic     every page of a topic with R messages among N: pages bounded by the work budget

Each position: the first page (cold) and the median of the following pages (warm), in ms; a page
includes reading its records from the commit log (bodies included), as the daemon does.

    .venv/bin/python bench/list_bench.py -n 10000000          # ~10 min on the 2-core dev box
    .venv/bin/python bench/list_bench.py -n 2000000 --json bench/results/list_bench.json
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from delayd.storage.browse import Page, Position, Query
from delayd.storage.recovery import open_store
from delayd.storage.store import NewMessage, Store, StoreConfig

T0 = 1_700_000_000_000 - 1_700_000_000_000 % 1000  # a slot start
DAY = 86_400_000
WINDOW = 2 * DAY


def fill(store: Store, n: int, far_share: float, burst: int, rare: int, batch: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    body = bytes(range(64))
    burst_at = T0 + DAY + DAY // 2  # one second, 36 h ahead
    plain = n - burst - rare - 1
    t0 = time.perf_counter()
    appended = 0

    def due() -> int:
        if rng.random() < far_share:
            return T0 + WINDOW + rng.randrange(1000, 363 * DAY)
        return T0 + rng.randrange(1000, WINDOW)

    # "edge": one message due at the very end of the window shares the slot where the far
    # messages' ROLL units sit, so a page through it walks them all (the roll-slot row).
    kinds = [("plain", plain), ("burst", burst), ("rare", rare), ("edge", 1)]
    for kind, count in kinds:
        left = count
        while left:
            k = min(batch, left)
            if kind == "plain":
                msgs = [NewMessage("bench", body, due()) for _ in range(k)]
            elif kind == "burst":
                msgs = [NewMessage("bench", body, burst_at + rng.randrange(1000)) for _ in range(k)]
            elif kind == "rare":
                msgs = [NewMessage("rare", body, due()) for _ in range(k)]
            else:
                msgs = [NewMessage("bench", body, T0 + WINDOW)]
            store.append_messages(msgs, T0)
            left -= k
            appended += k
            while True:  # index as we go: the commit log is not held in memory
                recs, _pos = store.commit.read_records(store.indexed, 4096)
                if not recs:
                    break
                assert store.indexer.index(recs, T0).consumed == len(recs)
            if appended % 1_000_000 < batch:
                # As the daemon does every second: the far index's queued rows go to SQLite.
                store.checkpoint(store.load_time_ms, {})
                print(f"  {appended:,} messages ({time.perf_counter() - t0:.0f} s)", flush=True)
    store.flush_commit()
    t1 = time.perf_counter()
    store.checkpoint(store.load_time_ms, {})  # writes the far index's rows (and fsyncs)
    return {"fill_s": round(t1 - t0, 1), "checkpoint_s": round(time.perf_counter() - t1, 1),
            "burst_at": burst_at, "scheduled": store.scheduled}


def page(store: Store, q: Query) -> tuple[Page, float, int]:
    """One page as the daemon serves it; (page, ms, cooperative steps)."""
    t = time.perf_counter()
    gen = store.browse(q, store.load_time_ms)
    steps = 0
    while True:
        try:
            next(gen)
            steps += 1
        except StopIteration as e:
            p: Page = e.value
            break
    recs = store.read_many([(i.commit_offset, i.commit_size) for i in p.items])
    assert all(not isinstance(r, Exception) for r in recs)
    return p, (time.perf_counter() - t) * 1000, steps


def series(store: Store, name: str, q: Query, pages: int) -> dict[str, Any]:
    first, cold_ms, steps = page(store, q)
    warm: list[float] = []
    walked = first.walked_units
    after = first.next
    items = len(first.items)
    for _ in range(pages - 1):
        if after is None:
            break
        p, ms, _steps = page(store, Query(q.start_ms, q.end_ms, q.limit, after, q.topic_hash, q.budget))
        warm.append(ms)
        walked += p.walked_units
        items += len(p.items)
        after = p.next
    out = {"position": name, "cold_ms": round(cold_ms, 2), "cold_walked_units": first.walked_units,
           "cold_steps": steps, "warm_median_ms": round(statistics.median(warm), 2) if warm else None,
           "warm_max_ms": round(max(warm), 2) if warm else None, "pages": 1 + len(warm), "items": items,
           "walked_units": walked}
    print(f"  {name:<12} cold {out['cold_ms']:>9.2f} ms ({first.walked_units:,} units walked, {steps} steps)"
          f"  warm median {out['warm_median_ms']} ms, max {out['warm_max_ms']} ms over {len(warm)} pages",
          flush=True)
    return out


def rare_topic(store: Store, limit: int) -> dict[str, Any]:
    th = zlib.crc32(b"rare")
    after: Position | None = None
    times: list[float] = []
    found = 0
    while True:
        p, ms, _steps = page(store, Query(limit=limit, after=after, topic_hash=th))
        times.append(ms)
        found += len(p.items)
        after = p.next
        if after is None:
            break
    out = {"position": "rare-topic", "requests": len(times), "found": found,
           "median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2),
           "total_s": round(sum(times) / 1000, 1)}
    print(f"  rare-topic   {found} found in {len(times):,} requests: median {out['median_ms']} ms, "
          f"max {out['max_ms']} ms, {out['total_s']} s in all", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=10_000_000, help="pending messages in all")
    ap.add_argument("--far-share", type=float, default=0.3, help="share due beyond the roll window")
    ap.add_argument("--burst", type=int, default=1_000_000, help="messages due in one second")
    ap.add_argument("--rare", type=int, default=100, help="messages of a rare topic")
    ap.add_argument("--limit", type=int, default=100, help="page size")
    ap.add_argument("--pages", type=int, default=30, help="pages timed per position")
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--dir", default=None, help="parent of the temporary data directory")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()
    burst = min(args.burst, args.n // 2)
    d = Path(tempfile.mkdtemp(prefix="list-bench-", dir=args.dir))
    try:
        store, _report = open_store(d, StoreConfig(), lambda: T0)
        print(f"filling {args.n:,} pending messages ({args.far_share:.0%} far, burst {burst:,}, rare {args.rare})")
        info = fill(store, args.n, args.far_share, burst, args.rare, args.batch, args.seed)
        print(f"  filled in {info['fill_s']} s, checkpoint {info['checkpoint_s']} s; far rows: {store.far.count():,}")
        rss_after_fill = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        lim, pages = args.limit, args.pages
        burst_at = info["burst_at"]
        roll_slot = T0 + WINDOW  # where the far messages' ROLL units sit (also T0 + WINDOW / 2)
        results = [
            series(store, "start", Query(limit=lim), pages),
            series(store, "mid-window", Query(start_ms=T0 + DAY, limit=lim), pages),
            series(store, "burst", Query(start_ms=burst_at, limit=lim), pages),
            series(store, "roll-slot", Query(start_ms=roll_slot - 500, limit=lim), pages),
            series(store, "boundary", Query(start_ms=T0 + WINDOW + 1000, limit=lim), pages),
            series(store, "far", Query(start_ms=T0 + 200 * DAY, limit=lim), pages),
            rare_topic(store, lim),
        ]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        disk = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        summary = {"n": args.n, "far_share": args.far_share, "burst": burst, "rare": args.rare, "limit": lim,
                   **info, "far_rows": store.far.count(), "max_rss_mb_after_fill": rss_after_fill,
                   "max_rss_mb": rss, "disk_mb": disk // 2**20, "results": results,
                   "command": "bench/list_bench.py " + " ".join(sys.argv[1:])}
        print(f"max RSS {rss} MB (after the fill {rss_after_fill} MB), data {disk // 2**20} MB")
        store.close()
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(summary, indent=2))
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
