"""Per-key cost of each step the broker takes for a keyed produce, in process.

    .venv/bin/python -m bench.keyindex_costs

A 300,000-key index, then 20 rounds of 1,000 new keys: the batched lookup a produce makes (with
the key filter, and without it: the SQLite query it spares), the overlay update (`put_run`, as a
produce makes it), the SQLite write the checkpoint makes in a worker thread (`apply`) and dropping
the overlay afterwards (`applied`); then the index is opened again and the key filter's build
timed. Prints microseconds per key. `--keys N` sets the index's size.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from delayd.storage.keyindex import KeyIndex


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=300_000, help="keys in the index before the rounds")
    held = ap.parse_args().keys
    with tempfile.TemporaryDirectory() as d:
        ki = KeyIndex(Path(d) / "k.sqlite")
        for b in range(0, held, 1000):
            ki.put_many([("bench", f"pre-{b}-{i}", b + i, 0) for i in range(1000)])
        ki.commit(1)
        while not ki.filter_ready or ki._build is not None:  # the key filter's builds, in a thread
            time.sleep(0.01)
        keys = [f"order-x-{i}" for i in range(1000)]
        f = ki._filter
        assert f is not None
        asked = [[k + str(r) for k in keys] for r in range(20)]
        t = time.perf_counter()
        for r in range(20):
            ki.lookup_many("bench", asked[r])
        print(f"lookup_many (batched, absent keys): {(time.perf_counter() - t) / 20_000 * 1e6:.2f} us/key "
              f"(key filter {len(f.bits) // 1024} KiB for {f.capacity:,} keys, "
              f"{sum(len(f.maybe('bench', [k + str(r) for k in keys])) for r in range(20)) / 200:.2f}% false maybes)")
        ki._filter = None  # what each of those keys cost before the filter: the SQLite lookup
        asked = [[k + "s" + str(r) for k in keys] for r in range(20)]
        t = time.perf_counter()
        for r in range(20):
            ki.lookup_many("bench", asked[r])
        print(f"  the same without the key filter:  {(time.perf_counter() - t) / 20_000 * 1e6:.2f} us/key")
        ki._filter = f
        dues = memoryview(bytes(8 * len(keys))).cast("q")
        put = [[k + "p" + str(r) for k in keys] for r in range(20)]
        t = time.perf_counter()
        for r in range(20):
            ki.put_run("bench", put[r], r * 1000, dues)
        print(f"put_run (overlay):                  {(time.perf_counter() - t) / 20_000 * 1e6:.2f} us/key")
        ops = ki.take_ops()
        t = time.perf_counter()
        ki.apply(ops, 2)
        print(f"apply (SQLite write, worker):       {(time.perf_counter() - t) / 20_000 * 1e6:.2f} us/key")
        t = time.perf_counter()
        ki.applied()
        print(f"applied (drop overlay):             {(time.perf_counter() - t) / 20_000 * 1e6:.2f} us/key")
        n = ki.count()
        ki.close()
        t, cpu = time.perf_counter(), time.process_time()
        ki = KeyIndex(Path(d) / "k.sqlite")
        opened = time.perf_counter() - t
        while not ki.filter_ready:
            time.sleep(0.005)
        print(f"reopened: open {opened * 1000:.0f} ms, key filter of {n:,} keys built after "
              f"{time.perf_counter() - t:.2f} s (process CPU {time.process_time() - cpu:.2f} s)")
        ki.close()


if __name__ == "__main__":
    main()
