"""What the benchmark needs from a system under test: a `Peer` (one server process, started fresh
per workload in its own temp dir), a `Producer` that sends batches of messages due on a
`Schedule`, and a `Consumer` that receives due messages as (receive wall-clock ms, [(id,
deliver_at ms)]).

A workload is written once against this interface. What only one system can say about itself
(delayd's /v1/stats, Redis's INFO) comes through the `*_facts` / `settle` / `before_burst` hooks,
each returning fields to merge into the workload's result.
"""

from __future__ import annotations

import contextlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bench.client import ClientStats
from bench.harness import Bodies, ProcessMeter, track

BATCH = 1000  # messages per produce request, and at most per pull / pop

Received = tuple[float, list[tuple[Any, int]]]  # (receive wall-clock ms, [(id, deliver_at ms)])


# ----------------------------------------------------------------------------------------------
# When messages are due
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delay:
    """Each message due a random delay in [lo_ms, hi_ms] after it is sent (delayd: `delay_ms`;
    Redis: the client adds it to its clock, as a Redis delay queue does)."""

    lo_ms: int
    hi_ms: int


@dataclass(frozen=True)
class Window:
    """Each message due at a random ms of [start_ms, start_ms + width_ms) (delayd: `deliver_at`)."""

    start_ms: int
    width_ms: int


Schedule = Delay | Window


@dataclass(frozen=True)
class PeerOptions:
    daemon_cmd: list[str] | None = None  # replaces `python -m delayd` (another build)
    daemon_args: list[str] = field(default_factory=list)  # extra `serve` flags
    profile_dir: Path | None = None  # py-spy recordings of every daemon go here
    redis_bin: str = "redis-server"
    redis_poll_ms: float = 10.0  # Redis consumers poll this often when nothing is due
    pull_all_fields: bool = False  # delayd consumers ask for every field, not only what they read


# ----------------------------------------------------------------------------------------------
# The interface
# ----------------------------------------------------------------------------------------------


class Producer(ABC):
    """`async with peer.producer(connections) as p:` - sends batches over its own connections."""

    stats: ClientStats

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    @abstractmethod
    async def send_batch(
        self, topic: str, bodies: Bodies, start: int, count: int, schedule: Schedule, rnd: random.Random,
        keys: Sequence[str] | None = None,
    ) -> None:
        """Send bodies[start:start+count], each due per `schedule`; building the batch counts as
        client encode time. `keys`: a business key a message (delayd's `key`; the Redis peer's
        member id), as an order service gives each delayed task its order's id."""

    @abstractmethod
    async def send_probe(self, topic: str, body: bytes, delay_ms: int) -> int:
        """Send one message due `delay_ms` from now; returns its deliver_at (ms)."""

    @abstractmethod
    def client_fields(self) -> dict[str, Any]:
        """The client's own costs, for the produce result."""


class Consumer(ABC):
    """`async with peer.consumer(topic, group) as c:` - open it before producing: delayd creates
    the subscription group then."""

    receives = 0  # pulls / pops sent

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    @abstractmethod
    async def receive(self) -> Received:
        """Wait briefly for due messages and take up to BATCH of them (possibly none)."""

    async def finish(self) -> dict[str, Any]:
        """Settle what was received (acks); returns the consumer's own figures."""
        return {}

    @property
    def acks(self) -> bool:
        """Whether received messages still need acknowledging (what `finish` waits for)."""
        return False


class Peer(ABC):
    """One server process of one system. `async with` starts it and stops it, also on errors."""

    name: ClassVar[str]

    def __init__(self, workdir: Path, options: PeerOptions, tag: str) -> None:
        self.workdir = workdir
        self.options = options
        self.tag = tag  # e.g. "produce-delayd": names logs and profiles
        self.meter = ProcessMeter(self.pid, rss_includes_children=True)
        self._admin: Any = None  # the connection the hooks below use, opened on first use
        self._retired: list[Any] = []  # admin connections to a killed server, closed later

    async def __aenter__(self) -> Peer:
        track(self)
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close_admin()
        finally:
            self.stop()

    @abstractmethod
    def pid(self) -> int | None: ...

    @abstractmethod
    def spawn(self) -> None:
        """Start the server process on the existing data (first start or after `kill9`)."""

    @abstractmethod
    async def wait_ready(self, timeout_s: float) -> float:
        """Until it serves (delayd: /readyz 200; Redis: PING and AOF loaded); the monotonic time."""

    @abstractmethod
    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after a bound). Idempotent; safe from atexit."""

    @abstractmethod
    def kill9(self) -> None:
        """kill -9 the server. Clients must reconnect; the hooks' own connection does so by itself."""

    @abstractmethod
    def disk_bytes(self) -> int: ...

    @abstractmethod
    def producer(self, connections: int) -> Producer: ...

    @abstractmethod
    def consumer(self, topic: str, group: str) -> Consumer: ...

    @abstractmethod
    def producer_factory(self) -> Callable[[int], Producer]:
        """What `producer` does, as a picklable callable: a child process makes its own producer."""

    async def start(self, timeout_s: float = 60.0) -> None:
        self.spawn()
        await self.wait_ready(timeout_s)

    def _retire_admin(self) -> None:
        if self._admin is not None:
            self._retired.append(self._admin)
            self._admin = None

    async def close_admin(self) -> None:
        """Close the connection(s) the hooks below used."""
        self._retire_admin()
        for admin in self._retired:
            with contextlib.suppress(Exception):
                await self._close(admin)
        self._retired.clear()

    async def _close(self, admin: Any) -> None:
        await admin.aclose()

    def profile_phase(self, tag: str) -> None:
        """Profile from now on into a file of its own, when profiling (delayd only)."""
        return None

    # What only one system can say about itself: fields to merge into a workload's result.
    async def produce_facts(self, topic: str) -> dict[str, Any]:
        return {}

    async def settle(self, topic: str, expected: int, timeout_s: float) -> dict[str, Any]:
        """Wait until the server has absorbed `expected` stored messages of `topic`."""
        return {}

    async def before_burst(self, timeout_s: float) -> dict[str, Any]:
        """Between the burst fill and its due second."""
        return {}

    async def delivery_facts(self) -> dict[str, Any]:
        return {}

    async def memory_baseline(self) -> dict[str, Any]:
        return {}

    async def memory_facts(self, baseline: dict[str, Any], pending: int) -> dict[str, Any]:
        return {}

    async def restart_facts(self, topic: str) -> dict[str, Any]:
        return {}

    async def wait_written(self, timeout_s: float) -> dict[str, Any]:
        """Until every acknowledged write would survive kill -9 of the server (not of the
        machine): the restart section kills it right after sending its probe."""
        return {}
