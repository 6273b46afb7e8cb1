#!/usr/bin/env python3
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
            HTTP msgpack, several concurrent connections -> msg/s
  accuracy  20,000 messages due 1-6 s ahead, one long-polling consumer -> lateness
            p50/p99/max and early count (receive wall-clock ms - deliver_at, consumer side)
  burst     M messages due in the same second -> seconds from that second until one consumer
            (pull max=1000, acks in batches) has pulled them all
  memory    P pending far-future messages -> daemon RSS; redis used_memory and RSS
  restart   kill -9 with P pending -> seconds until /readyz is 200 (redis: until it answers
            and finished loading its AOF), and until a message due while it was down arrives

The client is pure Python (aiohttp + msgpack, redis-py + hiredis) on the same machine as the
servers, so its CPU use is reported next to every throughput number.

Run `bench/install_peer.sh` once (redis-server, redis-py, hiredis, psutil), then e.g.

    .venv/bin/python bench/daemon_vs_redis.py                       # defaults, ~5-10 min
    .venv/bin/python bench/daemon_vs_redis.py --only produce,memory --scale 10
    .venv/bin/python bench/daemon_vs_redis.py --scale 0.02 --only accuracy   # quick check
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

try:
    import psutil
except ImportError:  # pragma: no cover - reported at startup
    psutil = None

try:
    import redis
    import redis.asyncio as aioredis
except ImportError:  # pragma: no cover - reported at startup
    redis = None  # type: ignore[assignment]
    aioredis = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[1]
MSGPACK = "application/msgpack"
HDRS = {"Content-Type": MSGPACK, "Accept": MSGPACK}
BATCH = 1000
HOUR_MS = 3_600_000

# Design targets (shared/DESIGN.md, "Targets").
TARGET_PRODUCE_MSGS = 100_000
TARGET_PRODUCE_RATIO = 3.0
TARGET_P99_MS = 10.0
TARGET_BURST_S = 5.0
TARGET_RSS_MB = 150.0
TARGET_READY_S = 2.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def now_ms_f() -> float:
    return time.time_ns() / 1e6


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(sorted_vals: list[float], p: float) -> float | None:
    if not sorted_vals:
        return None
    k = (len(sorted_vals) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return float(sorted_vals[lo])
    return float(sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo))


def lateness_summary(lat: list[float]) -> dict[str, Any]:
    s = sorted(lat)
    return {
        "count": len(s),
        "early": sum(1 for x in s if x < 0),
        "min_ms": s[0] if s else None,
        "p50_ms": percentile(s, 50),
        "p90_ms": percentile(s, 90),
        "p99_ms": percentile(s, 99),
        "p999_ms": percentile(s, 99.9),
        "max_ms": s[-1] if s else None,
        "mean_ms": (sum(s) / len(s)) if s else None,
    }


def lateness_shape(pairs: list[tuple[int, float]], late_ms: float = 10.0) -> dict[str, Any]:
    """Where the late ones are: by position of deliver_at inside its wall-clock second (100 ms
    buckets: slot-boundary effects with a 1 s wheel precision show up in bucket 0), and the
    worst 100 ms windows of deliver_at."""
    by_pos = [0] * 10
    windows: dict[int, list[float]] = {}
    for due, lat in pairs:
        if lat > late_ms:
            by_pos[(due % 1000) // 100] += 1
            windows.setdefault(due // 100 * 100, []).append(lat)
    worst = sorted(windows.items(), key=lambda kv: -max(kv[1]))[:8]
    return {
        "late_threshold_ms": late_ms,
        "late_count": sum(by_pos),
        "late_by_ms_in_second_100ms_buckets": by_pos,
        "worst_windows": [{"deliver_at_from": w, "late_msgs": len(v), "max_ms": max(v)} for w, v in worst],
    }


class Bodies:
    """A pool of distinct random 100-byte bodies, cycled (content is irrelevant; no compression)."""

    def __init__(self, size: int, pool: int = 4096, seed: int = 5) -> None:
        rnd = random.Random(seed)
        self.pool = [rnd.randbytes(size) for _ in range(pool)]
        self.size = size

    def __getitem__(self, i: int) -> bytes:
        return self.pool[i % len(self.pool)]


# ----------------------------------------------------------------------------------------------
# Child processes: every one is registered and stopped at exit, also on Ctrl-C or an exception.
# ----------------------------------------------------------------------------------------------

_CHILDREN: list[ServerProc] = []


def stop_all_children() -> None:
    for spy in list(_SPIES):
        with contextlib.suppress(Exception):
            spy.stop()
    for child in list(_CHILDREN):
        with contextlib.suppress(Exception):
            child.stop()


atexit.register(stop_all_children)


class ServerProc:
    name = "server"
    # Count forked children in CPU/RSS? Yes for the daemon (helpers are part of it); no for
    # redis, whose only children are copy-on-write fork snapshots (AOF rewrite) sharing its pages.
    rss_includes_children = True

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.name}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def spawn(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "ab") as logf:
            # Own session: a Ctrl-C in the terminal reaches only us; we stop the children in order.
            self.proc = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                env=env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if self not in _CHILDREN:
            _CHILDREN.append(self)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            rc = None if self.proc is None else self.proc.returncode
            raise RuntimeError(f"{self.name} exited (rc={rc}):\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self in _CHILDREN:
            _CHILDREN.remove(self)

    # Resource use, from the kernel's view of the process (and any children it forked).
    def _procs(self) -> list[Any]:
        if psutil is None or not self.alive():
            return []
        p = psutil.Process(self.pid)
        try:
            return [p, *p.children(recursive=True)]
        except psutil.Error:
            return [p]

    def cpu_s(self) -> float:
        total = 0.0
        for p in self._procs():
            with contextlib.suppress(Exception):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def rss_bytes(self) -> int:
        procs = self._procs() if self.rss_includes_children else self._procs()[:1]
        total = 0
        for p in procs:
            with contextlib.suppress(Exception):
                total += p.memory_info().rss
        return total

    def vm_status(self) -> dict[str, int]:
        """VmRSS / VmHWM of the main process from /proc (bytes)."""
        out: dict[str, int] = {}
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError):
            pass
        return out


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, f)).st_blocks * 512
    return total


class PySpy:
    """`py-spy record --format raw` attached to one pid; collapsed stacks for summarize_profile()."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.proc = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                "100",
                "--nonblocking",
                "--subprocesses",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _SPIES.append(self)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self in _SPIES:
            _SPIES.remove(self)


_SPIES: list[PySpy] = []
_LINENO = re.compile(r":\d+\)$")
PROFILES: dict[str, dict[str, Any]] = {}


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample shares per frame ("func (file:line)") from a collapsed-stack file."""
    total = 0
    self_c: dict[str, int] = {}
    incl_c: dict[str, int] = {}
    self_fn: dict[str, int] = {}  # self samples per function (line numbers dropped)
    incl_fn: dict[str, int] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {"error": f"no profile at {path}"}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = stack.split(";")
        total += c
        self_c[frames[-1]] = self_c.get(frames[-1], 0) + c
        for f in set(frames):
            incl_c[f] = incl_c.get(f, 0) + c
        fns = [_LINENO.sub(")", f) for f in frames]
        self_fn[fns[-1]] = self_fn.get(fns[-1], 0) + c
        for f in set(fns):
            incl_fn[f] = incl_fn.get(f, 0) + c

    def topn(d: dict[str, int]) -> list[list[Any]]:
        return [[f, round(100 * c / total, 1)] for f, c in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {
        "file": str(path),
        "samples": total,
        "self_pct": topn(self_c),
        "self_by_function_pct": topn(self_fn),
        "inclusive_by_function_pct": topn(incl_fn),
        "inclusive_pct": topn(incl_c),
    }


class DaemonServer(ServerProc):
    name = "delayd"

    def __init__(self, workdir: Path, args: argparse.Namespace) -> None:
        super().__init__(workdir)
        self.data_dir = workdir / "data"
        self.extra_args = list(args.daemon_arg)
        self.prefix = args.daemon_cmd.split() if args.daemon_cmd else [sys.executable, "-m", "delayd"]
        self.profile_dir = Path(args.py_spy) if args.py_spy else None
        self.spies: list[PySpy] = []
        self.profiles: list[Path] = []

    def spawn(self) -> None:
        super().spawn()
        if self.profile_dir is not None:
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            tag = self.workdir.name.rsplit("-", 1)[0] + (
                "" if not self.profiles else f"-{len(self.profiles)}"
            )
            out = self.profile_dir / f"{tag}.txt"
            self.profiles.append(out)
            self.spies.append(PySpy(self.pid, out))

    def stop(self, timeout_s: float = 20.0) -> None:
        for spy in self.spies:
            spy.stop()
        super().stop(timeout_s)
        for path in self.profiles:
            if path.stem not in PROFILES:
                PROFILES[path.stem] = summarize_profile(path)

    def kill9(self) -> None:
        super().kill9()
        for spy in self.spies:
            spy.stop()

    def profile_phase(self, tag: str) -> None:
        """Start a separate profile (DIR/<tag>.txt) from now on, e.g. only the drain of a burst."""
        if self.profile_dir is None:
            return
        for spy in self.spies:
            spy.stop()
        out = self.profile_dir / f"{tag}.txt"
        self.profiles.append(out)
        self.spies.append(PySpy(self.pid, out))

    def profile_summaries(self) -> list[dict[str, Any]]:
        return [summarize_profile(p) for p in self.profiles]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            *self.prefix,
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--fsync",
            "always",
            *self.extra_args,
        ]

    async def wait_ready(self, timeout_s: float) -> float:
        """Poll /readyz every 5 ms; returns the monotonic time it first answered 200."""
        deadline = time.monotonic() + timeout_s
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            while True:
                self.check_alive()
                try:
                    async with s.get(self.url + "/readyz") as r:
                        await r.read()
                        if r.status == 200:
                            return time.monotonic()
                except (TimeoutError, aiohttp.ClientError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"delayd not ready after {timeout_s}s:\n{self.log_tail()}")
                await asyncio.sleep(0.005)

    async def start(self, timeout_s: float = 60.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.spawn()
        await self.wait_ready(timeout_s)

    def disk_bytes(self) -> int:
        return dir_bytes(self.data_dir)


class RedisServer(ServerProc):
    name = "redis"
    rss_includes_children = False

    def __init__(self, workdir: Path, binary: str) -> None:
        super().__init__(workdir)
        self.data_dir = workdir / "redis-data"
        self.binary = binary

    def command(self) -> list[str]:
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            "",
        ]

    async def wait_ready(self, timeout_s: float) -> float:
        """Until PING answers and the AOF is loaded; returns the monotonic time it was."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            r = aioredis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
            try:
                await r.ping()
                info = await r.info("persistence")
                if int(info.get("loading", 0)) == 0:
                    return time.monotonic()
            except (
                redis.exceptions.ConnectionError,
                redis.exceptions.BusyLoadingError,
                redis.exceptions.TimeoutError,
                OSError,
            ):
                pass
            finally:
                await r.aclose()
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis not ready after {timeout_s}s:\n{self.log_tail()}")
            await asyncio.sleep(0.005)

    async def start(self, timeout_s: float = 60.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.spawn()
        await self.wait_ready(timeout_s)

    def client(self, max_connections: int = 16) -> Any:
        pool = aioredis.BlockingConnectionPool(
            host="127.0.0.1", port=self.port, max_connections=max_connections, timeout=60
        )
        return aioredis.Redis(connection_pool=pool)

    def disk_bytes(self) -> int:
        return dir_bytes(self.data_dir)


# ----------------------------------------------------------------------------------------------
# delayd client (pure Python: aiohttp + msgpack), written against shared/API.md
# ----------------------------------------------------------------------------------------------


class HttpError(RuntimeError):
    pass


@dataclass
class ClientStats:
    encode_s: float = 0.0  # building message dicts + msgpack.packb (delayd) / building mappings (redis)
    decode_s: float = 0.0  # msgpack.unpackb of responses
    requests: int = 0
    retries_429: int = 0
    batch_rtt_ms: list[float] = field(default_factory=list)  # produce request -> answer, per batch

    def rtt_summary(self) -> dict[str, float | None]:
        s = sorted(self.batch_rtt_ms)
        return {
            "batch_rtt_p50_ms": percentile(s, 50),
            "batch_rtt_p99_ms": percentile(s, 99),
            "batch_rtt_max_ms": s[-1] if s else None,
        }


class Delayd:
    def __init__(self, url: str, connections: int) -> None:
        self.url = url
        self.connections = connections
        self.session: aiohttp.ClientSession | None = None
        self.stats = ClientStats()

    async def __aenter__(self) -> Delayd:
        conn = aiohttp.TCPConnector(limit=self.connections, force_close=False)
        self.session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def post(self, path: str, payload: bytes, *, timeout_s: float = 120) -> tuple[float, Any]:
        """POST msgpack bytes; returns (wall-clock ms when the answer was read, decoded answer)."""
        assert self.session is not None
        while True:
            async with self.session.post(
                self.url + path, data=payload, headers=HDRS, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                raw = await r.read()
                recv = now_ms_f()
                self.stats.requests += 1
                if r.status == 429:
                    self.stats.retries_429 += 1
                    await asyncio.sleep(float(r.headers.get("Retry-After", "0.05") or 0.05))
                    continue
                t0 = time.perf_counter()
                body = msgpack.unpackb(raw, raw=False) if raw else None
                self.stats.decode_s += time.perf_counter() - t0
                if r.status != 200:
                    raise HttpError(f"POST {path} -> {r.status}: {body!r}"[:2000])
                return recv, body

    async def get_json(self, path: str) -> Any:
        assert self.session is not None
        async with self.session.get(self.url + path, timeout=aiohttp.ClientTimeout(total=30)) as r:
            raw = await r.read()
            if r.status != 200:
                raise HttpError(f"GET {path} -> {r.status}: {raw[:500]!r}")
            return json.loads(raw)

    async def produce(self, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        payload = msgpack.packb({"messages": messages}, use_bin_type=True)
        self.stats.encode_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        _, body = await self.post(f"/v1/topics/{topic}/messages", payload)
        self.stats.batch_rtt_ms.append((time.perf_counter() - t1) * 1000)
        out = body["messages"]
        if len(out) != len(messages):
            raise HttpError(f"produce answered {len(out)} results for {len(messages)} messages")
        return out

    async def pull(
        self, topic: str, group: str, max_n: int, wait_ms: int, lease_ms: int = 600_000
    ) -> tuple[float, list[dict[str, Any]]]:
        payload = msgpack.packb({"max": max_n, "wait_ms": wait_ms, "lease_ms": lease_ms})
        recv, body = await self.post(
            f"/v1/topics/{topic}/subscriptions/{group}/pull", payload, timeout_s=wait_ms / 1000 + 60
        )
        return recv, body["messages"]

    async def ack(self, topic: str, group: str, receipts: list[str]) -> dict[str, Any]:
        payload = msgpack.packb({"receipts": receipts})
        _, body = await self.post(f"/v1/topics/{topic}/subscriptions/{group}/ack", payload)
        return body


class Acker:
    """Acks receipts in batches on its own connection(s), off the pull loop's critical path."""

    def __init__(self, client: Delayd, topic: str, group: str, workers: int = 2) -> None:
        self.client, self.topic, self.group = client, topic, group
        self.queue: asyncio.Queue[list[str] | None] = asyncio.Queue()
        self.acked = 0
        self.stale = 0
        self.tasks = [asyncio.create_task(self._run()) for _ in range(workers)]

    async def _run(self) -> None:
        while True:
            receipts = await self.queue.get()
            if receipts is None:
                return
            res = await self.client.ack(self.topic, self.group, receipts)
            self.acked += int(res.get("acked", 0))
            self.stale += len(res.get("stale", []))

    def put(self, receipts: list[str]) -> None:
        self.queue.put_nowait(receipts)

    async def close(self) -> None:
        for _ in self.tasks:
            self.queue.put_nowait(None)
        await asyncio.gather(*self.tasks)


# ----------------------------------------------------------------------------------------------
# Redis delay queue, as commonly written in Python
# ----------------------------------------------------------------------------------------------

# Pops up to ARGV[2] ids whose score (due ms) <= ARGV[1], atomically, with their payloads.
# Returns {id1, score1, id2, score2, ...} and {payload1, payload2, ...}.
POP_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
if #due == 0 then return {{}, {}} end
local ids = {}
for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
redis.call('ZREM', KEYS[1], unpack(ids))
local bodies = redis.call('HMGET', KEYS[2], unpack(ids))
redis.call('HDEL', KEYS[2], unpack(ids))
return {due, bodies}
"""


class RedisQueue:
    def __init__(self, client: Any, name: str) -> None:
        self.r = client
        self.zkey = f"dq:{name}:due"
        self.hkey = f"dq:{name}:payload"
        self.pop_script = client.register_script(POP_LUA)
        self.stats = ClientStats()

    async def add_batch(self, items: list[tuple[bytes, int]]) -> None:
        """items: (body, due_ms). Ids are uuid4 hex, as most Python delay-queue code does."""
        t0 = time.perf_counter()
        payloads: dict[str, bytes] = {}
        scores: dict[str, int] = {}
        for body, due in items:
            mid = uuid.uuid4().hex
            payloads[mid] = body
            scores[mid] = due
        self.stats.encode_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        async with self.r.pipeline() as p:  # redis-py default: MULTI/EXEC, one round trip
            p.hset(self.hkey, mapping=payloads)
            p.zadd(self.zkey, scores)
            await p.execute()
        self.stats.batch_rtt_ms.append((time.perf_counter() - t1) * 1000)
        self.stats.requests += 1

    async def pop_due(self, limit: int = BATCH) -> tuple[float, list[tuple[bytes, int, bytes]]]:
        """Returns (wall-clock ms when popped, [(id, due_ms, payload)])."""
        due, bodies = await self.pop_script(keys=[self.zkey, self.hkey], args=[now_ms(), limit])
        recv = now_ms_f()
        self.stats.requests += 1
        out = [(due[i], int(float(due[i + 1])), bodies[i // 2]) for i in range(0, len(due), 2)]
        return recv, out


# ----------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    args: argparse.Namespace
    base_tmp: Path
    bodies: Bodies
    redis_bin: str
    results: dict[str, Any] = field(default_factory=dict)
    produce_rate_hint: dict[str, float] = field(default_factory=dict)

    def workdir(self, name: str) -> Path:
        d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.base_tmp))
        return d

    def timeout(self, base_s: float, n: int, per_s: float = 2000.0) -> float:
        return (base_s + n / per_s) * self.args.timeout_factor


async def run_workers(
    n_items: int, batch: int, workers: int, fn: Callable[[int, int], Awaitable[None]]
) -> None:
    """Run fn(start, count) over [0, n_items) in batches, `workers` at a time."""
    next_start = 0

    async def worker() -> None:
        nonlocal next_start
        while next_start < n_items:
            start = next_start
            count = min(batch, n_items - start)
            next_start += count
            await fn(start, count)

    await asyncio.gather(*(worker() for _ in range(workers)))


class CpuWindow:
    """Client and server CPU seconds over a phase."""

    def __init__(self, server: ServerProc) -> None:
        self.server = server

    def __enter__(self) -> CpuWindow:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.s0 = self.server.cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self.t0
        self.client_cpu_s = time.process_time() - self.c0
        self.server_cpu_s = self.server.cpu_s() - self.s0

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": self.wall_s, "client_cpu_s": self.client_cpu_s, "server_cpu_s": self.server_cpu_s}


async def delayd_fill(
    ctx: Ctx, d: Delayd, topic: str, n: int, due: Callable[[random.Random, int], dict[str, int]]
) -> dict[str, Any]:
    """Produce n messages in batches of 1,000 over ctx.args.connections connections."""
    bodies = ctx.bodies
    rnd = random.Random(11)

    async def one(start: int, count: int) -> None:
        t0 = time.perf_counter()
        msgs = []
        for i in range(start, start + count):
            m: dict[str, Any] = {"body": bodies[i]}
            m.update(due(rnd, i))
            msgs.append(m)
        d.stats.encode_s += time.perf_counter() - t0
        await d.produce(topic, msgs)

    await run_workers(n, BATCH, ctx.args.connections, one)
    return {"requests": d.stats.requests, "retries_429": d.stats.retries_429}


async def redis_fill(ctx: Ctx, q: RedisQueue, n: int, due: Callable[[random.Random, int], int]) -> None:
    bodies = ctx.bodies
    rnd = random.Random(11)

    async def one(start: int, count: int) -> None:
        t0 = time.perf_counter()
        items = [(bodies[i], due(rnd, i)) for i in range(start, start + count)]
        q.stats.encode_s += time.perf_counter() - t0
        await q.add_batch(items)

    await run_workers(n, BATCH, ctx.args.connections, one)


def far_delay(rnd: random.Random, _i: int) -> int:
    return rnd.randint(HOUR_MS, 48 * HOUR_MS)


async def delayd_stats(d: Delayd) -> dict[str, Any]:
    try:
        return await d.get_json("/v1/stats")
    except Exception as e:  # noqa: BLE001 - a stats failure must not sink a run
        return {"error": repr(e)}


async def wait_indexed(d: Delayd, expected: int, timeout_s: float) -> dict[str, Any]:
    """Wait until /v1/stats shows `expected` scheduled and every pipeline queue empty (twice)."""
    deadline = time.monotonic() + timeout_s
    calm = 0
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        st = await delayd_stats(d)
        pipeline = st.get("pipeline") or {}
        depths = [v for v in pipeline.values() if isinstance(v, (int, float))]
        if st.get("scheduled", -1) >= expected and all(v == 0 for v in depths):
            calm += 1
            if calm >= 2:
                return {"indexed": True, "stats": st}
        else:
            calm = 0
        await asyncio.sleep(0.25)
    return {"indexed": False, "stats": st}


# ----------------------------------------------------------------------------------------------
# Workloads
# ----------------------------------------------------------------------------------------------


async def produce_delayd(ctx: Ctx, n: int) -> dict[str, Any]:
    srv = DaemonServer(ctx.workdir("produce-delayd"), ctx.args)
    await srv.start()
    try:
        async with Delayd(srv.url, ctx.args.connections) as d:
            with CpuWindow(srv) as cpu:
                await asyncio.wait_for(
                    delayd_fill(ctx, d, "bench-produce", n, lambda r, i: {"delay_ms": far_delay(r, i)}),
                    ctx.timeout(60, n),
                )
            res: dict[str, Any] = {
                "messages": n,
                "msg_per_s": n / cpu.wall_s,
                **cpu.as_dict(),
                "client_encode_s": d.stats.encode_s,
                "client_decode_s": d.stats.decode_s,
                "requests": d.stats.requests,
                "retries_429": d.stats.retries_429,
                **d.stats.rtt_summary(),
                "server_rss_bytes": srv.rss_bytes(),
                "disk_bytes": srv.disk_bytes(),
            }
            res["stats_after"] = await delayd_stats(d)
        return res
    finally:
        srv.stop()


async def produce_redis(ctx: Ctx, n: int) -> dict[str, Any]:
    srv = RedisServer(ctx.workdir("produce-redis"), ctx.redis_bin)
    await srv.start()
    r = srv.client(ctx.args.connections)
    try:
        q = RedisQueue(r, "produce")
        with CpuWindow(srv) as cpu:
            await asyncio.wait_for(
                redis_fill(ctx, q, n, lambda rnd, i: now_ms() + far_delay(rnd, i)), ctx.timeout(60, n)
            )
        card = await r.zcard(q.zkey)
        return {
            "messages": n,
            "stored": card,
            "msg_per_s": n / cpu.wall_s,
            **cpu.as_dict(),
            "client_encode_s": q.stats.encode_s,
            "requests": q.stats.requests,
            **q.stats.rtt_summary(),
            "server_rss_bytes": srv.rss_bytes(),
            "disk_bytes": srv.disk_bytes(),
        }
    finally:
        await r.aclose()
        srv.stop()


async def accuracy_delayd(ctx: Ctx, n: int) -> dict[str, Any]:
    srv = DaemonServer(ctx.workdir("accuracy-delayd"), ctx.args)
    await srv.start()
    topic, group = "bench-accuracy", "g"
    try:
        async with (
            Delayd(srv.url, ctx.args.connections) as prod,
            Delayd(srv.url, 1) as cons,
            Delayd(srv.url, 2) as acks,
        ):
            lat: list[float] = []
            pairs: list[tuple[int, float]] = []
            seen: set[str] = set()
            dups = 0
            acker = Acker(acks, topic, group)
            # Create the group and get the consumer long-polling before anything is produced.
            await cons.pull(topic, group, 1, 0)

            async def consume() -> None:
                nonlocal dups
                while len(seen) < n:
                    recv, msgs = await cons.pull(topic, group, BATCH, 1000)
                    for m in msgs:
                        lat.append(recv - m["deliver_at"])
                        pairs.append((m["deliver_at"], recv - m["deliver_at"]))
                        if m["id"] in seen:
                            dups += 1
                        seen.add(m["id"])
                    if msgs:
                        acker.put([m["receipt"] for m in msgs])

            consumer = asyncio.create_task(consume())
            t_prod = time.perf_counter()
            await delayd_fill(ctx, prod, topic, n, lambda r, i: {"delay_ms": r.randint(1000, 6000)})
            produce_s = time.perf_counter() - t_prod
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(consumer, ctx.timeout(40, 0))
            await acker.close()
            res = {
                "messages": n,
                "received": len(seen),
                "duplicates": dups,
                "produce_s": produce_s,
                "acked": acker.acked,
                **lateness_summary(lat),
            }
            st = await delayd_stats(prod)
            res["daemon_reported_lateness_ms"] = st.get("lateness_ms")
            res["late_shape"] = lateness_shape(pairs)
        return res
    finally:
        srv.stop()


async def accuracy_redis(ctx: Ctx, n: int) -> dict[str, Any]:
    srv = RedisServer(ctx.workdir("accuracy-redis"), ctx.redis_bin)
    await srv.start()
    r = srv.client(ctx.args.connections + 1)
    try:
        q = RedisQueue(r, "accuracy")
        lat: list[float] = []
        pairs: list[tuple[int, float]] = []
        interval = ctx.args.redis_poll_ms / 1000

        async def poller() -> None:
            got = 0
            while got < n:
                recv, items = await q.pop_due(BATCH)
                for _id, due, _body in items:
                    lat.append(recv - due)
                    pairs.append((due, recv - due))
                got += len(items)
                if len(items) < BATCH:
                    await asyncio.sleep(interval)

        consumer = asyncio.create_task(poller())
        t_prod = time.perf_counter()
        await redis_fill(ctx, q, n, lambda rnd, i: now_ms() + rnd.randint(1000, 6000))
        produce_s = time.perf_counter() - t_prod
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(consumer, ctx.timeout(40, 0))
        return {
            "messages": n,
            "received": len(lat),
            "duplicates": 0,
            "produce_s": produce_s,
            "poll_interval_ms": ctx.args.redis_poll_ms,
            **lateness_summary(lat),
            "late_shape": lateness_shape(pairs),
        }
    finally:
        await r.aclose()
        srv.stop()


def burst_due_at(ctx: Ctx, side: str, m: int) -> int:
    """Pick the burst second far enough ahead that filling M messages finishes before it."""
    rate = ctx.produce_rate_hint.get(side) or ctx.args.burst_rate_guess
    fill_s = m / max(rate, 1.0)
    return ((now_ms() + int((fill_s * 1.6 + 5) * 1000)) // 1000 + 1) * 1000  # a whole second


async def calibrate_rate(ctx: Ctx, fill: Callable[[int], Awaitable[object]], n: int = 20_000) -> float:
    t0 = time.perf_counter()
    await fill(n)
    return n / (time.perf_counter() - t0)


async def burst_delayd(ctx: Ctx, m: int) -> dict[str, Any]:
    srv = DaemonServer(ctx.workdir("burst-delayd"), ctx.args)
    await srv.start()
    topic, group = "bench-burst", "g"
    try:
        async with (
            Delayd(srv.url, ctx.args.connections) as prod,
            Delayd(srv.url, 1) as cons,
            Delayd(srv.url, 2) as acks,
        ):
            if "delayd" not in ctx.produce_rate_hint:
                ctx.produce_rate_hint["delayd"] = await calibrate_rate(
                    ctx,
                    lambda k: delayd_fill(
                        ctx, prod, "bench-calibrate", k, lambda r, i: {"delay_ms": far_delay(r, i)}
                    ),
                )
            t_due = burst_due_at(ctx, "delayd", m)
            await cons.pull(topic, group, 1, 0)  # create the group before the burst
            with CpuWindow(srv) as fill_cpu:
                await asyncio.wait_for(
                    delayd_fill(ctx, prod, topic, m, lambda r, i: {"deliver_at": t_due + r.randrange(1000)}),
                    ctx.timeout(60, m),
                )
            slack_ms = t_due - now_ms()
            log(f"delayd burst: filled {m} in {fill_cpu.wall_s:.1f}s, due in {slack_ms / 1000:.1f}s")
            idx = await wait_indexed(prod, 0, max(0.0, slack_ms / 1000 - 0.5))
            lat: list[float] = []
            seen: set[str] = set()
            dups = 0
            last_recv = 0.0
            acker = Acker(acks, topic, group)
            while now_ms() < t_due - 300:
                await asyncio.sleep(0.05)
            srv.profile_phase("burst-drain")
            pulls = 0
            with CpuWindow(srv) as drain_cpu:
                deadline = time.monotonic() + ctx.timeout(30, m, 10_000) + max(0, (t_due - now_ms()) / 1000)
                while len(seen) < m and time.monotonic() < deadline:
                    recv, msgs = await cons.pull(topic, group, BATCH, 1000)
                    pulls += 1
                    if not msgs:
                        continue
                    last_recv = recv
                    for msg in msgs:
                        lat.append(recv - msg["deliver_at"])
                        if msg["id"] in seen:
                            dups += 1
                        seen.add(msg["id"])
                    acker.put([msg["receipt"] for msg in msgs])
                t_all_pulled = now_ms_f()
                await acker.close()
                t_all_acked = now_ms_f()
            res = {
                "messages": m,
                "received": len(seen),
                "duplicates": dups,
                "pulls": pulls,
                "due_second_ms": t_due,
                "fill_s": fill_cpu.wall_s,
                "fill_msg_per_s": m / fill_cpu.wall_s,
                "fill_finished_before_due": slack_ms > 0,
                "slack_before_due_s": slack_ms / 1000,
                "indexed_before_due": idx["indexed"],
                "all_pulled_after_due_s": (last_recv - t_due) / 1000 if len(seen) >= m else None,
                "all_acked_after_due_s": (t_all_acked - t_due) / 1000 if len(seen) >= m else None,
                "all_pulled_wall_ms": t_all_pulled,
                "acked": acker.acked,
                "ack_stale": acker.stale,
                "drain": drain_cpu.as_dict(),
                "drain_msg_per_s": len(seen) / max(0.001, (last_recv - t_due) / 1000),
                "server_rss_bytes": srv.rss_bytes(),
                "server_vm": srv.vm_status(),
                **lateness_summary(lat),
            }
        return res
    finally:
        srv.stop()


async def burst_redis(ctx: Ctx, m: int) -> dict[str, Any]:
    srv = RedisServer(ctx.workdir("burst-redis"), ctx.redis_bin)
    await srv.start()
    r = srv.client(ctx.args.connections + 1)
    try:
        q = RedisQueue(r, "burst")
        if "redis" not in ctx.produce_rate_hint:
            cq = RedisQueue(r, "calibrate")
            ctx.produce_rate_hint["redis"] = await calibrate_rate(
                ctx, lambda k: redis_fill(ctx, cq, k, lambda rnd, i: now_ms() + far_delay(rnd, i))
            )
        t_due = burst_due_at(ctx, "redis", m)
        with CpuWindow(srv) as fill_cpu:
            await asyncio.wait_for(
                redis_fill(ctx, q, m, lambda rnd, i: t_due + rnd.randrange(1000)), ctx.timeout(60, m)
            )
        slack_ms = t_due - now_ms()
        log(f"redis burst: filled {m} in {fill_cpu.wall_s:.1f}s, due in {slack_ms / 1000:.1f}s")
        while now_ms() < t_due - 300:
            await asyncio.sleep(0.05)
        lat: list[float] = []
        got = 0
        last_recv = 0.0
        pops = 0
        interval = ctx.args.redis_poll_ms / 1000
        with CpuWindow(srv) as drain_cpu:
            deadline = time.monotonic() + ctx.timeout(30, m, 10_000) + max(0, (t_due - now_ms()) / 1000)
            while got < m and time.monotonic() < deadline:
                recv, items = await q.pop_due(BATCH)
                pops += 1
                if items:
                    last_recv = recv
                    for _id, due, _body in items:
                        lat.append(recv - due)
                    got += len(items)
                if len(items) < BATCH:
                    await asyncio.sleep(interval)
        return {
            "messages": m,
            "received": got,
            "duplicates": 0,
            "pulls": pops,
            "due_second_ms": t_due,
            "fill_s": fill_cpu.wall_s,
            "fill_msg_per_s": m / fill_cpu.wall_s,
            "fill_finished_before_due": slack_ms > 0,
            "slack_before_due_s": slack_ms / 1000,
            "all_pulled_after_due_s": (last_recv - t_due) / 1000 if got >= m else None,
            "drain": drain_cpu.as_dict(),
            "drain_msg_per_s": got / max(0.001, (last_recv - t_due) / 1000),
            "server_rss_bytes": srv.rss_bytes(),
            **lateness_summary(lat),
        }
    finally:
        await r.aclose()
        srv.stop()


async def sample_rss(srv: ServerProc, seconds: float) -> int:
    """Max RSS over a short window (the number we report is the settled, not the instant, one)."""
    best = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        best = max(best, srv.rss_bytes())
        await asyncio.sleep(0.1)
    return best


async def memory_restart_delayd(ctx: Ctx, p: int, do_memory: bool, do_restart: bool) -> dict[str, Any]:
    srv = DaemonServer(ctx.workdir("pending-delayd"), ctx.args)
    await srv.start()
    out: dict[str, Any] = {}
    try:
        async with Delayd(srv.url, ctx.args.connections) as d:
            rss0 = await sample_rss(srv, 1.0)
            with CpuWindow(srv) as fill_cpu:
                await asyncio.wait_for(
                    delayd_fill(ctx, d, "bench-pending", p, lambda r, i: {"delay_ms": far_delay(r, i)}),
                    ctx.timeout(60, p),
                )
            log(f"delayd: {p} pending produced in {fill_cpu.wall_s:.1f}s; waiting for indexing")
            idx = await wait_indexed(d, p, ctx.timeout(60, p, 10_000))
            rss = await sample_rss(srv, 3.0)
            mem = {
                "pending": p,
                "fill_s": fill_cpu.wall_s,
                "fill_msg_per_s": p / fill_cpu.wall_s,
                "indexed": idx["indexed"],
                "scheduled_reported": idx["stats"].get("scheduled"),
                "rss_idle_bytes": rss0,
                "rss_bytes": rss,
                "vm": srv.vm_status(),
                "rss_per_pending_bytes": (rss - rss0) / p if p else None,
                "disk_bytes": srv.disk_bytes(),
                "daemon_disk_bytes": idx["stats"].get("disk_bytes"),
                "pipeline": idx["stats"].get("pipeline"),
            }
            if do_memory:
                out["memory"] = mem
            if not do_restart:
                return out
            # A probe due ~0.5 s after the kill: it must survive and come out right after restart.
            probe_topic, group = "bench-restart-probe", "g"
            res = await d.produce(probe_topic, [{"body": b"probe", "delay_ms": 500}])
            probe_due = res[0]["deliver_at"]
        t_kill = time.monotonic()
        t_kill_wall = now_ms_f()
        srv.kill9()
        srv.spawn()
        t_spawn = time.monotonic()
        t_ready = await srv.wait_ready(ctx.timeout(60, p, 100_000))
        async with Delayd(srv.url, 1) as d:
            deadline = time.monotonic() + 30
            got: list[dict[str, Any]] = []
            recv = 0.0
            while not got and time.monotonic() < deadline:
                recv, got = await d.pull(probe_topic, group, 10, 1000)
            st = await delayd_stats(d)
        out["restart"] = {
            "pending": p,
            "ready_after_kill_s": t_ready - t_kill,
            "spawn_to_ready_s": t_ready - t_spawn,
            "probe_delivered": bool(got),
            "probe_due_after_kill_ms": probe_due - t_kill_wall,
            "probe_received_after_kill_s": (recv - t_kill_wall) / 1000 if got else None,
            "probe_lateness_ms": (recv - probe_due) if got else None,
            "scheduled_after_restart": st.get("scheduled"),
            "rss_after_restart_bytes": srv.rss_bytes(),
        }
        return out
    finally:
        srv.stop()


async def memory_restart_redis(ctx: Ctx, p: int, do_memory: bool, do_restart: bool) -> dict[str, Any]:
    srv = RedisServer(ctx.workdir("pending-redis"), ctx.redis_bin)
    await srv.start()
    out: dict[str, Any] = {}
    r = srv.client(ctx.args.connections + 1)
    try:
        q = RedisQueue(r, "pending")
        info0 = await r.info("memory")
        rss0 = srv.rss_bytes()
        with CpuWindow(srv) as fill_cpu:
            await asyncio.wait_for(
                redis_fill(ctx, q, p, lambda rnd, i: now_ms() + far_delay(rnd, i)), ctx.timeout(60, p)
            )
        aof_wait = time.monotonic() + 120
        while (await r.info("persistence")).get("aof_rewrite_in_progress") and time.monotonic() < aof_wait:
            await asyncio.sleep(0.1)
        info = await r.info("memory")
        rss = await sample_rss(srv, 2.0)
        mem = {
            "pending": p,
            "fill_s": fill_cpu.wall_s,
            "fill_msg_per_s": p / fill_cpu.wall_s,
            "stored": await r.zcard(q.zkey),
            "used_memory_bytes": int(info["used_memory"]),
            "used_memory_idle_bytes": int(info0["used_memory"]),
            "used_memory_rss_bytes": int(info["used_memory_rss"]),
            "mem_fragmentation_ratio": info.get("mem_fragmentation_ratio"),
            "rss_idle_bytes": rss0,
            "rss_bytes": rss,
            "vm": srv.vm_status(),
            "rss_per_pending_bytes": (rss - rss0) / p if p else None,
            "used_memory_per_pending_bytes": (int(info["used_memory"]) - int(info0["used_memory"])) / p,
            "disk_bytes": srv.disk_bytes(),
        }
        if do_memory:
            out["memory"] = mem
        if not do_restart:
            return out
        probe = RedisQueue(r, "probe")
        await probe.add_batch([(b"probe", now_ms() + 500)])
        probe_due = int(float((await r.zrange(probe.zkey, 0, 0, withscores=True))[0][1]))
        await r.aclose()
        t_kill = time.monotonic()
        t_kill_wall = now_ms_f()
        srv.kill9()
        srv.spawn()
        t_spawn = time.monotonic()
        t_ready = await srv.wait_ready(ctx.timeout(60, p, 100_000))
        r = srv.client(2)
        probe = RedisQueue(r, "probe")
        got: list[Any] = []
        recv = 0.0
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            recv, got = await probe.pop_due(BATCH)
            if not got:
                await asyncio.sleep(ctx.args.redis_poll_ms / 1000)
        out["restart"] = {
            "pending": p,
            "ready_after_kill_s": t_ready - t_kill,
            "spawn_to_ready_s": t_ready - t_spawn,
            "probe_delivered": bool(got),
            "probe_due_after_kill_ms": probe_due - t_kill_wall,
            "probe_received_after_kill_s": (recv - t_kill_wall) / 1000 if got else None,
            "probe_lateness_ms": (recv - probe_due) if got else None,
            "stored_after_restart": await r.zcard(q.zkey),
            "rss_after_restart_bytes": srv.rss_bytes(),
        }
        return out
    finally:
        await r.aclose()
        srv.stop()


# ----------------------------------------------------------------------------------------------
# Driver, table and JSON
# ----------------------------------------------------------------------------------------------

WORKLOADS = ("produce", "accuracy", "burst", "memory", "restart")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        v = [int(x) for x in fields]
        busy = (
            v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
        )  # user nice system irq softirq steal
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def own_cpu_s() -> float:
    """CPU seconds of this process plus every child it has reaped (the servers, once stopped)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


async def run_side(ctx: Ctx, name: str, side: str, coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    log(f"{name}: {side} ...")
    t0 = time.perf_counter()
    m0, o0 = machine_busy_s(), own_cpu_s()
    try:
        res = await coro
    except Exception as e:  # noqa: BLE001 - one failure (timeouts included) must not sink the run
        log(f"{name}: {side} FAILED: {e!r}")
        res = {"error": f"{type(e).__name__}: {e}"[:4000]}
    wall = time.perf_counter() - t0
    # Other processes on the machine compete for the same cores: say how much they took.
    other = max(0.0, (machine_busy_s() - m0) - (own_cpu_s() - o0))
    share = other / (wall * (os.cpu_count() or 1)) if wall > 0 else 0.0
    res["env"] = {
        "wall_s": wall,
        "other_processes_cpu_s": other,
        "other_processes_cpu_share_pct": 100 * share,
        "loadavg_end": os.getloadavg()[0],
    }
    log(f"{name}: {side} done in {wall:.1f}s (other processes used {100 * share:.0f}% of the machine)")
    if share > 0.05:
        log(
            f"WARNING: {name}/{side}: other processes used {100 * share:.0f}% of the CPU; numbers are disturbed"
        )
    return res


async def run_all(ctx: Ctx) -> None:
    a = ctx.args
    only = a.only
    sides = [s for s in ("delayd", "redis") if s not in a.skip]
    n = int(a.produce_n * a.scale)
    m = int(a.burst_m * a.scale)
    p = int(a.pending_p * a.scale)
    res = ctx.results
    if "produce" in only:
        res["produce"] = {}
        for side in sides:
            coro = produce_delayd(ctx, n) if side == "delayd" else produce_redis(ctx, n)
            res["produce"][side] = await run_side(ctx, "produce", side, coro)
            if "msg_per_s" in res["produce"][side]:
                ctx.produce_rate_hint[side] = res["produce"][side]["msg_per_s"]
    if "accuracy" in only:
        res["accuracy"] = {}
        for side in sides:
            coro = (
                accuracy_delayd(ctx, a.accuracy_n) if side == "delayd" else accuracy_redis(ctx, a.accuracy_n)
            )
            res["accuracy"][side] = await run_side(ctx, "accuracy", side, coro)
    if "burst" in only:
        res["burst"] = {}
        for side in sides:
            coro = burst_delayd(ctx, m) if side == "delayd" else burst_redis(ctx, m)
            res["burst"][side] = await run_side(ctx, "burst", side, coro)
    do_mem, do_restart = "memory" in only, "restart" in only
    if do_mem or do_restart:
        if do_mem:
            res["memory"] = {}
        if do_restart:
            res["restart"] = {}
        for side in sides:
            mr = memory_restart_delayd if side == "delayd" else memory_restart_redis
            both = await run_side(ctx, "memory/restart", side, mr(ctx, p, do_mem, do_restart))
            for key in ("memory", "restart"):
                if key in res:
                    res[key][side] = both.get(key, {"error": both.get("error", "not measured")})
                    res[key][side]["env"] = both["env"]


def fmt(v: Any, unit: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if unit == "MB":
        return f"{v / 1e6:,.1f}"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table_rows(res: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """(workload, metric, unit, delayd, redis, target, pass) rows for the printed table and the JSON."""
    rows: list[dict[str, Any]] = []

    def get(wl: str, side: str, key: str) -> Any:
        v = res.get(wl, {}).get(side, {})
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        return v

    def row(
        wl: str,
        metric: str,
        unit: str,
        key: str,
        target: str = "",
        check: Callable[[Any, Any], bool] | None = None,
        rkey: str | None = None,
    ) -> None:
        dv, rv = get(wl, "delayd", key), get(wl, "redis", rkey or key)
        ok = None
        if check is not None and dv is not None:
            try:
                ok = bool(check(dv, rv))
            except TypeError:
                ok = None
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (dv, rv))
        ratio = dv / rv if numeric and rv else None
        rows.append(
            {
                "workload": wl,
                "metric": metric,
                "unit": unit,
                "delayd": dv,
                "redis": rv,
                "ratio": ratio,
                "target": target,
                "pass": ok,
            }
        )

    if "produce" in res:
        n = get("produce", "delayd", "messages") or get("produce", "redis", "messages")
        row(
            "produce",
            f"throughput, {fmt(n, '')} msgs",
            "msg/s",
            "msg_per_s",
            f">= {TARGET_PRODUCE_MSGS:,} and >= {TARGET_PRODUCE_RATIO:g}x redis",
            lambda d, r: d >= TARGET_PRODUCE_MSGS and (r is None or d >= TARGET_PRODUCE_RATIO * r),
        )
        row("produce", "wall time", "s", "wall_s")
        row("produce", "server CPU", "s", "server_cpu_s")
        row("produce", "client CPU (whole client)", "s", "client_cpu_s")
        row("produce", "client encode (dicts+packb / ids+dicts, excl. redis-py)", "s", "client_encode_s")
        row("produce", "batch round trip p50 (send -> durable answer)", "ms", "batch_rtt_p50_ms")
        row("produce", "batch round trip p99", "ms", "batch_rtt_p99_ms")
        row("produce", "disk after", "MB", "disk_bytes")
    if "accuracy" in res:
        row("accuracy", "received", "msgs", "received")
        row("accuracy", "lateness p50", "ms", "p50_ms")
        row(
            "accuracy",
            "lateness p99",
            "ms",
            "p99_ms",
            f"<= {TARGET_P99_MS:g}",
            lambda d, r: d <= TARGET_P99_MS,
        )
        row("accuracy", "lateness max", "ms", "max_ms")
        row("accuracy", "early (before deliver_at)", "msgs", "early", "0", lambda d, r: d == 0)
    if "burst" in res:
        mm = get("burst", "delayd", "messages") or get("burst", "redis", "messages")
        row(
            "burst",
            f"all {fmt(mm, '')} pulled, after due second",
            "s",
            "all_pulled_after_due_s",
            f"<= {TARGET_BURST_S:g}",
            lambda d, r: d <= TARGET_BURST_S,
        )
        row("burst", "received before the time bound", "msgs", "received")
        row("burst", "drain rate (received / drain wall time)", "msg/s", "drain_msg_per_s")
        row("burst", "lateness p50", "ms", "p50_ms")
        row("burst", "lateness p99", "ms", "p99_ms")
        row("burst", "lateness max", "ms", "max_ms")
        row("burst", "early (before deliver_at)", "msgs", "early", "0", lambda d, r: d == 0)
        row("burst", "fill throughput", "msg/s", "fill_msg_per_s")
        row("burst", "fill finished before due", "", "fill_finished_before_due")
    if "memory" in res:
        pp = get("memory", "delayd", "pending") or get("memory", "redis", "pending")
        row(
            "memory",
            f"server RSS, {fmt(pp, '')} pending",
            "MB",
            "rss_bytes",
            f"<= {TARGET_RSS_MB:g} (at 10M)",
            lambda d, r: d / 1e6 <= TARGET_RSS_MB,
        )
        row("memory", "server RSS idle (before fill)", "MB", "rss_idle_bytes")
        row("memory", "RSS growth per pending msg", "B", "rss_per_pending_bytes")
        row("memory", "delayd RSS vs redis used_memory", "MB", "rss_bytes", rkey="used_memory_bytes")
        row("memory", "disk", "MB", "disk_bytes")
    if "restart" in res:
        pp = get("restart", "delayd", "pending") or get("restart", "redis", "pending")
        row(
            "restart",
            f"ready after kill -9, {fmt(pp, '')} pending",
            "s",
            "ready_after_kill_s",
            f"<= {TARGET_READY_S:g} (at 10M)",
            lambda d, r: d <= TARGET_READY_S,
        )
        row("restart", "process start to ready", "s", "spawn_to_ready_s")
        row("restart", "probe (due 0.5s after kill) received after kill", "s", "probe_received_after_kill_s")
        row("restart", "probe lateness", "ms", "probe_lateness_ms")
    for wl in WORKLOADS:
        if wl in res:
            row(wl, "other processes' CPU share during the run", "%", "env.other_processes_cpu_share_pct")
    return rows


def render_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    head = ["workload", "metric", "unit", "delayd", "redis", "delayd/redis", "target", "ok"]
    body = []
    for r in rows:
        ok = "" if r["pass"] is None else ("PASS" if r["pass"] else "MISS")
        body.append(
            [
                r["workload"],
                r["metric"],
                r["unit"] if r["unit"] != "MB" else "MB",
                fmt(r["delayd"], r["unit"]),
                fmt(r["redis"], r["unit"]),
                "-" if r["ratio"] is None else f"{r['ratio']:.2f}",
                r["target"],
                ok,
            ]
        )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c for c in b) + " |" for b in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt_line = "  ".join(f"{{:<{w}}}" if i < 3 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines = [fmt_line.format(*head), fmt_line.format(*("-" * w for w in widths))]
    lines += [fmt_line.format(*b) for b in body]
    return "\n".join(lines)


def render_section(out: dict[str, Any]) -> str:
    """A Markdown block for BENCHMARKS.md: machine, command, table, disturbance."""
    meta = out["meta"]
    m = meta["machine"]
    mem = f"{m['mem_total_bytes'] / 2**30:.1f} GiB" if m.get("mem_total_bytes") else "?"
    lines = [
        f"Run {meta['started_at']} (git {meta.get('git_rev') or '-'}, {meta['duration_s']:.0f} s): "
        f"{m['nproc']} CPUs ({m['cpu_model']}), {mem} RAM, Linux {m['kernel']}, Python {m['python']}, "
        f"{meta.get('redis_server', '').split(' sha=')[0]}, redis-py {meta.get('redis_py')}, client loop "
        f"{meta.get('client_loop')}.",
        "",
        "```",
        meta["command"] if isinstance(meta["command"], str) else " ".join(meta["command"]),
        "```",
        "",
        render_table(out["table"], markdown=True),
    ]
    if out.get("errors"):
        lines += ["", "Errors: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in out["errors"].items())]
    return "\n".join(lines) + "\n"


def display_python() -> str:
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(ROOT))
    except ValueError:
        return exe.name


def machine_info() -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_total = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_total_bytes": mem_total,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def git_rev() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)",
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
    ap.add_argument("--connections", type=int, default=4, help="concurrent producer connections")
    ap.add_argument(
        "--redis-poll-ms", type=float, default=10.0, help="redis consumer poll interval when nothing is due"
    )
    ap.add_argument(
        "--burst-rate-guess",
        type=float,
        default=20_000.0,
        help="fill rate assumed to place the burst second when no rate was measured",
    )
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
    bad = [w for w in args.only if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; choose from {WORKLOADS}")
    args.skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    redis_bin = args.redis_server or shutil.which("redis-server")
    if "redis" not in args.skip:
        if redis is None or not redis_bin:
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
    ctx = Ctx(args=args, base_tmp=base_tmp, bodies=Bodies(100), redis_bin=redis_bin or "")
    started = time.time()
    meta = {
        "command": " ".join([display_python(), *sys.argv]) if argv is None else argv,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "machine": machine_info(),
        "git_rev": git_rev(),
        "redis_server": subprocess.run(
            [redis_bin, "--version"], capture_output=True, text=True
        ).stdout.strip()
        if redis_bin
        else None,
        "redis_py": getattr(redis, "__version__", None),
        "settings": {k: v for k, v in vars(args).items()},
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
        runner(run_all(ctx))
    except KeyboardInterrupt:
        log("interrupted; stopping servers")
        rc = 130
    finally:
        stop_all_children()
        meta["duration_s"] = time.time() - started
        rows = table_rows(ctx.results, args)
        out = {"meta": meta, "table": rows, "results": ctx.results}
        if rows:
            print()
            print(render_table(rows))
            if args.markdown:
                print()
                print(render_table(rows, markdown=True))
        errors = {
            f"{wl}/{side}": r["error"]
            for wl, sides in ctx.results.items()
            for side, r in sides.items()
            if isinstance(r, dict) and "error" in r
        }
        for k, e in errors.items():
            print(f"ERROR {k}: {e.splitlines()[0] if e else e}", file=sys.stderr)
        if errors and rc == 0:
            rc = 1
        out["errors"] = errors
        if PROFILES:
            out["profiles"] = PROFILES
            for name, prof in PROFILES.items():
                print(f"\npy-spy {name}: {prof.get('samples', 0)} samples, top self:")
                for frame, pct in prof.get("self_pct", [])[:12]:
                    print(f"  {pct:5.1f}%  {frame}")
        if args.json:
            jp = Path(args.json)
            jp.parent.mkdir(parents=True, exist_ok=True)
            jp.write_text(json.dumps(out, indent=2, default=str) + "\n")
            log(f"results written to {jp}")
        if args.markdown_out:
            Path(args.markdown_out).write_text(render_section(out))
            log(f"markdown written to {args.markdown_out}")
        if args.keep_dirs:
            log(f"data dirs and server logs kept in {base_tmp}")
        else:
            shutil.rmtree(base_tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
