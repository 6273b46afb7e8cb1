"""delayd vs a Redis sorted-set delay queue, side by side in one run (issue 5).

Starts the real daemon (`python -m delayd serve`, fresh temp data dir, `--fsync always`) and a
real `redis-server` (free loopback port, `--appendonly yes --appendfsync everysec --save ''`,
its own temp dir), runs the same workloads against both, prints one table with the ratio
delayd/redis and writes everything as JSON.

Redis is used the way Python users build delay queues on it: ZADD member=id score=due-ms plus
the payload in a hash (HSET), written in pipelined batches with redis-py; consumers run a Lua
script that atomically pops due ids (ZRANGEBYSCORE ... LIMIT + ZREM) and their payloads
(HMGET + HDEL), polled every 10 ms when nothing is due.

Workloads (each gets a fresh daemon and a fresh redis-server; only one server runs at a time so
that the two never compete for the machine's cores):

  produce   N messages (100-byte bodies, delays spread over 1-48 h), batches of 1,000 over
            HTTP msgpack, several concurrent connections -> msg/s, server CPU per message
  accuracy  20,000 messages due 1-6 s ahead, one long-polling consumer -> lateness
            p50/p99/max and early count (receive wall-clock ms - deliver_at, consumer side)
  burst     M messages due in the same second -> seconds from that second until one consumer
            (pull max=1000, acks in batches) has pulled them all, server CPU per delivery
  memory    P pending far-future messages -> daemon RSS; redis used_memory and RSS
  restart   kill -9 with P pending -> seconds until /readyz is 200 (redis: until it answers
            and finished loading its AOF), and until a message due while it was down arrives

The client is pure Python (aiohttp + msgpack, redis-py + hiredis) on the same machine as the
servers, so its CPU use is reported next to every throughput number.

The parts: `bench.harness` (processes, CPU/RSS, profiles), `bench.peers` (the two systems behind
one interface), `bench.workloads`, `bench.report` (table, JSON, Markdown); this module wires them.
Run `bench/install_peer.sh` once (redis-server, redis-py, hiredis, psutil), then from the
repository root, e.g.

    .venv/bin/python -m bench.daemon_vs_redis                       # defaults, ~5-10 min
    .venv/bin/python -m bench.daemon_vs_redis --only produce,memory --scale 10
    .venv/bin/python -m bench.daemon_vs_redis --scale 0.02 --only accuracy   # quick check
    .venv/bin/python -m bench.daemon_vs_redis --smoke               # does it still run? ~15 s
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import log, psutil, run_side, stop_all_children
from bench.peers import PeerOptions, redis_queue
from bench.report import ROOT, SIDES, display_python, git_rev, machine_info, publish, table_rows
from bench.workloads import (
    SECTIONS,
    WORKLOADS,
    Accuracy,
    AccuracyLoad,
    Burst,
    Ctx,
    Pending,
    Produce,
    Workload,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.daemon_vs_redis",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)"
    )
    ap.add_argument("--skip", default="", help="'redis' or 'delayd' to run one side only")
    ap.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiplier for the produce N, burst M and pending P counts (10 -> 2M/10M/10M)",
    )
    ap.add_argument("--produce-n", type=int, default=200_000)
    ap.add_argument("--accuracy-n", type=int, default=20_000)
    ap.add_argument("--burst-m", type=int, default=1_000_000)
    ap.add_argument("--pending-p", type=int, default=1_000_000)
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest configuration of every workload (ignores the sizes above): checks that the "
        "benchmark runs end to end; its numbers mean nothing",
    )
    ap.add_argument("--connections", type=int, default=4, help="concurrent producer connections")
    ap.add_argument(
        "--redis-poll-ms", type=float, default=10.0, help="redis consumer poll interval when nothing is due"
    )
    ap.add_argument(
        "--pull-all-fields", action="store_true",
        help="delayd's consumers pull every field of a message (default: id, receipt and deliver_at, what they read)",
    )
    ap.add_argument(
        "--burst-rate-guess",
        type=float,
        default=20_000.0,
        help="fill rate assumed to place the burst second when no rate was measured",
    )
    ap.add_argument("--keyed-load", action="store_true",
                    help="accuracy_load's concurrent producer gives each message a key of its own")
    ap.add_argument("--timeout-factor", type=float, default=1.0, help="scale every workload's time bound")
    ap.add_argument(
        "--json",
        default=str(ROOT / "bench" / "results" / "daemon_vs_redis.json"),
        help="where to write the results (default: bench/results/daemon_vs_redis.json)",
    )
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    ap.add_argument(
        "--markdown-out",
        default=None,
        metavar="FILE",
        help="write a Markdown block (machine, command, table) for BENCHMARKS.md to FILE",
    )
    ap.add_argument("--tmp-dir", default=None, help="parent for the temp data dirs (default: system temp)")
    ap.add_argument("--keep-dirs", action="store_true", help="keep data dirs and server logs")
    ap.add_argument("--redis-server", default=None, help="redis-server binary (default: from PATH)")
    ap.add_argument(
        "--daemon-cmd",
        default=None,
        help="command that replaces 'python -m delayd' (e.g. another build's venv python -m delayd)",
    )
    ap.add_argument(
        "--py-spy",
        default=None,
        metavar="DIR",
        help="record each daemon with py-spy (raw collapsed stacks in DIR) and put its hot spots in the JSON",
    )
    ap.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="extra argument for 'python -m delayd serve' (repeatable)",
    )
    args = ap.parse_args(argv)
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    bad = [w for w in args.only if w not in SECTIONS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; choose from {SECTIONS}")
    args.skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    return args


def build_workloads(args: argparse.Namespace) -> list[Workload]:
    """The workloads --only selects, sized by the flags (or their smallest, with --smoke)."""
    if args.smoke:
        chosen = [cls.smoke() for cls in WORKLOADS]
    else:
        chosen = [
            Produce(n=int(args.produce_n * args.scale)),
            Accuracy(n=args.accuracy_n),
            AccuracyLoad(n=args.accuracy_n),
            Burst(m=int(args.burst_m * args.scale)),
            Pending(p=int(args.pending_p * args.scale)),
        ]
    for wl in chosen:
        if isinstance(wl, AccuracyLoad):
            wl.keyed = args.keyed_load
        if isinstance(wl, Pending):
            wl.memory, wl.restart = "memory" in args.only, "restart" in args.only
    return [wl for wl in chosen if any(s in args.only for s in wl.sections)]


async def run_one(ctx: Ctx, wl: Workload, side: str) -> dict[str, Any]:
    async with ctx.peer(side, wl.tag) as peer:
        return await wl.run(ctx, peer)


async def run_all(ctx: Ctx, workloads: list[Workload], sides: list[str], results: dict[str, Any]) -> None:
    for wl in workloads:
        for side in sides:
            res = await run_side(wl.label, side, run_one(ctx, wl, side))
            for section, part in wl.split(res).items():
                results.setdefault(section, {})[side] = part


def command_line(argv: list[str] | None) -> str | list[str]:
    if argv is not None:
        return argv
    spec = globals().get("__spec__")
    prog = ["-m", spec.name] if spec is not None and spec.name else [sys.argv[0]]
    return " ".join([display_python(), *prog, *sys.argv[1:]])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    redis_bin = args.redis_server or shutil.which("redis-server")
    if "redis" not in args.skip and (redis_queue.redis is None or not redis_bin):
        print("redis-server or redis-py missing: run bench/install_peer.sh", file=sys.stderr)
        return 2
    if psutil is None:
        print("psutil missing: run bench/install_peer.sh", file=sys.stderr)
        return 2

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # Both signals unwind through the `finally` below, which stops every server we started.
    # SIGINT explicitly too: a shell starts background jobs with SIGINT ignored.
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    base_tmp = Path(tempfile.mkdtemp(prefix="delayd-bench-", dir=args.tmp_dir))
    options = PeerOptions(
        daemon_cmd=args.daemon_cmd.split() if args.daemon_cmd else None,
        daemon_args=list(args.daemon_arg),
        profile_dir=Path(args.py_spy) if args.py_spy else None,
        redis_bin=redis_bin or "",
        redis_poll_ms=args.redis_poll_ms,
        pull_all_fields=args.pull_all_fields,
    )
    ctx = Ctx(
        base_tmp=base_tmp,
        peer_options=options,
        connections=args.connections,
        timeout_factor=args.timeout_factor,
        burst_rate_guess=args.burst_rate_guess,
    )
    workloads = build_workloads(args)
    sides = [s for s in SIDES if s not in args.skip]
    results: dict[str, Any] = {}
    started = time.time()
    meta: dict[str, Any] = {
        "command": command_line(argv),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "machine": machine_info(),
        "git_rev": git_rev(),
        "redis_server": subprocess.run([redis_bin, "--version"], capture_output=True, text=True).stdout.strip()
        if redis_bin
        else None,
        "redis_py": getattr(redis_queue.redis, "__version__", None),
        "settings": dict(vars(args)),
        "tmp_dir": str(base_tmp),
    }
    try:
        import uvloop

        runner: Callable[..., Any] = uvloop.run
        meta["client_loop"] = "uvloop"
    except ImportError:
        runner = asyncio.run
        meta["client_loop"] = "asyncio"
    rc = 0
    try:
        runner(run_all(ctx, workloads, sides, results))
    except KeyboardInterrupt:
        log("interrupted; stopping servers")
        rc = 130
    finally:
        stop_all_children()
        meta["duration_s"] = time.time() - started
        rows = table_rows(results, workloads, SECTIONS)
        errors = publish(
            results, meta, rows, markdown=args.markdown, json_path=args.json, markdown_out=args.markdown_out
        )
        if errors and rc == 0:
            rc = 1
        if args.keep_dirs:
            log(f"data dirs and server logs kept in {base_tmp}")
        else:
            shutil.rmtree(base_tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
