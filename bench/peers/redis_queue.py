"""A Redis sorted-set delay queue as a peer, the way Python users build one.

A real `redis-server --appendonly yes --appendfsync everysec --save ''` (free loopback port, its
own temp dir). Producers write ZADD member=id score=due-ms plus the payload in a hash (HSET), in
pipelined batches with redis-py; consumers run a Lua script that atomically pops due ids
(ZRANGEBYSCORE ... LIMIT + ZREM) and their payloads (HMGET + HDEL), polled every 10 ms when
nothing is due. Note: Redis acknowledges before fsync (up to ~1 s of writes can be lost on power
loss); delayd answers after fsync.
"""

from __future__ import annotations

import asyncio
import functools
import random
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.client import ClientStats
from bench.harness import Bodies, dir_bytes, now_ms, now_ms_f, terminate, untrack
from bench.peers.base import BATCH, Consumer, Delay, Peer, PeerOptions, Producer, Received, Schedule
from tests.support.daemon import ROOT, free_port

try:
    import redis
    import redis.asyncio as aioredis
except ImportError:  # pragma: no cover - the CLI says to run bench/install_peer.sh
    redis = None  # type: ignore[assignment]
    aioredis = None  # type: ignore[assignment]

AOF_REWRITE_WAIT_S = 120.0  # at most this long for an AOF rewrite to finish before measuring memory


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


def due_key(queue: str) -> str:
    """The sorted set of a queue: member = message id, score = due ms."""
    return f"dq:{queue}:due"


def redis_client(port: int, max_connections: int) -> Any:
    pool = aioredis.BlockingConnectionPool(
        host="127.0.0.1", port=port, max_connections=max_connections, timeout=60
    )
    return aioredis.Redis(connection_pool=pool)


class RedisQueue:
    """One delay queue (a sorted set of due ms + a hash of payloads) on one client."""

    def __init__(self, client: Any, name: str, stats: ClientStats) -> None:
        self.r = client
        self.zkey = due_key(name)
        self.hkey = f"dq:{name}:payload"
        self.pop_script = client.register_script(POP_LUA)
        self.stats = stats

    async def add_batch(self, items: list[tuple[bytes, int]], ids: Sequence[str] | None = None) -> None:
        """items: (body, due_ms). Ids are uuid4 hex, as most Python delay-queue code does, or
        `ids` (business keys: adding one again replaces it)."""
        t0 = time.perf_counter()
        payloads: dict[str, bytes] = {}
        scores: dict[str, int] = {}
        for n, (body, due) in enumerate(items):
            mid = uuid.uuid4().hex if ids is None else ids[n]
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


class RedisProducer(Producer):
    def __init__(self, port: int, connections: int) -> None:
        self.r = redis_client(port, connections)
        self.stats = ClientStats()
        self.queues: dict[str, RedisQueue] = {}

    async def __aexit__(self, *exc: object) -> None:
        await self.r.aclose()

    def queue(self, topic: str) -> RedisQueue:
        if topic not in self.queues:
            self.queues[topic] = RedisQueue(self.r, topic, self.stats)
        return self.queues[topic]

    async def send_batch(
        self, topic: str, bodies: Bodies, start: int, count: int, schedule: Schedule, rnd: random.Random,
        keys: Sequence[str] | None = None,
    ) -> None:
        t0 = time.perf_counter()
        end = start + count
        if isinstance(schedule, Delay):
            lo, hi = schedule.lo_ms, schedule.hi_ms
            items = [(bodies[i], now_ms() + rnd.randint(lo, hi)) for i in range(start, end)]
        else:
            at, width = schedule.start_ms, schedule.width_ms
            items = [(bodies[i], at + rnd.randrange(width)) for i in range(start, end)]
        self.stats.encode_s += time.perf_counter() - t0
        await self.queue(topic).add_batch(items, keys)

    async def send_probe(self, topic: str, body: bytes, delay_ms: int) -> int:
        due = now_ms() + delay_ms
        await self.queue(topic).add_batch([(body, due)])
        return due

    def client_fields(self) -> dict[str, Any]:
        return {"client_encode_s": self.stats.encode_s, "requests": self.stats.requests}


class RedisConsumer(Consumer):
    """Runs the pop script; when it found less than a full batch, waits one poll interval."""

    def __init__(self, port: int, topic: str, poll_ms: float) -> None:
        self.r = redis_client(port, 2)
        self.queue = RedisQueue(self.r, topic, ClientStats())
        self.poll_ms = poll_ms

    async def __aexit__(self, *exc: object) -> None:
        await self.r.aclose()

    async def receive(self) -> Received:
        recv, items = await self.queue.pop_due(BATCH)
        self.receives += 1
        if len(items) < BATCH:
            await asyncio.sleep(self.poll_ms / 1000)
        return recv, [(mid, due) for mid, due, _body in items]

    async def finish(self) -> dict[str, Any]:
        return {"poll_interval_ms": self.poll_ms}


class RedisPeer(Peer):
    name = "redis"

    def __init__(self, workdir: Path, options: PeerOptions, tag: str) -> None:
        super().__init__(workdir, options, tag)
        # Its only children are copy-on-write fork snapshots (AOF rewrite) sharing its pages.
        self.meter.rss_includes_children = False
        self.data_dir = workdir / "redis-data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "redis.log"

    def command(self) -> list[str]:
        return [
            self.options.redis_bin,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", "",
        ]  # fmt: skip

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            # Own session: a Ctrl-C in the terminal reaches only us; we stop the children in order.
            self.proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    async def wait_ready(self, timeout_s: float) -> float:
        """Until PING answers and the AOF is loaded; returns the monotonic time it was."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is None or self.proc.poll() is not None:
                rc = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"redis exited (rc={rc}):\n{self.log_tail()}")
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

    def stop(self) -> None:
        terminate(self.proc)
        untrack(self)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._retire_admin()

    def disk_bytes(self) -> int:
        return dir_bytes(self.data_dir)

    def producer(self, connections: int) -> RedisProducer:
        return RedisProducer(self.port, connections)

    def producer_factory(self) -> Callable[[int], RedisProducer]:
        return functools.partial(RedisProducer, self.port)

    def consumer(self, topic: str, group: str) -> RedisConsumer:
        return RedisConsumer(self.port, topic, self.options.redis_poll_ms)

    def admin(self) -> Any:
        if self._admin is None:
            self._admin = aioredis.Redis(host="127.0.0.1", port=self.port)
        return self._admin

    async def stored(self, topic: str) -> int:
        return int(await self.admin().zcard(due_key(topic)))

    async def produce_facts(self, topic: str) -> dict[str, Any]:
        return {"stored": await self.stored(topic)}

    async def settle(self, topic: str, expected: int, timeout_s: float) -> dict[str, Any]:
        # A fill this size may have started an AOF rewrite (a forked child): let it finish.
        deadline = time.monotonic() + min(timeout_s, AOF_REWRITE_WAIT_S)
        while (await self.admin().info("persistence")).get("aof_rewrite_in_progress"):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        return {"stored": await self.stored(topic)}

    async def memory_baseline(self) -> dict[str, Any]:
        return dict(await self.admin().info("memory"))

    async def memory_facts(self, baseline: dict[str, Any], pending: int) -> dict[str, Any]:
        info = await self.admin().info("memory")
        used, idle = int(info["used_memory"]), int(baseline["used_memory"])
        return {
            "used_memory_bytes": used,
            "used_memory_idle_bytes": idle,
            "used_memory_rss_bytes": int(info["used_memory_rss"]),
            "mem_fragmentation_ratio": info.get("mem_fragmentation_ratio"),
            "used_memory_per_pending_bytes": (used - idle) / pending if pending else None,
        }

    async def restart_facts(self, topic: str) -> dict[str, Any]:
        return {"stored_after_restart": await self.stored(topic)}

    async def wait_written(self, timeout_s: float) -> dict[str, Any]:
        # With everysec Redis answers before its AOF write(), and postpones that write (up to
        # 2 s) while a background fsync is still running: a kill -9 then loses acknowledged
        # writes. CI saw the probe lost that way. Wait until the AOF buffer is empty, and say
        # whether it was not.
        t0 = time.monotonic()
        unwritten = False
        while int((await self.admin().info("persistence")).get("aof_buffer_length", 0)) > 0:
            unwritten = True
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"redis AOF buffer not written after {timeout_s}s")
            await asyncio.sleep(0.005)
        return {"probe_unwritten_at_ack": unwritten, "probe_write_wait_ms": (time.monotonic() - t0) * 1000}

