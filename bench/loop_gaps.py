"""Where the event loop's stalls go: the daemon, instrumented, for `--daemon-cmd`.

    .venv/bin/python -m bench.daemon_vs_redis --only accuracy_load --skip redis \\
        --daemon-cmd="$PWD/.venv/bin/python -m bench.loop_gaps"      # LOOP_GAPS_OUT=<file>
    .venv/bin/python -m bench.loop_gaps summarize <file>

Run as a daemon command (the arguments after it are `python -m delayd`'s), it starts the real
daemon with a task that wakes the loop every millisecond. For every gap of more than GAP_MS
between two of its wake-ups (`$LOOP_GAPS_MIN_MS` to change it) it writes a line to
`$LOOP_GAPS_OUT` (default `loop-gaps.txt`):

    GAP <ms> at <unix s> cpu <ms> runnable <ms> minflt <n> | <piece>x<calls>=<ms> ... || <cp piece>=<ms> ...

`cpu` and `runnable`: the loop thread's time on a CPU and waiting for one within the gap
(`/proc/thread-self/schedstat`; the rest it was asleep: a blocking call, or waiting for the
GIL); `minflt`: its minor page faults. Then what ran on the loop in the gap: each piece of work
in PIECES, its calls that began in the gap and their time; after `||`, how much of the gap the
checkpoint thread's work (CHECKPOINT_PIECES) overlapped. BENCHMARKS.md (eighteenth session) says
what it found. Linux only; it measures, it changes nothing the daemon does.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import importlib
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import Any

GAP_MS = 5.0
TICK_S = 0.001

# (module, attribute path, label): the loop's pieces of work, each timed per call (a coroutine
# per step it runs, so a call's time is its time on the loop, not its waits).
PIECES = (
    ("delayd.broker.service", "Broker.produce_raw", "produce_raw"),
    ("delayd.broker.service", "Broker.produce", "produce"),
    ("delayd.broker.service", "Broker.pull", "pull"),
    ("delayd.broker.service", "Broker.pulled_msgpack", "pull_answer"),
    ("delayd.broker.service", "Broker.ack_raw", "ack_raw"),
    ("delayd.storage.store", "Store.append_packed", "append"),
    ("delayd.broker.pipeline", "EnqueuePut._index", "index"),
    ("delayd.broker.pipeline", "DequeueGetMessage._resolve", "resolve"),
    ("delayd.broker.pipeline", "DequeuePut._release", "release"),
    ("delayd.broker.pipeline", "GroupCommit._rounds", "group_commit"),
    ("aiohttp.web_protocol", "RequestHandler.data_received", "http_in"),
    ("aiohttp.http_writer", "StreamWriter._writelines", "http_out"),
)
CHECKPOINT_PIECES = (
    ("delayd.storage.store", "Store.finish_checkpoint", "checkpoint"),
    ("delayd.storage.keyindex", "KeyIndex.apply", "cp_keys"),
    ("delayd.storage.farindex", "FarIndex.apply", "cp_far"),
    ("delayd.storage.checkpoint", "save", "cp_save"),
)

Record = tuple[str, float, float]  # (label, start, seconds)


def resolve(module: str, path: str) -> tuple[Any, str]:
    """(owner, attribute name) of `path` in `module`; AttributeError when it is gone (a rename in
    the daemon breaks this tool loudly rather than measuring nothing)."""
    owner: Any = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    getattr(owner, name)
    return owner, name


def timed(f: Callable[..., Any], label: str, into: collections.deque[Record]) -> Callable[..., Any]:
    clock = time.perf_counter
    if asyncio.iscoroutinefunction(f):
        @types.coroutine
        def steps(coro: Any) -> Any:
            value: Any = None
            error: BaseException | None = None
            while True:
                t0 = clock()
                try:
                    yielded = coro.throw(error) if error is not None else coro.send(value)
                except StopIteration as e:
                    into.append((label, t0, clock() - t0))
                    return e.value
                into.append((label, t0, clock() - t0))
                error = None
                try:
                    value = yield yielded
                except BaseException as e:  # (CancelledError too: passed on into the coroutine)
                    value, error = None, e

        @functools.wraps(f)
        async def coroutine(*args: Any, **kw: Any) -> Any:
            return await steps(f(*args, **kw))
        return coroutine

    @functools.wraps(f)
    def plain(*args: Any, **kw: Any) -> Any:
        t0 = clock()
        try:
            return f(*args, **kw)
        finally:
            into.append((label, t0, clock() - t0))
    return plain


def instrument(pieces: tuple[tuple[str, str, str], ...], into: collections.deque[Record]) -> None:
    for module, path, label in pieces:
        owner, name = resolve(module, path)
        setattr(owner, name, timed(getattr(owner, name), label, into))


def thread_stats() -> tuple[int, int, int]:
    """The calling thread's (ns on a CPU, ns runnable and waiting, minor faults)."""
    with open("/proc/thread-self/schedstat") as f:
        run, wait, _ = f.read().split()
    with open("/proc/thread-self/stat") as f:
        minflt = f.read().rsplit(")", 1)[1].split()[7]
    return int(run), int(wait), int(minflt)


def gap_line(ms: float, at: float, cpu_ns: int, wait_ns: int, faults: int, start: float, end: float,
             loop: list[Record], checkpoint: list[Record]) -> str:
    """One gap's line: the loop's pieces that began in [start, end) by label, and how much of the
    gap the checkpoint's pieces overlapped."""
    pieces: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for label, t0, dt in loop:
        if start <= t0 < end:
            pieces[label][0] += 1
            pieces[label][1] += dt * 1e3
    overlap: dict[str, float] = collections.defaultdict(float)
    for label, t0, dt in checkpoint:
        ov = min(t0 + dt, end) - max(t0, start)
        if ov > 0:
            overlap[label] += ov * 1e3
    ran = " ".join(f"{k}x{int(n)}={v:.1f}" for k, (n, v) in sorted(pieces.items(), key=lambda kv: -kv[1][1]))
    cp = " ".join(f"{k}={v:.1f}" for k, v in sorted(overlap.items()))
    return (f"GAP {ms:.1f} at {at:.4f} cpu {cpu_ns / 1e6:.1f} runnable {wait_ns / 1e6:.1f} minflt {faults}"
            f" | {ran} || {cp}\n")


async def watch(out: Any, loop_recs: collections.deque[Record], cp_recs: collections.deque[Record],
                min_ms: float) -> None:
    last = time.perf_counter()
    run0, wait0, flt0 = thread_stats()
    while True:
        await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        run, wait, flt = thread_stats()
        ms = (now - last) * 1e3
        if ms > min_ms:
            out.write(gap_line(ms, time.time(), run - run0, wait - wait0, flt - flt0, last, now,
                               list(loop_recs), list(cp_recs)))
            out.flush()
        last, run0, wait0, flt0 = now, run, wait, flt


def serve(argv: list[str]) -> int:
    from delayd.broker import service

    from delayd import cli

    out = open(os.environ.get("LOOP_GAPS_OUT", "loop-gaps.txt"), "a")  # noqa: SIM115 (lives as long as the daemon)
    min_ms = float(os.environ.get("LOOP_GAPS_MIN_MS", GAP_MS))
    out.write(f"START {time.time():.4f} pid {os.getpid()}\n")
    out.flush()
    loop_recs: collections.deque[Record] = collections.deque(maxlen=8192)
    cp_recs: collections.deque[Record] = collections.deque(maxlen=512)
    instrument(PIECES, loop_recs)
    instrument(CHECKPOINT_PIECES, cp_recs)
    tasks: list[asyncio.Task[None]] = []
    start_pipeline = service.Broker.start_pipeline

    def started(self: Any, *args: Any, **kw: Any) -> Any:
        r = start_pipeline(self, *args, **kw)
        tasks.append(asyncio.get_running_loop().create_task(watch(out, loop_recs, cp_recs, min_ms)))
        return r

    service.Broker.start_pipeline = started  # type: ignore[method-assign]
    try:
        return int(cli.main(argv))
    finally:
        out.close()


def summarize(path: str) -> str:
    """The gaps of a LOOP_GAPS_OUT file, totalled: how many, their time on a CPU, runnable and
    asleep, the pieces that ran in them (median ms a call), and how many the checkpoint overlapped."""
    gaps = cpu = runnable = 0.0
    n = faults = with_cp = 0
    per_call: dict[str, list[float]] = collections.defaultdict(list)
    with open(path) as lines:
        for line in lines:
            if not line.startswith("GAP "):
                continue
            head, _, rest = line.partition(" | ")
            ran, _, cp = rest.partition(" || ")
            h = head.split()
            n += 1
            gaps, cpu, runnable, faults = gaps + float(h[1]), cpu + float(h[5]), runnable + float(h[7]), faults + int(h[9])
            with_cp += bool(cp.strip())
            for piece in ran.split():
                label, _, ms = piece.partition("=")
                name, _, calls = label.rpartition("x")
                per_call[name].append(float(ms) / int(calls))
    if not n:
        return f"{path}: no gap"
    out = [f"{n} gaps, {gaps:.0f} ms: on a CPU {cpu:.0f}, runnable {runnable:.0f}, "
           f"asleep {max(0.0, gaps - cpu - runnable):.0f}; minor faults {faults}; the checkpoint in {with_cp}"]
    for name, xs in sorted(per_call.items(), key=lambda kv: -sum(kv[1])):
        out.append(f"  {name}: in {len(xs)} gaps, median {statistics.median(xs):.2f} ms a call, max {max(xs):.2f}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["summarize"] and len(argv) == 2:
        print(summarize(argv[1]))
        return 0
    return serve(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
