"""Rolls: what re-appending far messages costs the daemon, against one real daemon a round.

    .venv/bin/python -m bench.roll_bench [--m 200000] [--waves 3] [--rounds 2] [--command-prefix ...]

A message due beyond the roll window (RIP-43) is parked in a ROLL unit and appended again, a
roll copy, each time that unit fires, every `roll_window_ms` (2 days by default, here
WINDOW_MS so that rolls come every few seconds). Messages produced together far ahead roll
together: a wave of rolls every window. Each round starts a fresh daemon (fsync `always`),
fills `--m` messages (100-byte bodies) due an hour ahead over four connections, and waits for
`--waves` waves (`rolled_total` in /v1/stats reaching waves x m). Prints, a round and as a
median, the daemon's CPU a roll: from the end of the fill until the last wave is done, less what
the idle daemon spends in that time, over the rolls made in it (reading the record, appending
the copy, indexing it, checkpoints). A wave is as spread out as the fill was (a copy's roll slot
is a window after it was indexed), so its length says nothing; the CPU does.
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
from bench.produce_keys_bench import cpu_s
from tests.support.daemon import DaemonProcess

BATCH = 1000
WINDOW_MS = 4000
CONFIG = f"roll_window_ms = {WINDOW_MS}\ncheckpoint_interval_ms = 1000\n"
POLL_S = 0.02


async def fill(url: str, m: int, due_ms: int) -> None:
    async with Delayd(url, 4) as client:
        async def worker(first: int) -> None:
            for _ in range(first, m, 4 * BATCH):
                await client.produce("far", [{"body": b"x" * 100, "deliver_at": due_ms + k % 1000} for k in range(BATCH)])
        await asyncio.gather(*(worker(w * BATCH) for w in range(4)))


def rolled(d: DaemonProcess) -> int:
    return int(d.request("GET", "/v1/stats")[1]["rolled_total"])


def one(m: int, waves: int, prefix: list[str] | None) -> float:
    """The daemon's CPU a roll, µs."""
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp) / "data", config_text=CONFIG, command_prefix=prefix).start()
        try:
            proc = psutil.Process(d.proc.pid)
            c = cpu_s(proc)
            time.sleep(1)
            idle_per_s = cpu_s(proc) - c
            asyncio.run(fill(d.url, m, int(time.time() * 1000) + 3_600_000))
            t0, c0, r0 = time.monotonic(), cpu_s(proc), rolled(d)
            deadline = t0 + 60 + waves * (WINDOW_MS / 1000 + m / 10_000)
            last = r0
            while last < waves * m:
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {last} of {waves * m} rolls after {time.monotonic() - t0:.0f} s")
                time.sleep(POLL_S)
                last = rolled(d)
            t1, c1 = time.monotonic(), cpu_s(proc)
            return (c1 - c0 - idle_per_s * (t1 - t0)) / (last - r0) * 1e6
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
        print(f"round {r + 1}: daemon CPU a roll {got[-1]:.2f} us", flush=True)
    print(f"median: {statistics.median(got):.2f} us a roll")


if __name__ == "__main__":
    main()
