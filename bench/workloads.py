"""The workloads, each written once and run against every peer (`bench.peers`).

A workload is a dataclass: its fields are its parameters (defaults = the full benchmark),
`smoke()` gives its smallest configuration (the test suite runs that against both systems),
`run(ctx, peer)` returns a result dict, and `rows(table)` adds its lines to the comparison table.
To add one: write the class, add it to `WORKLOADS`, and give `bench.daemon_vs_redis` a size
flag for it if it needs one.

Each run gets a fresh server (`ctx.peer`), started and stopped around `run` by the driver; only
one server runs at a time, so the two never compete for the machine's cores. The CPU a server
used per message (µs, user + system, from the kernel) is in every throughput result as
`*server_cpu_us_per_msg`: the speed targets are stated in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import random
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bench.harness import (
    Bodies,
    CpuWindow,
    gc_paused,
    lateness_shape,
    lateness_summary,
    log,
    now_ms,
    now_ms_f,
    run_workers,
    sample_rss,
    us_per_msg,
)
from bench.peers import BATCH, PEERS, Delay, Peer, PeerOptions, Producer, Schedule, Window
from bench.report import Table, fmt

HOUR_MS = 3_600_000
FAR = Delay(HOUR_MS, 48 * HOUR_MS)  # pending messages: due 1-48 h ahead, nothing comes due meanwhile

# Design targets (shared/DESIGN.md, "Targets").
TARGET_PRODUCE_MSGS = 100_000
TARGET_PRODUCE_RATIO = 3.0
TARGET_P99_MS = 10.0
TARGET_BURST_S = 5.0
TARGET_RSS_MB = 150.0
TARGET_READY_S = 2.0
# Issue 14 ("Speed"): daemon CPU per produced and per delivered message.
TARGET_PRODUCE_CPU_US = 3.0
TARGET_DRAIN_CPU_US = 3.0


@dataclass
class Ctx:
    """What every workload shares in one run."""

    base_tmp: Path
    peer_options: PeerOptions
    bodies: Bodies = field(default_factory=lambda: Bodies(100))
    connections: int = 4  # concurrent producer connections
    timeout_factor: float = 1.0
    burst_rate_guess: float = 20_000.0  # fill rate assumed to place the burst second, if none measured
    produce_rate_hint: dict[str, float] = field(default_factory=dict)  # measured fill rate by peer

    def peer(self, side: str, tag: str) -> Peer:
        """A fresh server of `side` in a temp dir of its own (not started: `async with` it)."""
        workdir = Path(tempfile.mkdtemp(prefix=f"{tag}-{side}-", dir=self.base_tmp))
        return PEERS[side](workdir, self.peer_options, f"{tag}-{side}")

    def timeout(self, base_s: float, n: int, per_s: float = 2000.0) -> float:
        """A time bound for handling n messages: generous, scaled by --timeout-factor."""
        return (base_s + n / per_s) * self.timeout_factor


async def fill(ctx: Ctx, prod: Producer, topic: str, n: int, schedule: Schedule) -> None:
    """Produce n messages in batches of 1,000 over ctx.connections connections."""
    rnd = random.Random(11)

    async def one(start: int, count: int) -> None:
        await prod.send_batch(topic, ctx.bodies, start, count, schedule, rnd)

    await run_workers(n, BATCH, ctx.connections, one)


class Workload(ABC):
    name: ClassVar[str]  # what --only selects, and the result section
    tag: ClassVar[str]  # names the temp dirs, logs and profiles

    @classmethod
    @abstractmethod
    def smoke(cls) -> Workload:
        """The smallest configuration that still exercises every step (numbers meaningless)."""

    @property
    def label(self) -> str:
        return self.name

    @property
    def sections(self) -> tuple[str, ...]:
        return (self.name,)

    @abstractmethod
    async def run(self, ctx: Ctx, peer: Peer) -> dict[str, Any]: ...

    def split(self, result: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The result by section (one workload may fill several)."""
        return {self.name: result}

    @abstractmethod
    def rows(self, t: Table) -> None: ...


@dataclass
class Produce(Workload):
    """N messages (100-byte bodies, due 1-48 h ahead), batches of 1,000 -> msg/s."""

    name: ClassVar[str] = "produce"
    tag: ClassVar[str] = "produce"
    n: int = 200_000

    @classmethod
    def smoke(cls) -> Produce:
        return cls(n=2 * BATCH)

    async def run(self, ctx: Ctx, peer: Peer) -> dict[str, Any]:
        topic, n = "bench-produce", self.n
        async with peer.producer(ctx.connections) as prod:
            with CpuWindow(peer.meter) as cpu:
                await asyncio.wait_for(fill(ctx, prod, topic, n, FAR), ctx.timeout(60, n))
            res: dict[str, Any] = {
                "messages": n,
                "msg_per_s": n / cpu.wall_s,
                **cpu.as_dict(),
                "server_cpu_us_per_msg": us_per_msg(cpu.server_cpu_s, n),
                **prod.client_fields(),
                **prod.stats.rtt_summary(),
                "server_rss_bytes": peer.meter.rss_bytes(),
                "disk_bytes": peer.disk_bytes(),
            }
            res.update(await peer.produce_facts(topic))
        ctx.produce_rate_hint[peer.name] = res["msg_per_s"]  # places the burst's due second
        return res

    def rows(self, t: Table) -> None:
        if not t.has("produce"):
            return
        t.row(
            "produce",
            f"throughput, {fmt(t.either('produce', 'messages'), '')} msgs",
            "msg/s",
            "msg_per_s",
            f">= {TARGET_PRODUCE_MSGS:,} and >= {TARGET_PRODUCE_RATIO:g}x redis",
            lambda d, r: d >= TARGET_PRODUCE_MSGS and (r is None or d >= TARGET_PRODUCE_RATIO * r),
        )
        t.row("produce", "wall time", "s", "wall_s")
        t.row("produce", "server CPU", "s", "server_cpu_s")
        t.row("produce", "server CPU per message", "µs", "server_cpu_us_per_msg",
              f"<= {TARGET_PRODUCE_CPU_US:g}", lambda d, r: d <= TARGET_PRODUCE_CPU_US)
        t.row("produce", "client CPU (whole client)", "s", "client_cpu_s")
        t.row("produce", "client encode (dicts+packb / ids+dicts, excl. redis-py)", "s", "client_encode_s")
        t.row("produce", "batch round trip p50 (send -> durable answer)", "ms", "batch_rtt_p50_ms")
        t.row("produce", "batch round trip p99", "ms", "batch_rtt_p99_ms")
        t.row("produce", "disk after", "MB", "disk_bytes")


@dataclass
class Accuracy(Workload):
    """N messages due a few seconds ahead, one consumer running before they are produced ->
    lateness (receive wall-clock ms - deliver_at, consumer side) p50/p99/max and early count."""

    name: ClassVar[str] = "accuracy"
    tag: ClassVar[str] = "accuracy"
    n: int = 20_000
    delay_lo_ms: int = 1000
    delay_hi_ms: int = 6000

    @classmethod
    def smoke(cls) -> Accuracy:
        return cls(n=200, delay_lo_ms=200, delay_hi_ms=700)

    async def run(self, ctx: Ctx, peer: Peer) -> dict[str, Any]:
        return await self.measure(ctx, peer, "bench-accuracy")

    async def measure(self, ctx: Ctx, peer: Peer, topic: str) -> dict[str, Any]:
        group, n = "g", self.n
        lat: list[float] = []
        pairs: list[tuple[int, float]] = []
        seen: set[Any] = set()
        dups = 0
        with gc_paused():
            async with peer.producer(ctx.connections) as prod, peer.consumer(topic, group) as cons:

                async def consume() -> None:
                    nonlocal dups
                    while len(seen) < n:
                        recv, msgs = await cons.receive()
                        for mid, due in msgs:
                            lat.append(recv - due)
                            pairs.append((due, recv - due))
                            if mid in seen:
                                dups += 1
                            seen.add(mid)

                consumer = asyncio.create_task(consume())
                t_prod = time.perf_counter()
                await fill(ctx, prod, topic, n, Delay(self.delay_lo_ms, self.delay_hi_ms))
                produce_s = time.perf_counter() - t_prod
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(consumer, ctx.timeout(40, 0))
                settled = await cons.finish()
        res = {
            "messages": n,
            "received": len(seen),
            "duplicates": dups,
            "produce_s": produce_s,
            **settled,
            **lateness_summary(lat),
            **await peer.delivery_facts(),
            "late_shape": lateness_shape(pairs),
        }
        return res

    def rows(self, t: Table) -> None:
        w = self.name
        if not t.has(w):
            return
        t.row(w, "received", "msgs", "received")
        t.row(w, "lateness p50", "ms", "p50_ms")
        t.row(w, "lateness p99", "ms", "p99_ms", f"<= {TARGET_P99_MS:g}", lambda d, r: d <= TARGET_P99_MS)
        t.row(w, "lateness max", "ms", "max_ms")
        t.row(w, "early (before deliver_at)", "msgs", "early", "0", lambda d, r: d == 0)



def _load_child(factory: Callable[[int], Producer], connections: int, rate: float, topic: str,
                stop: Any, started: Any, sent: Any, keyed: bool = False) -> None:
    """The concurrent producer of `accuracy_load`, in a process of its own (so it does not share the
    measuring client's event loop or GIL): batches of 1,000 far-future messages at `rate` msg/s,
    paced on the monotonic clock, until `stop` is set. `sent` ends as the number acknowledged.
    `keyed`: each message has a key of its own, order-<n> with n counting up (an order service's ids)."""

    async def main() -> None:
        bodies = Bodies(100)
        rnd = random.Random(23)
        numbers = itertools.count(0, BATCH)
        async with factory(connections) as prod:
            done = 0

            async def one() -> None:
                nonlocal done
                first = next(numbers)
                keys = [f"order-{first + i:012d}" for i in range(BATCH)] if keyed else None
                await prod.send_batch(topic, bodies, 0, BATCH, FAR, rnd, keys)
                done += BATCH
                sent.value = done
                started.set()

            pending: set[asyncio.Task[None]] = set()
            interval = BATCH / rate
            next_at = time.monotonic()
            while not stop.is_set():
                now = time.monotonic()
                if now < next_at:
                    await asyncio.sleep(min(next_at - now, 0.05))
                    continue
                if len(pending) >= connections:  # never more in flight than connections
                    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    continue
                task = asyncio.create_task(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
                # Paced, never catching up in a rush: a late batch moves the schedule on.
                next_at = max(next_at + interval, time.monotonic() - interval)
            if pending:
                await asyncio.wait(pending)

    asyncio.run(main())


@dataclass
class AccuracyLoad(Accuracy):
    """`accuracy` while another process produces far-future messages at half the peer's measured
    produce rate: releases must keep their p99 while bulk produce work runs (issue 14). `keyed`
    (`--keyed-load`): the load's messages each have a key (its rate still half the keyless one)."""

    name: ClassVar[str] = "accuracy_load"
    tag: ClassVar[str] = "accuracy-load"
    load_fraction: float = 0.5
    keyed: bool = False
    # Without a produce run before it, the rate is measured first, with as many messages as the
    # produce workload sends: 20,000 took a tenth of a second or less and measured as little as
    # a third of the rate on a quiet 16-core host (BENCHMARKS.md), so the load was lighter than meant.
    calibrate_n: int = 200_000

    @classmethod
    def smoke(cls) -> AccuracyLoad:
        return cls(n=200, delay_lo_ms=200, delay_hi_ms=700, calibrate_n=BATCH)

    async def run(self, ctx: Ctx, peer: Peer) -> dict[str, Any]:
        if peer.name not in ctx.produce_rate_hint:
            async with peer.producer(ctx.connections) as prod:
                t0 = time.perf_counter()
                await fill(ctx, prod, "bench-calibrate", self.calibrate_n, FAR)
                ctx.produce_rate_hint[peer.name] = self.calibrate_n / (time.perf_counter() - t0)
        rate = ctx.produce_rate_hint[peer.name] * self.load_fraction
        mp = multiprocessing.get_context("spawn")
        stop, started, sent = mp.Event(), mp.Event(), mp.Value("q", 0)
        child = mp.Process(target=_load_child, name="accuracy-load",
                           args=(peer.producer_factory(), ctx.connections, rate, "bench-load", stop, started, sent,
                                 self.keyed))
        child.start()
        try:
            deadline = time.monotonic() + ctx.timeout(30, 0)
            while not started.is_set():
                if not child.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the load producer did not start")
                await asyncio.sleep(0.05)
            t0, n0 = time.perf_counter(), sent.value
            with CpuWindow(peer.meter) as cpu:
                res = await self.measure(ctx, peer, "bench-accuracy")
            load_sent, load_s = sent.value - n0, time.perf_counter() - t0
        finally:
            stop.set()
            child.join(30)
            if child.is_alive():
                child.kill()
        res.update({
            "load_target_msg_per_s": rate,
            "load_msg_per_s": load_sent / load_s,
            "load_messages": load_sent,
            "load_keyed": self.keyed,
            "server_cpu_s": cpu.server_cpu_s,
        })
        return res

    def rows(self, t: Table) -> None:
        if t.has(self.name):
            what = "concurrent keyed produce (target: half the keyless max)" if self.keyed else \
                "concurrent produce (target: half the max)"
            t.row(self.name, what, "msg/s", "load_msg_per_s")
        super().rows(t)


@dataclass
class Burst(Workload):
    """M messages due in the same wall-clock second, placed after the fill -> seconds from the
    start of that second until one consumer (batches of 1,000, acks off the critical path) has
    them all."""

    name: ClassVar[str] = "burst"
    tag: ClassVar[str] = "burst"
    m: int = 1_000_000
    lead_s: float = 5.0  # the due second is this long after the expected end of the fill (x1.6)
    calibrate_n: int = 20_000  # measure the fill rate first when no produce run did

    @classmethod
    def smoke(cls) -> Burst:
        return cls(m=2 * BATCH, lead_s=1.0, calibrate_n=BATCH)

    def due_second(self, ctx: Ctx, side: str) -> int:
        """Far enough ahead that filling M messages finishes before it; a whole second."""
        rate = ctx.produce_rate_hint.get(side) or ctx.burst_rate_guess
        fill_s = self.m / max(rate, 1.0)
        return ((now_ms() + int((fill_s * 1.6 + self.lead_s) * 1000)) // 1000 + 1) * 1000

    async def run(self, ctx: Ctx, peer: Peer) -> dict[str, Any]:
        topic, group, m = "bench-burst", "g", self.m
        async with peer.producer(ctx.connections) as prod, peer.consumer(topic, group) as cons:
            if peer.name not in ctx.produce_rate_hint:
                t0 = time.perf_counter()
                await fill(ctx, prod, "bench-calibrate", self.calibrate_n, FAR)
                ctx.produce_rate_hint[peer.name] = self.calibrate_n / (time.perf_counter() - t0)
            t_due = self.due_second(ctx, peer.name)
            with CpuWindow(peer.meter) as fill_cpu:
                await asyncio.wait_for(fill(ctx, prod, topic, m, Window(t_due, 1000)), ctx.timeout(60, m))
            slack_ms = t_due - now_ms()
            log(f"{peer.name} burst: filled {m} in {fill_cpu.wall_s:.1f}s, due in {slack_ms / 1000:.1f}s")
            facts = await peer.before_burst(max(0.0, slack_ms / 1000 - 0.5))
            lat: list[float] = []
            seen: set[Any] = set()
            dups = 0
            last_recv = 0.0
            while now_ms() < t_due - 300:
                await asyncio.sleep(0.05)
            peer.profile_phase("burst-drain")
            with gc_paused(), CpuWindow(peer.meter) as drain_cpu:
                deadline = time.monotonic() + ctx.timeout(30, m, 10_000) + max(0, (t_due - now_ms()) / 1000)
                while len(seen) < m and time.monotonic() < deadline:
                    recv, msgs = await cons.receive()
                    if not msgs:
                        continue
                    last_recv = recv
                    for mid, due in msgs:
                        lat.append(recv - due)
                        if mid in seen:
                            dups += 1
                        seen.add(mid)
                t_all_pulled = now_ms_f()
                settled = await cons.finish()
                t_all_acked = now_ms_f()
        done = len(seen) >= m
        res: dict[str, Any] = {
            "messages": m,
            "received": len(seen),
            "duplicates": dups,
            "pulls": cons.receives,
            "due_second_ms": t_due,
            "fill_s": fill_cpu.wall_s,
            "fill_msg_per_s": m / fill_cpu.wall_s,
            "fill_server_cpu_s": fill_cpu.server_cpu_s,
            "fill_server_cpu_us_per_msg": us_per_msg(fill_cpu.server_cpu_s, m),
            "fill_finished_before_due": slack_ms > 0,
            "slack_before_due_s": slack_ms / 1000,
            **facts,
            "all_pulled_after_due_s": (last_recv - t_due) / 1000 if done else None,
            "all_pulled_wall_ms": t_all_pulled,
            **settled,
            "drain": {**drain_cpu.as_dict(), "server_cpu_us_per_msg": us_per_msg(drain_cpu.server_cpu_s, len(seen))},
            "drain_msg_per_s": len(seen) / max(0.001, (last_recv - t_due) / 1000),
            "server_rss_bytes": peer.meter.rss_bytes(),
            "server_vm": peer.meter.vm_status(),
            **lateness_summary(lat),
        }
        if cons.acks:
            res["all_acked_after_due_s"] = (t_all_acked - t_due) / 1000 if done else None
        return res

    def rows(self, t: Table) -> None:
        if not t.has("burst"):
            return
        t.row(
            "burst",
            f"all {fmt(t.either('burst', 'messages'), '')} pulled, after due second",
            "s",
            "all_pulled_after_due_s",
            f"<= {TARGET_BURST_S:g}",
            lambda d, r: d <= TARGET_BURST_S,
        )
        t.row("burst", "received before the time bound", "msgs", "received")
        t.row("burst", "drain rate (received / drain wall time)", "msg/s", "drain_msg_per_s")
        t.row("burst", "drain server CPU per delivered message", "µs", "drain.server_cpu_us_per_msg",
              f"<= {TARGET_DRAIN_CPU_US:g}", lambda d, r: d <= TARGET_DRAIN_CPU_US)
        t.row("burst", "lateness p50", "ms", "p50_ms")
        t.row("burst", "lateness p99", "ms", "p99_ms")
        t.row("burst", "lateness max", "ms", "max_ms")
        t.row("burst", "early (before deliver_at)", "msgs", "early", "0", lambda d, r: d == 0)
        t.row("burst", "fill throughput", "msg/s", "fill_msg_per_s")
        t.row("burst", "fill server CPU per message", "µs", "fill_server_cpu_us_per_msg")
        t.row("burst", "fill finished before due", "", "fill_finished_before_due")


@dataclass
class Pending(Workload):
    """P far-future messages pending -> server RSS (memory); then kill -9 -> seconds until it
    serves again and until a message due while it was down arrives (restart)."""

    name: ClassVar[str] = "pending"
    tag: ClassVar[str] = "pending"
    p: int = 1_000_000
    memory: bool = True  # report the "memory" section
    restart: bool = True  # go on to the "restart" section
    idle_window_s: float = 1.0  # idle RSS: the max over this long before the fill
    rss_window_s: float = 3.0  # RSS with P pending: the max over this long once settled
    probe_delay_ms: int = 500  # the probe is due this long after the kill

    @classmethod
    def smoke(cls) -> Pending:
        return cls(p=2 * BATCH, idle_window_s=0.1, rss_window_s=0.2)

    @property
    def label(self) -> str:
        return "/".join(self.sections)

    @property
    def sections(self) -> tuple[str, ...]:
        return tuple(s for s, on in (("memory", self.memory), ("restart", self.restart)) if on)

    def split(self, result: dict[str, Any]) -> dict[str, dict[str, Any]]:
        # A failure goes into every section; so does how disturbed the run was.
        missing = {"error": result.get("error", "not measured")}
        return {s: {**result.get(s, missing), "env": result.get("env")} for s in self.sections}

    async def run(self, ctx: Ctx, peer: Peer) -> dict[str, Any]:
        topic, probe_topic, p = "bench-pending", "bench-restart-probe", self.p
        out: dict[str, Any] = {}
        async with peer.producer(ctx.connections) as prod:
            baseline = await peer.memory_baseline()
            rss0 = await sample_rss(peer.meter, self.idle_window_s)
            with CpuWindow(peer.meter) as fill_cpu:
                await asyncio.wait_for(fill(ctx, prod, topic, p, FAR), ctx.timeout(60, p))
            log(f"{peer.name}: {p} pending produced in {fill_cpu.wall_s:.1f}s; waiting for it to settle")
            settled = await peer.settle(topic, p, ctx.timeout(60, p, 10_000))
            rss = await sample_rss(peer.meter, self.rss_window_s)
            out["memory"] = {
                "pending": p,
                "fill_s": fill_cpu.wall_s,
                "fill_msg_per_s": p / fill_cpu.wall_s,
                "fill_server_cpu_s": fill_cpu.server_cpu_s,
                "fill_server_cpu_us_per_msg": us_per_msg(fill_cpu.server_cpu_s, p),
                **settled,
                "rss_idle_bytes": rss0,
                "rss_bytes": rss,
                "vm": peer.meter.vm_status(),
                "rss_per_pending_bytes": (rss - rss0) / p if p else None,
                "disk_bytes": peer.disk_bytes(),
                **await peer.memory_facts(baseline, p),
            }
            if not self.restart:
                return out
            # A probe due shortly after the kill: it must survive and come out right after restart.
            probe_due = await prod.send_probe(probe_topic, b"probe", self.probe_delay_ms)
        written = await peer.wait_written(ctx.timeout(10, 1))
        t_kill = time.monotonic()
        t_kill_wall = now_ms_f()
        peer.kill9()
        peer.spawn()
        t_spawn = time.monotonic()
        t_ready = await peer.wait_ready(ctx.timeout(60, p, 100_000))
        async with peer.consumer(probe_topic, "g") as cons:
            deadline = time.monotonic() + 30
            got: list[Any] = []
            recv = 0.0
            while not got and time.monotonic() < deadline:
                recv, got = await cons.receive()
            await cons.finish()
        out["restart"] = {
            "pending": p,
            "ready_after_kill_s": t_ready - t_kill,
            "spawn_to_ready_s": t_ready - t_spawn,
            "probe_delivered": bool(got),
            "probe_due_after_kill_ms": probe_due - t_kill_wall,
            "probe_received_after_kill_s": (recv - t_kill_wall) / 1000 if got else None,
            "probe_lateness_ms": (recv - probe_due) if got else None,
            **written,
            **await peer.restart_facts(topic),
            "rss_after_restart_bytes": peer.meter.rss_bytes(),
        }
        return out

    def rows(self, t: Table) -> None:
        if t.has("memory"):
            t.row(
                "memory",
                f"server RSS, {fmt(t.either('memory', 'pending'), '')} pending",
                "MB",
                "rss_bytes",
                f"<= {TARGET_RSS_MB:g} (at 10M)",
                lambda d, r: d / 1e6 <= TARGET_RSS_MB,
            )
            t.row("memory", "server RSS idle (before fill)", "MB", "rss_idle_bytes")
            t.row("memory", "RSS growth per pending msg", "B", "rss_per_pending_bytes")
            t.row("memory", "delayd RSS vs redis used_memory", "MB", "rss_bytes", rkey="used_memory_bytes")
            t.row("memory", "fill server CPU per message", "µs", "fill_server_cpu_us_per_msg")
            t.row("memory", "disk", "MB", "disk_bytes")
        if t.has("restart"):
            t.row(
                "restart",
                f"ready after kill -9, {fmt(t.either('restart', 'pending'), '')} pending",
                "s",
                "ready_after_kill_s",
                f"<= {TARGET_READY_S:g} (at 10M)",
                lambda d, r: d <= TARGET_READY_S,
            )
            t.row("restart", "process start to ready", "s", "spawn_to_ready_s")
            t.row("restart", "probe (due 0.5s after kill) received after kill", "s", "probe_received_after_kill_s")
            t.row("restart", "probe lateness", "ms", "probe_lateness_ms")


# The order they run in and their rows appear. `--only` names sections: Pending fills two.
WORKLOADS: tuple[type[Workload], ...] = (Produce, Accuracy, AccuracyLoad, Burst, Pending)
SECTIONS = ("produce", "accuracy", "accuracy_load", "burst", "memory", "restart")
