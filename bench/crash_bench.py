"""Restart after a kill -9 under load, against one real daemon a round.

    .venv/bin/python -m bench.crash_bench [--rounds 3] [--seconds 3] [--keyed] [--command-prefix ...]

The `restart` workload of bench.daemon_vs_redis kills an idle daemon: its last checkpoint covers
almost everything. Killed while it produces as fast as it takes messages, a daemon leaves the
records appended since its last checkpoint (a checkpoint a second: a second's produce or more)
for recovery to re-index, and the TimerLog units written for them to unlink. Each round starts a
fresh daemon (fsync `always`), produces over 8 connections batches of 1,000 messages (100-byte
bodies due 1-48 h ahead; `--keyed`: a random key each, a 429's Retry-After honoured), kills it
with SIGKILL after `--seconds`, then starts it again on the same directory and times spawn to
/readyz 200. Prints, a round and as medians: the records its recovery line says it re-indexed,
the recovery's own seconds, spawn to ready, and the recovery's microseconds a record.
`--command-prefix` runs another build (`<tree>/.venv/bin/python -m delayd`), for an A/B of two
trees.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import shlex
import statistics
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import msgpack

from bench.produce_keys_bench import post_batches, random_keyed, sustain_produce
from tests.support.daemon import DaemonProcess

CONNECTIONS = 8
RECOVERY = re.compile(r"recovery done in ([0-9.]+)s: .*?; (\d+) records re-indexed")


def keyless_batches(n: int) -> list[bytes]:
    rng = random.Random(1)
    return [msgpack.packb({"messages": [{"body": b"x" * 100, "delay_ms": rng.randint(3_600_000, 48 * 3_600_000)}
                                        for _ in range(1000)]}) for _ in range(n // 1000)]


def produce_until_killed(d: DaemonProcess, seconds: float, keyed: bool, batches: list[bytes]) -> None:
    """Produce as fast as the daemon takes it; SIGKILL the daemon after `seconds`."""
    killer = threading.Timer(seconds, d.kill9)
    killer.start()
    try:
        with contextlib.suppress(aiohttp.ClientError, AssertionError):  # (the kill cuts the requests)
            if keyed:
                asyncio.run(sustain_produce(d.url, 100_000_000, CONNECTIONS, random_keyed))
            else:
                while True:  # the batches again until the kill
                    asyncio.run(post_batches(d.url, batches, CONNECTIONS))
    finally:
        killer.join()


def one_round(seconds: float, keyed: bool, prefix: list[str] | None, batches: list[bytes]) -> tuple[int, float, float]:
    """(records re-indexed, recovery seconds, spawn to ready seconds) of one kill -9 under load."""
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp) / "data", command_prefix=prefix).start()
        try:
            produce_until_killed(d, seconds, keyed, batches)
            t = time.perf_counter()
            d.start(timeout_s=300)
            ready = time.perf_counter() - t
            found = RECOVERY.findall(d.log_tail(400))
            if not found:
                raise RuntimeError("no recovery line in the daemon's log:\n" + d.log_tail())
            took, records = found[-1]
            return int(records), float(took), ready
        finally:
            d.stop(120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="produce this long before the kill")
    ap.add_argument("--keyed", action="store_true", help="a random key on every message")
    ap.add_argument("--command-prefix", default=None, help="how to run another build's daemon")
    args = ap.parse_args()
    prefix = shlex.split(args.command_prefix) if args.command_prefix else None
    batches = [] if args.keyed else keyless_batches(200_000)
    rows = []
    for r in range(args.rounds):
        records, took, ready = one_round(args.seconds, args.keyed, prefix, batches)
        rows.append((records, took, ready))
        print(f"round {r + 1}: {records:,} records re-indexed; recovery {took:.2f} s, spawn to ready {ready:.2f} s, "
              f"{took / max(records, 1) * 1e6:.2f} us a record", flush=True)
    med = [statistics.median(x[i] for x in rows) for i in range(3)]
    print(f"median ({'keyed' if args.keyed else 'keyless'}, {args.seconds:g} s of produce before the kill): "
          f"{med[0]:,.0f} records re-indexed, recovery {med[1]:.2f} s, spawn to ready {med[2]:.2f} s, "
          f"{statistics.median(x[1] / max(x[0], 1) for x in rows) * 1e6:.2f} us a record")


if __name__ == "__main__":
    main()
