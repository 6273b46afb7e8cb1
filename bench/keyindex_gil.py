"""The key index's checkpoint write beside a busy event loop, in process: JSON rows against bound rows.

    .venv/bin/python -m bench.keyindex_gil [--rounds 3] [--batches 200]

A KeyIndex is given `--batches` put_runs of 1,000 new keys (as a keyed produce makes them) and
written once; then as many again are written by `apply` in a thread while this thread runs pure
Python bytecode, as the event loop does under load. Printed a key: the writer thread's CPU, and
the time this thread was kept off a CPU (wall time minus its own CPU: waiting for the GIL, on a
machine with a core for each thread). The rounds alternate the two ways the index writes rows:
JSON text read by SQLite's json_each (`KeyIndex.json_rows`, what it does where SQLite has the
JSON functions) and four bound parameters a row (what it falls back to).

    .venv/bin/python -m bench.keyindex_gil --rows [--batches 1000]

`--rows`: only the compiled functions that make a checkpoint's JSON rows, `key_order` (with the
keys' text) and `key_rows_json` a stretch of KeyIndex's JSON_ROWS keys at a time, for
`--batches` runs of 1,000 random keys, in a thread beside a busy one (five rounds): the time the
busy thread was kept off the GIL, counted from the gaps over 20 microseconds between its clock
reads, and the functions' CPU, a key.

    .venv/bin/python -m bench.keyindex_gil --scan [--batches 1000] [--chunk 16384] [--json-only]

`--scan`: a key filter's build (`FilterBuild.scan`) of an index of `--batches` thousand keys, in a
thread beside a busy one, alternating the two ways it reads the keys (`key_chunk`, `scan_keys`): a chunk of
SCAN_CHUNK as the bytes of one JSON array, which the compiled `filter_add_json` reads without the
GIL (where SQLite has the JSON functions), and a row at a time (where not; every key read before
the twenty-sixth session). Printed a key: each way's build alone first,
then beside the busy thread the build's wall time and the time the busy thread was kept off a CPU.
`--chunk`: the keys a chunk (storage.keyindex SCAN_CHUNK); `--json-only`: only the JSON way.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from array import array
from pathlib import Path

from delayd.storage import keyindex
from delayd.storage.keyindex import FilterBuild, KeyIndex

BATCH = 1000


def write_beside_a_busy_thread(json_rows: bool, batches: int, tag: str) -> tuple[float, float]:
    """(the writer's CPU, this thread's time off a CPU), microseconds a key."""
    with tempfile.TemporaryDirectory() as d:
        ki = KeyIndex(Path(d) / "k.sqlite")
        ki.json_rows = json_rows
        try:
            for part in range(2):  # the first write fills the index, the second is measured
                for b in range(batches):
                    keys = [f"order-{tag}{part}-{b}-{i}" for i in range(BATCH)]
                    ki.put_run("bench", keys, 1 + (part * batches + b) * BATCH, array("q", range(BATCH)))
                ops = ki.take_ops()
                if part == 0:
                    ki.apply(ops, 1)
                    ki.applied()
            done = threading.Event()
            writer_cpu = [0.0]

            def write() -> None:
                t = time.thread_time()
                ki.apply(ops, 2)
                writer_cpu[0] = time.thread_time() - t
                done.set()

            cpu0, wall0 = time.thread_time(), time.perf_counter()
            thread = threading.Thread(target=write)
            thread.start()
            while not done.is_set():
                for _ in range(1000):
                    pass
            wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
            thread.join()
            ki.applied()
        finally:
            ki.close()
    n = batches * BATCH
    return writer_cpu[0] / n * 1e6, (wall - cpu) / n * 1e6


def rows_beside_a_busy_thread(batches: int) -> None:
    """`--rows`: key_order and key_rows_json of `batches` runs, in a thread beside a busy one."""
    rng = random.Random(1)
    runs = [("bench", [f"order-{rng.randrange(10**9)}-{b}-{i}" for i in range(BATCH)], 1 + b * BATCH,
             array("q", range(BATCH))) for b in range(batches)]
    dues = array("q", [d for run in runs for d in run[3]])
    n, stretch, ops = batches * BATCH, keyindex.JSON_ROWS, keyindex.ops
    cpu = [0.0]

    def write() -> None:
        t = time.thread_time()
        order, text, bounds = ops.key_order(runs, True)
        for i in range(0, len(order), 8 * stretch):
            ops.key_rows_json(runs, order[i:i + 8 * stretch], dues, stretch, text, bounds[i:i + 8 * stretch + 8])
        cpu[0] = time.thread_time() - t

    kept, used = [], []
    for r in range(5):
        thread = threading.Thread(target=write)
        gaps = 0.0
        clock = time.perf_counter
        thread.start()
        last = clock()
        while thread.is_alive():
            for _ in range(20):
                now = clock()
                if now - last > 20e-6:
                    gaps += now - last
                last = now
        thread.join()
        kept.append(gaps / n * 1e9)
        used.append(cpu[0] / n * 1e9)
        print(f"round {r + 1}: the busy thread kept off {kept[-1]:.0f} ns a key, the functions' CPU {used[-1]:.0f} ns a key")
    print(f"median: kept off {statistics.median(kept):.0f} ns a key, CPU {statistics.median(used):.0f} ns a key ({n:,} keys)")


def scan_beside_a_busy_thread(batches: int, ways: tuple[str, ...] = ("json", "rows")) -> None:
    """`--scan`: a filter build over `batches` thousand keys beside a busy thread, each of `ways`."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.sqlite"
        ki = KeyIndex(path)
        rng = random.Random(1)
        try:
            for b in range(batches):
                ki.put_run("bench", [f"order-{rng.randrange(10**12)}" for _ in range(BATCH)], 1 + b * BATCH,
                           array("q", range(BATCH)))
                if b % 100 == 99 or b == batches - 1:
                    ki.commit(b)
        finally:
            ki.close()
        got: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
        for way in got:
            build = FilterBuild(path, [], way == "json")
            wall0 = time.perf_counter()
            build.scan()
            assert build.result is not None
            print(f"alone, {way}: the build {(time.perf_counter() - wall0) / build.result.added * 1e6:.2f} us a key")
        for r in range(3):
            for way in got:
                build = FilterBuild(path, [], way == "json")
                cpu0, wall0 = time.thread_time(), time.perf_counter()
                thread = threading.Thread(target=build.scan)
                thread.start()
                while thread.is_alive():
                    for _ in range(1000):
                        pass
                wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
                assert build.result is not None
                n = build.result.added
                got[way].append((wall / n * 1e6, (wall - cpu) / n * 1e6))
                print(f"round {r + 1}, {way}: the build {got[way][-1][0]:.2f} us a key, "
                      f"the busy thread off a CPU {got[way][-1][1]:.2f} us a key ({n:,} keys)")
    for way, rows in got.items():
        print(f"median {way}: the build {statistics.median(w for w, _ in rows):.2f} us a key, "
              f"busy thread off a CPU {statistics.median(o for _, o in rows):.2f} us a key")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=200, help="put_runs of 1,000 keys a write")
    ap.add_argument("--rows", action="store_true", help="only key_order and key_rows_json, beside a busy thread")
    ap.add_argument("--scan", action="store_true", help="a key filter's build beside a busy thread, both ways")
    ap.add_argument("--chunk", type=int, default=keyindex.SCAN_CHUNK, help="with --scan: keys a chunk")
    ap.add_argument("--json-only", action="store_true", help="with --scan: only the JSON way")
    args = ap.parse_args()
    if args.scan:
        keyindex.SCAN_CHUNK = args.chunk
        scan_beside_a_busy_thread(args.batches, ("json",) if args.json_only else ("json", "rows"))
        return
    if args.rows:
        rows_beside_a_busy_thread(args.batches)
        return
    got: dict[str, list[tuple[float, float]]] = {"json": [], "bound": []}
    for r in range(args.rounds):
        for way in got:
            got[way].append(write_beside_a_busy_thread(way == "json", args.batches, f"{r}{way}"))
            cpu, off = got[way][-1]
            print(f"round {r + 1}, {way} rows: writer CPU {cpu:.2f} us a key, the busy thread off a CPU {off:.2f} us a key")
    for way, rows in got.items():
        print(f"median {way}: writer CPU {statistics.median(c for c, _ in rows):.2f} us a key, "
              f"busy thread off a CPU {statistics.median(o for _, o in rows):.2f} us a key")


if __name__ == "__main__":
    main()
