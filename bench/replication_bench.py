"""Replicated produce against a single member, and failover time (issue 16).

    .venv/bin/python -m bench.replication_bench                     # everything, default sizes
    .venv/bin/python -m bench.replication_bench --n 20000 --singles 500 --failovers 1   # quicker
    .venv/bin/python -m bench.replication_bench --only failover --failovers 5

Three phases, each on fresh daemons (`python -m delayd serve --fsync always`, temp data dirs,
free loopback ports) and, for the replicated ones, a fresh single-member etcd (Debian's
`etcd-server`, tests/support/etcd.py):

| phase | what is measured |
|---|---|
| `single` | one daemon without replication: batched produce (N messages in requests of `--batch`, `--connections` at once) in msg/s with the p50/p99 latency of a request; then singles (`--singles` requests of 1 message, `--single-connections` at once) in msg/s and p50/p99 |
| `replicated` | the same against the primary of one shard of `--members` members with `replication_min_insync` = `--min-insync` (default 2): each answer waits for the record to be fsynced on the primary and every in-sync follower (docs/api.md, "Replication") |
| `failover` | `--failovers` times: kill -9 of the primary, then seconds until a produce is answered 200 again (sent to the surviving members, following 421, retrying 503 every 20 ms), and until `GET /v1/cluster` names the new primary; the killed member is restarted and the run waits for it to be in sync again before the next round |

Requests are msgpack over aiohttp, 100-byte bodies, keyed (so a produce retried during failover
can never be stored twice), delays over 1-48 h so nothing falls due. Both systems run on this
machine, like the other benchmarks; the table shows how busy it was (other processes' CPU share).
Results: a table on stdout and JSON (`--json`, default bench/results/replication_bench.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

from bench.harness import log, percentile
from tests.support.daemon import ROOT, DaemonProcess, free_port
from tests.support.etcd import EtcdProcess

PHASES = ("single", "replicated", "failover")
MSGPACK = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
TOPIC = "bench-repl"


# --------------------------------------------------------------------------------------- processes

def member_env(name: str, port: int, etcd: EtcdProcess, min_insync: int, lease_ttl_ms: int) -> dict[str, str]:
    """A member's replication settings, as `delayd serve` reads them from the environment."""
    return {"DELAYD_REPLICATION_ENABLED": "true", "DELAYD_REPLICATION_MEMBER": name,
            "DELAYD_REPLICATION_ADVERTISE_URL": f"http://127.0.0.1:{port}",
            "DELAYD_REPLICATION_ETCD_ENDPOINTS": etcd.endpoint,
            "DELAYD_REPLICATION_LEASE_TTL_MS": str(lease_ttl_ms),
            "DELAYD_REPLICATION_MIN_INSYNC": str(min_insync)}


def get_json(url: str, timeout_s: float = 2.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


class Shard:
    """etcd and the members of one replicated shard, on loopback."""

    def __init__(self, tmp: Path, members: int, min_insync: int, lease_ttl_ms: int) -> None:
        self.etcd = EtcdProcess(tmp / "etcd")
        self.members: list[DaemonProcess] = []
        self.names = [f"s0-{'abcde'[i]}" for i in range(members)]
        self.tmp, self.min_insync, self.lease_ttl_ms = tmp, min_insync, lease_ttl_ms

    def start(self, timeout_s: float) -> None:
        self.etcd.start()
        for name in self.names:
            port = free_port()
            d = DaemonProcess(self.tmp / name, port=port, node_id="s0",
                              env=member_env(name, port, self.etcd, self.min_insync, self.lease_ttl_ms))
            self.members.append(d)
            d.start(wait_ready=False)
        for d in self.members:
            try:
                d.wait_ready(timeout_s)
            except RuntimeError as e:
                if "replication_enabled" in str(e):
                    raise SystemExit("this build of delayd refuses replication_enabled (the replicated data "
                                     "path has not landed); run the benchmark on a build that has it") from None
                raise
        self.wait_in_sync(len(self.members), timeout_s)

    def view(self, among: list[DaemonProcess] | None = None) -> dict[str, Any] | None:
        for d in among or self.members:
            if d.proc is not None and d.proc.poll() is None:
                v = get_json(d.url + "/v1/cluster")
                if isinstance(v, dict) and "members" in v:
                    return v
        return None

    def primary(self) -> DaemonProcess | None:
        primary = (self.view() or {}).get("primary")
        url = primary.get("url") if isinstance(primary, dict) else None
        return next((d for d in self.members if d.url == url), None)

    def wait_in_sync(self, count: int, timeout_s: float) -> float:
        """Seconds until a primary is elected and `count` members are in sync (at least min_insync)."""
        started = time.monotonic()
        need = max(count, self.min_insync)
        while time.monotonic() - started < timeout_s:
            v = self.view()
            if v and v.get("primary") and len((v.get("isr") or {}).get("members") or []) >= need:
                return time.monotonic() - started
            time.sleep(0.05)
        raise TimeoutError(f"no primary with {need} in-sync members after {timeout_s:g}s: {self.view()}")

    def stop(self) -> None:
        for d in self.members:
            try:
                d.stop()
            except subprocess.TimeoutExpired:
                pass
        self.etcd.stop()


# --------------------------------------------------------------------------------------- load

def batches(n: int, size: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    body = b"x" * 100
    out = []
    for b in range(0, n, size):
        msgs = [{"body": body, "key": f"k{seed}-{b + i}", "delay_ms": rng.randint(3_600_000, 48 * 3_600_000)}
                for i in range(min(size, n - b))]
        out.append(msgpack.packb({"messages": msgs}))
    return out


async def produce(url: str, payloads: list[bytes], connections: int) -> dict[str, Any]:
    """Send every payload (connections at once); msg/s and each request's latency."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for p in payloads:
        queue.put_nowait(p)
    latencies: list[float] = []
    messages = 0
    async with aiohttp.ClientSession(headers=MSGPACK) as session:
        async def worker() -> None:
            nonlocal messages
            while not queue.empty():
                data = queue.get_nowait()
                t0 = time.perf_counter()
                async with session.post(f"{url}/v1/topics/{TOPIC}/messages", data=data) as r:
                    raw = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"produce answered {r.status}: {raw[:300]!r}")
                latencies.append((time.perf_counter() - t0) * 1000)
                messages += len(msgpack.unpackb(raw)["messages"])
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        took = time.perf_counter() - started
    s = sorted(latencies)
    return {"messages": messages, "requests": len(s), "seconds": round(took, 3),
            "msg_per_s": round(messages / took, 1), "p50_ms": round(percentile(s, 50) or 0, 2),
            "p99_ms": round(percentile(s, 99) or 0, 2), "max_ms": round(s[-1], 2) if s else None}


def measure(url: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    batched = asyncio.run(produce(url, batches(args.n, args.batch, seed), args.connections))
    log(f"  batched: {batched['msg_per_s']:,.0f} msg/s, request p50 {batched['p50_ms']} ms p99 {batched['p99_ms']} ms")
    singles = asyncio.run(produce(url, batches(args.singles, 1, seed + 1), args.single_connections))
    log(f"  singles: {singles['msg_per_s']:,.0f} msg/s, p50 {singles['p50_ms']} ms p99 {singles['p99_ms']} ms")
    return {"batched": batched, "singles": singles}


# --------------------------------------------------------------------------------------- failover

async def produce_until_answered(urls: list[str], deadline_s: float, key: str) -> tuple[float, str]:
    """Seconds until one keyed produce is answered 200 by the shard, and the URL that answered."""
    data = msgpack.packb({"body": b"failover", "key": key, "delay_ms": 3_600_000})
    started = time.monotonic()
    turn = 0
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(headers=MSGPACK, timeout=timeout) as session:
        target = urls[0]
        while time.monotonic() - started < deadline_s:
            try:
                async with session.post(f"{target}/v1/topics/{TOPIC}/messages", data=data) as r:
                    raw = await r.read()
                    if r.status == 200:
                        return time.monotonic() - started, target
                    if r.status == 421:
                        primary = (msgpack.unpackb(raw).get("error") or {}).get("primary")
                        if primary:
                            target = primary.rstrip("/")
                            continue
            except (aiohttp.ClientError, TimeoutError):
                pass
            turn += 1
            target = urls[turn % len(urls)]
            await asyncio.sleep(0.02)
    raise TimeoutError(f"no produce answered within {deadline_s:g}s of the kill")


def failover(shard: Shard, rounds: int, timeout_s: float) -> list[dict[str, Any]]:
    out = []
    for i in range(rounds):
        old = shard.primary()
        if old is None:
            raise RuntimeError("no primary before the kill")
        survivors = [d for d in shard.members if d is not old]
        old_epoch = (shard.view() or {}).get("epoch")
        killed_at = time.monotonic()
        old.kill9()
        answered_s, by = asyncio.run(produce_until_answered([d.url for d in survivors], timeout_s, f"fo-{i}"))
        elected_s = None
        while time.monotonic() - killed_at < timeout_s:
            v = shard.view(survivors)
            if v and v.get("primary") and v.get("epoch") != old_epoch:
                elected_s = time.monotonic() - killed_at
                break
            time.sleep(0.02)
        log(f"  round {i + 1}: produce answered {answered_s:.2f} s after kill -9 (by {by}); "
            f"new primary seen after {elected_s if elected_s is None else round(elected_s, 2)} s")
        old.start(wait_ready=True, timeout_s=timeout_s)
        rejoin_s = shard.wait_in_sync(len(shard.members), timeout_s)
        out.append({"round": i + 1, "answered_s": round(answered_s, 3),
                    "elected_s": None if elected_s is None else round(elected_s, 3),
                    "rejoined_in_sync_s": round(rejoin_s, 3)})
    return out


# --------------------------------------------------------------------------------------- main

def machine() -> dict[str, Any]:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "git": rev.stdout.strip() or None, "command": " ".join(sys.argv)}


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def table(results: dict[str, Any]) -> str:
    rows = [("", "msg/s", "p50 ms", "p99 ms")]
    for phase in ("single", "replicated"):
        for kind in ("batched", "singles"):
            r = (results.get(phase) or {}).get(kind)
            if r:
                rows.append((f"{phase} {kind}", f"{r['msg_per_s']:,.0f}", str(r["p50_ms"]), str(r["p99_ms"])))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    for f in results.get("failover") or []:
        lines.append(f"failover round {f['round']}: produce answered {f['answered_s']} s after kill -9, "
                     f"new primary seen {f['elected_s']} s, old primary in sync again {f['rejoined_in_sync_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replication_bench",
                                 description="Replicated produce (min_insync copies) vs a single member, and the "
                                 "time a shard takes to answer produce again after kill -9 of its primary.")
    ap.add_argument("--only", default=",".join(PHASES), help=f"comma-separated phases of {','.join(PHASES)}")
    ap.add_argument("--n", type=int, default=100_000, help="messages produced in batches (default 100,000)")
    ap.add_argument("--batch", type=int, default=1_000, help="messages per batched request (default 1,000)")
    ap.add_argument("--connections", type=int, default=4, help="batched requests at once (default 4)")
    ap.add_argument("--singles", type=int, default=3_000, help="requests of one message (default 3,000)")
    ap.add_argument("--single-connections", type=int, default=8, help="single requests at once (default 8)")
    ap.add_argument("--members", type=int, default=3, help="members of the replicated shard (default 3)")
    ap.add_argument("--min-insync", type=int, default=2, help="replication_min_insync (default 2)")
    ap.add_argument("--lease-ttl-ms", type=int, default=3_000, help="replication_lease_ttl_ms (default 3000)")
    ap.add_argument("--failovers", type=int, default=3, help="kill -9 rounds (default 3)")
    ap.add_argument("--timeout", type=float, default=60.0, metavar="S", help="bound of each wait (default 60 s)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "replication_bench.json"), metavar="FILE")
    args = ap.parse_args(argv)
    phases = [p for p in args.only.split(",") if p]
    unknown = set(phases) - set(PHASES)
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}; choose from {PHASES}")
    results: dict[str, Any] = {"machine": machine(), "settings": {k: v for k, v in vars(args).items() if k != "json"}}
    with sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="delayd-repl-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if "single" in phases:
            log("single member (no replication)")
            d = DaemonProcess(tmp / "single", node_id="s0").start()
            try:
                results["single"] = measure(d.url, args, seed=1)
            finally:
                d.stop()
        if "replicated" in phases or "failover" in phases:
            log(f"replicated: {args.members} members, min_insync {args.min_insync}, etcd on loopback")
            shard = Shard(tmp / "shard", args.members, args.min_insync, args.lease_ttl_ms)
            try:
                shard.start(args.timeout)
                if "replicated" in phases:
                    primary = shard.primary()
                    assert primary is not None
                    results["replicated"] = measure(primary.url, args, seed=3)
                if "failover" in phases:
                    results["failover"] = failover(shard, args.failovers, args.timeout)
            finally:
                shard.stop()
    print(table(results))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
