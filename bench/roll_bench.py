"""Rolls: what re-appending far messages costs the daemon, against one real daemon a round.

    .venv/bin/python -m bench.roll_bench [--m 200000] [--waves 3] [--rounds 2] [--command-prefix ...]

A message due beyond the roll window (RIP-43) is parked in a ROLL unit and appended again, a
roll copy, each time that unit fires, every `roll_window_ms` (2 days by default, here
WINDOW_MS so that rolls come every few seconds). Messages produced together far ahead roll
together: a wave of rolls every window. Each round starts a fresh daemon (fsync `always`),
fills `--m` messages (100-byte bodies) due an hour ahead over four connections, and waits for
`--waves` waves (`rolled_total` in /v1/stats reaching waves x m). Prints, a round and as a
median, the daemon's CPU a roll: from the end of the fill until the last wave is done, less what
the daemon spends in that time on the trickle below alone (measured before the fill), over the
rolls made in it (reading the record, appending the copy, indexing it, checkpoints). A wave is as spread out as the fill was (a copy's roll slot
is a window after it was indexed), so its length says nothing; the CPU does. Meanwhile a
trickle on a topic of its own (TRICKLE messages every TRICKLE_EVERY_S, due 1-2 s after they are
produced, one consumer) measures whether releases wait behind the rolls: its lateness (receive
time - deliver_at) p50, p99 and max, and how many came early (must be 0).
`--command-prefix` runs another build (`<tree>/.venv/bin/python -m delayd`), for an A/B of two
trees.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from bench.client import Delayd
from bench.harness import lateness_summary
from bench.produce_keys_bench import cpu_s
from tests.support.daemon import DaemonProcess

BATCH = 1000
WINDOW_MS = 4000
CONFIG = f"roll_window_ms = {WINDOW_MS}\ncheckpoint_interval_ms = 1000\n"
POLL_S = 0.02
TRICKLE, TRICKLE_EVERY_S = 20, 0.05  # 400 msg/s
TRICKLE_ALONE_S = 4.0


async def fill(url: str, m: int, due_ms: int) -> None:
    async with Delayd(url, 4) as client:
        async def worker(first: int) -> None:
            for _ in range(first, m, 4 * BATCH):
                await client.produce("far", [{"body": b"x" * 100, "deliver_at": due_ms + k % 1000} for k in range(BATCH)])
        await asyncio.gather(*(worker(w * BATCH) for w in range(4)))


def rolled(d: DaemonProcess) -> int:
    return int(d.request("GET", "/v1/stats")[1]["rolled_total"])


async def trickle(url: str, stop: asyncio.Event, lateness: list[float]) -> None:
    """Produce TRICKLE messages due 1-2 s ahead every TRICKLE_EVERY_S until `stop`; pull them all."""
    async with Delayd(url, 1) as producer, Delayd(url, 1) as consumer:
        await consumer.pull("near", "g", 1, 0)  # the group, before anything is due
        sent, stopped = 0, float("inf")

        async def produce() -> None:
            nonlocal sent, stopped
            k = 0
            while not stop.is_set():
                t = int(time.time() * 1000)
                await producer.produce("near", [{"body": b"y", "deliver_at": t + 1000 + (k * 37 + i * 53) % 1000}
                                                for i in range(TRICKLE)])
                sent += TRICKLE
                k += 1
                await asyncio.sleep(TRICKLE_EVERY_S)
            stopped = time.monotonic()

        task = asyncio.create_task(produce())
        try:
            while not (task.done() and len(lateness) >= sent):
                if task.done() and time.monotonic() > stopped + 30:
                    raise SystemExit(f"the trickle: {len(lateness)} of {sent} pulled 30 s after it stopped")
                recv, msgs = await consumer.pull("near", "g", 1000, 200, 600_000, ["deliver_at"])
                lateness.extend(recv - msg["deliver_at"] for msg in msgs)
                if msgs:
                    await consumer.ack("near", "g", [msg["receipt"] for msg in msgs])
        finally:
            await task


async def trickle_alone(url: str, seconds: float) -> None:
    stop = asyncio.Event()
    side = asyncio.create_task(trickle(url, stop, []))
    await asyncio.sleep(seconds)
    stop.set()
    await side


async def rolls_with_trickle(d: DaemonProcess, target: int, deadline: float, lateness: list[float]) -> int:
    """Wait (polling /v1/stats) until `target` rolls were made, a trickle running meanwhile."""
    stop = asyncio.Event()
    side = asyncio.create_task(trickle(d.url, stop, lateness))
    try:
        last = 0
        while last < target:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {last} of {target} rolls by the deadline")
            await asyncio.sleep(POLL_S)
            last = await asyncio.to_thread(rolled, d)
        return last
    finally:
        stop.set()
        await side


def one(m: int, waves: int, prefix: list[str] | None) -> tuple[float, dict[str, float]]:
    """The daemon's CPU a roll (µs), and the trickle's lateness summary."""
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp) / "data", config_text=CONFIG, command_prefix=prefix).start()
        try:
            proc = psutil.Process(d.proc.pid)
            t, c = time.monotonic(), cpu_s(proc)
            asyncio.run(trickle_alone(d.url, TRICKLE_ALONE_S))
            trickle_per_s = (cpu_s(proc) - c) / (time.monotonic() - t)
            asyncio.run(fill(d.url, m, int(time.time() * 1000) + 3_600_000))
            t0, c0, r0 = time.monotonic(), cpu_s(proc), rolled(d)
            lateness: list[float] = []
            last = asyncio.run(rolls_with_trickle(d, waves * m, t0 + 60 + waves * (WINDOW_MS / 1000 + m / 10_000),
                                                  lateness))
            t1, c1 = time.monotonic(), cpu_s(proc)
            return (c1 - c0 - trickle_per_s * (t1 - t0)) / (last - r0) * 1e6, lateness_summary(lateness)
        finally:
            d.stop(120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=200_000)
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--command-prefix", default=None, help="how to run another build's daemon")
    args = ap.parse_args()
    prefix = shlex.split(args.command_prefix) if args.command_prefix else None
    got = []
    for r in range(args.rounds):
        got.append(one(args.m, args.waves, prefix))
        per_roll, lat = got[-1]
        print(f"round {r + 1}: daemon CPU a roll {per_roll:.2f} us; trickle of {lat['count']}: lateness p50 "
              f"{lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms, early {lat['early']}",
              flush=True)
    print(f"median: {statistics.median(g[0] for g in got):.2f} us a roll; trickle lateness p99 "
          f"{statistics.median(g[1]['p99_ms'] for g in got):.1f} ms, max {statistics.median(g[1]['max_ms'] for g in got):.1f} ms, "
          f"early {sum(g[1]['early'] for g in got)}")


if __name__ == "__main__":
    main()
