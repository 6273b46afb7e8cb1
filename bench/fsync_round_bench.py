"""What one group-commit fsync round costs the event loop: through a worker thread of the loop's
executor (how the group commit fsynced until the seventeenth session) against `storage.fsyncer`'s
`Fsyncer` (a thread of the compiled core that never takes the GIL).

    .venv/bin/python -m bench.fsync_round_bench [--rounds 3] [--n 2000]

Each round: `--n` fsyncs, one after another, of a duplicated descriptor of a one-byte file in a
temp directory, on uvloop; printed are the wall time and the loop thread's CPU
(`time.thread_time`) a fsync, for both ways, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

import uvloop
from delayd.storage.fsyncer import Fsyncer
from delayd.storage.segments import fsync_all


async def run(rounds: int, n: int) -> None:
    loop = asyncio.get_running_loop()
    fsyncer = Fsyncer()
    with tempfile.TemporaryDirectory() as d:
        fd = os.open(os.path.join(d, "f"), os.O_RDWR | os.O_CREAT)
        os.write(fd, b"x")
        try:
            for r in range(rounds):
                for way in ("executor", "Fsyncer"):
                    wall, cpu = time.perf_counter(), time.thread_time()
                    for _ in range(n):
                        if way == "executor":
                            await loop.run_in_executor(None, fsync_all, [os.dup(fd)])
                        else:
                            await fsyncer.sync([os.dup(fd)])
                    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                    print(f"round {r + 1} {way:8s}: wall {wall / n * 1e6:.0f} us, "
                          f"the loop thread's CPU {cpu / n * 1e6:.0f} us a fsync", flush=True)
        finally:
            fsyncer.close()
            os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    uvloop.run(run(args.rounds, args.n))


if __name__ == "__main__":
    main()
