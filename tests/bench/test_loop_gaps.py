"""bench.loop_gaps, the instrument behind BENCHMARKS.md's look inside the loop's stalls: every
piece it times still exists, a coroutine is timed by its steps on the loop (not its waits), and
the daemon run through it serves and writes what ran between the ticks."""

from __future__ import annotations

import asyncio
import collections
import sys
from pathlib import Path

import pytest

from bench import loop_gaps
from tests.integration.helpers import produce
from tests.support.daemon import DaemonProcess, wait_until


def test_every_piece_it_times_exists() -> None:
    for module, path, _label in loop_gaps.PIECES + loop_gaps.CHECKPOINT_PIECES:
        owner, name = loop_gaps.resolve(module, path)
        assert callable(getattr(owner, name)), (module, path)
    with pytest.raises(AttributeError):
        loop_gaps.resolve("delayd.broker.service", "Broker.no_such_method")


async def test_a_coroutine_is_timed_by_its_steps_not_its_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(loop_gaps.time, "perf_counter", lambda: now[0])
    recs: collections.deque[loop_gaps.Record] = collections.deque()

    async def work(x: int) -> int:
        now[0] += 0.001  # its own work before the wait
        await asyncio.sleep(0)
        now[0] += 0.002  # and after it
        return x + 1

    async def meanwhile() -> None:
        now[0] += 5.0  # other tasks' time while `work` waits

    wrapped = loop_gaps.timed(work, "w", recs)
    got = await asyncio.gather(wrapped(1), meanwhile())
    assert got[0] == 2
    assert [(label, round(dt, 6)) for label, _t0, dt in recs] == [("w", 0.001), ("w", 0.002)]

    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("k")

    with pytest.raises(KeyError):
        await loop_gaps.timed(fails, "f", recs)()
    task = asyncio.create_task(loop_gaps.timed(work, "c", recs)(0))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_gap_line_and_its_summary(tmp_path: Path) -> None:
    loop = [("index", 10.0, 0.002), ("index", 10.003, 0.001), ("pull", 10.004, 0.0005), ("index", 9.0, 0.5)]
    cp = [("checkpoint", 9.998, 0.004), ("cp_keys", 11.0, 0.1)]
    line = loop_gaps.gap_line(8.0, 1.0, 6_000_000, 1_000_000, 3, 10.0, 10.008, loop, cp)
    assert line == "GAP 8.0 at 1.0000 cpu 6.0 runnable 1.0 minflt 3 | indexx2=3.0 pullx1=0.5 || checkpoint=2.0\n"
    f = tmp_path / "gaps.txt"
    f.write_text("START 1.0 pid 1\n" + line + loop_gaps.gap_line(6.0, 2.0, 0, 0, 0, 20.0, 20.006, [], []))
    got = loop_gaps.summarize(str(f))
    assert got.splitlines()[0] == ("2 gaps, 14 ms: on a CPU 6, runnable 1, asleep 7; minor faults 3; "
                                   "the checkpoint in 1")
    assert "index: in 1 gaps, median 1.50 ms a call" in got


def test_the_daemon_runs_through_it_and_logs_the_pieces(tmp_path: Path) -> None:
    out = tmp_path / "gaps.txt"
    d = DaemonProcess(tmp_path / "data", command_prefix=[sys.executable, "-m", "bench.loop_gaps"],
                      env={"LOOP_GAPS_OUT": str(out), "LOOP_GAPS_MIN_MS": "0"}).start()
    try:
        produce(d, "t", [{"body": "x", "delay_ms": 60_000}])

        def logged() -> bool:
            return any(" produce" in line and line.startswith("GAP ") for line in out.read_text().splitlines())
        wait_until(logged, 10, 0.05, "a produce request in the gap log")
    finally:
        d.stop()
    assert out.read_text().startswith("START ")
    assert loop_gaps.summarize(str(out)).split()[1] == "gaps,"
