"""delayd as a peer: the real daemon, `python -m delayd serve --fsync always` in a temp data dir,
started through the test suite's `DaemonProcess`, spoken to with the raw client in `bench.client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.client import Acker, Delayd
from bench.harness import Bodies, Profiler, dir_bytes, untrack
from bench.peers.base import BATCH, Consumer, Delay, Peer, PeerOptions, Producer, Received, Schedule
from tests.support.daemon import DaemonProcess

PULL_WAIT_MS = 1000  # consumers long-poll this long
LEASE_MS = 600_000  # leases outlive any workload: a message is never redelivered mid-run
INDEX_POLL_S = 0.25  # how often /v1/stats is read while waiting for indexing to settle


class DelaydProducer(Producer):
    def __init__(self, url: str, connections: int) -> None:
        self.client = Delayd(url, connections)
        self.stats = self.client.stats

    async def __aenter__(self) -> DelaydProducer:
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__()

    async def send_batch(
        self, topic: str, bodies: Bodies, start: int, count: int, schedule: Schedule, rnd: random.Random,
        keys: Sequence[str] | None = None,
    ) -> None:
        t0 = time.perf_counter()
        end = start + count
        if isinstance(schedule, Delay):
            lo, hi = schedule.lo_ms, schedule.hi_ms
            msgs = [{"body": bodies[i], "delay_ms": rnd.randint(lo, hi)} for i in range(start, end)]
        else:
            at, width = schedule.start_ms, schedule.width_ms
            msgs = [{"body": bodies[i], "deliver_at": at + rnd.randrange(width)} for i in range(start, end)]
        if keys is not None:
            for m, key in zip(msgs, keys, strict=True):
                m["key"] = key
        self.stats.encode_s += time.perf_counter() - t0
        await self.client.produce(topic, msgs)

    async def send_probe(self, topic: str, body: bytes, delay_ms: int) -> int:
        res = await self.client.produce(topic, [{"body": body, "delay_ms": delay_ms}])
        return int(res[0]["deliver_at"])

    def client_fields(self) -> dict[str, Any]:
        return {
            "client_encode_s": self.stats.encode_s,
            "client_decode_s": self.stats.decode_s,
            "requests": self.stats.requests,
            "retries_429": self.stats.retries_429,
        }


class DelaydConsumer(Consumer):
    """Long-polls `pull` on one connection; acks in batches on two others, off the critical path."""

    def __init__(self, url: str, topic: str, group: str, all_fields: bool = False) -> None:
        self.topic, self.group = topic, group
        # What receive() reads besides id and receipt, as a consumer asks for it (API: `fields`);
        # --pull-all-fields measures the full answer.
        self.fields = None if all_fields else ["deliver_at"]
        self.pulls = Delayd(url, 1)
        self.acks_client = Delayd(url, 2)
        self.acker: Acker | None = None
        self._first: tuple[float, list[dict[str, Any]]] | None = None
        self._finished = False

    async def __aenter__(self) -> DelaydConsumer:
        await self.pulls.__aenter__()
        await self.acks_client.__aenter__()
        self.acker = Acker(self.acks_client, self.topic, self.group)
        # The first pull creates the group; anything it already finds due is handed out first.
        recv, msgs = await self.pulls.pull(self.topic, self.group, 1, 0, LEASE_MS, self.fields)
        if msgs:
            self._first = (recv, msgs)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.acker is not None and not self._finished:
            for task in self.acker.tasks:
                task.cancel()
            await asyncio.gather(*self.acker.tasks, return_exceptions=True)
        await self.pulls.__aexit__()
        await self.acks_client.__aexit__()

    async def receive(self) -> Received:
        assert self.acker is not None
        if self._first is not None:
            (recv, msgs), self._first = self._first, None
        else:
            recv, msgs = await self.pulls.pull(self.topic, self.group, BATCH, PULL_WAIT_MS, LEASE_MS, self.fields)
            self.receives += 1
        if msgs:
            self.acker.put([m["receipt"] for m in msgs])
        return recv, [(m["id"], m["deliver_at"]) for m in msgs]

    async def finish(self) -> dict[str, Any]:
        assert self.acker is not None
        if not self._finished:
            await self.acker.close()
            self._finished = True
        return {"acked": self.acker.acked, "ack_stale": self.acker.stale}

    @property
    def acks(self) -> bool:
        return True


class DelaydPeer(Peer):
    name = "delayd"

    def __init__(self, workdir: Path, options: PeerOptions, tag: str) -> None:
        super().__init__(workdir, options, tag)
        self.daemon = DaemonProcess(
            workdir / "data",
            fsync="always",
            extra_args=options.daemon_args,
            command_prefix=options.daemon_cmd,
            new_session=True,
        )
        self.profiler = Profiler(options.profile_dir, tag)

    @property
    def url(self) -> str:
        return self.daemon.url

    def pid(self) -> int | None:
        proc = self.daemon.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def spawn(self) -> None:
        self.daemon.data_dir.mkdir(parents=True, exist_ok=True)
        proc = self.daemon.start(wait_ready=False).proc
        assert proc is not None
        self.profiler.attach(proc.pid)

    def _check_alive(self) -> None:
        proc = self.daemon.proc
        if proc is None or proc.poll() is not None:
            rc = None if proc is None else proc.returncode
            raise RuntimeError(f"delayd exited (rc={rc}):\n{self.daemon.log_tail(40)}")

    async def wait_ready(self, timeout_s: float) -> float:
        # Polled every 5 ms (DaemonProcess.wait_ready polls every 20 ms, too coarse for the
        # restart figure, and blocks the loop).
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as s:
            while True:
                self._check_alive()
                try:
                    async with s.get(self.url + "/readyz") as r:
                        await r.read()
                        if r.status == 200:
                            return time.monotonic()
                except (TimeoutError, aiohttp.ClientError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"delayd not ready after {timeout_s}s:\n{self.daemon.log_tail(40)}")
                await asyncio.sleep(0.005)

    def stop(self) -> None:
        self.profiler.pause()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.daemon.stop()
        self.profiler.finish()
        untrack(self)

    def kill9(self) -> None:
        self.daemon.kill9()
        self.profiler.pause()
        self._retire_admin()

    def disk_bytes(self) -> int:
        return dir_bytes(self.daemon.data_dir)

    def producer(self, connections: int) -> DelaydProducer:
        return DelaydProducer(self.url, connections)

    def producer_factory(self) -> Callable[[int], DelaydProducer]:
        return functools.partial(DelaydProducer, self.url)

    def consumer(self, topic: str, group: str) -> DelaydConsumer:
        return DelaydConsumer(self.url, topic, group, self.options.pull_all_fields)

    def profile_phase(self, tag: str) -> None:
        pid = self.pid()
        if pid is not None:
            self.profiler.phase(pid, tag)

    async def _close(self, admin: Any) -> None:
        await admin.__aexit__()

    async def stats(self) -> dict[str, Any]:
        """GET /v1/stats; a failure is reported in the dict, it must not sink a run."""
        try:
            if self._admin is None:
                self._admin = await Delayd(self.url, 1).__aenter__()
            return dict(await self._admin.get_json("/v1/stats"))
        except Exception as e:  # noqa: BLE001
            return {"error": repr(e)}

    async def wait_indexed(self, expected: int, timeout_s: float) -> tuple[bool, dict[str, Any]]:
        """Until /v1/stats shows `expected` scheduled and every pipeline queue empty (twice)."""
        deadline = time.monotonic() + timeout_s
        calm = 0
        st: dict[str, Any] = {}
        while time.monotonic() < deadline:
            st = await self.stats()
            pipeline = st.get("pipeline") or {}
            depths = [v for v in pipeline.values() if isinstance(v, (int, float))]
            if st.get("scheduled", -1) >= expected and all(v == 0 for v in depths):
                calm += 1
                if calm >= 2:
                    return True, st
            else:
                calm = 0
            await asyncio.sleep(INDEX_POLL_S)
        return False, st

    async def produce_facts(self, topic: str) -> dict[str, Any]:
        return {"stats_after": await self.stats()}

    async def settle(self, topic: str, expected: int, timeout_s: float) -> dict[str, Any]:
        indexed, st = await self.wait_indexed(expected, timeout_s)
        return {
            "indexed": indexed,
            "scheduled_reported": st.get("scheduled"),
            "daemon_disk_bytes": st.get("disk_bytes"),
            "pipeline": st.get("pipeline"),
        }

    async def before_burst(self, timeout_s: float) -> dict[str, Any]:
        indexed, _ = await self.wait_indexed(0, timeout_s)
        return {"indexed_before_due": indexed}

    async def delivery_facts(self) -> dict[str, Any]:
        return {"daemon_reported_lateness_ms": (await self.stats()).get("lateness_ms")}

    async def restart_facts(self, topic: str) -> dict[str, Any]:
        return {"scheduled_after_restart": (await self.stats()).get("scheduled")}
