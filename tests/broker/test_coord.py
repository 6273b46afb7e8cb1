"""Replication coordination (broker/coord.py) against a real etcd: election, the in-sync set,
fencing, and what happens when a primary is cut off, frozen, or etcd itself restarts.

Every test keeps a watchdog that samples `may_acknowledge()` of every member of its shard and
checks, from the members' own role changes, that no two terms of acknowledging ever overlap.
Short leases (1-2 s) keep the file quick; every wait polls a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from delayd.broker.config import ReplicationConfig
from delayd.broker.coord import (
    CLOCK_RATE_DRIFT,
    RENEWALS_PER_WINDOW,
    Coordinator,
    Reason,
    Role,
    RoleChange,
    ShardKeys,
    fence_clock,
)
from delayd.broker.errors import NotPrimary, StaleIsr
from delayd.broker.etcd import EtcdClient

from tests.support.daemon import ROOT
from tests.support.daemon import until as poll
from tests.support.etcd import EtcdProcess
from tests.support.tcpproxy import TcpProxy

TTL_MS = 2000  # where no test waits for a lease to run out
SHORT_TTL_MS = 1000  # where one does
MARGIN_MS = 200
WAIT_S = 15.0


async def until(predicate: Callable[[], Any], timeout_s: float = WAIT_S, what: str = "condition") -> Any:
    return await poll(predicate, timeout_s, what, interval_s=0.005)


def member_config(endpoint: str, prefix: str, name: str, ttl_ms: int = TTL_MS) -> ReplicationConfig:
    return ReplicationConfig(enabled=True, shard="s0", member=name, advertise_url=f"http://{name}.test:7070",
                             etcd_endpoints=(endpoint,), etcd_timeout_ms=500, lease_ttl_ms=ttl_ms,
                             fence_margin_ms=MARGIN_MS, key_prefix=prefix).validate()


class Shard:
    """The members of one shard (under a key prefix of its own), their role changes, and a watchdog."""

    def __init__(self, endpoint: str, ttl_ms: int = TTL_MS) -> None:
        self.endpoint = endpoint
        self.ttl_ms = ttl_ms
        self.prefix = f"/test-{uuid.uuid4().hex[:12]}"
        self.keys = ShardKeys.of(self.prefix, "s0")
        self.members: dict[str, Coordinator] = {}
        self.changes: list[tuple[str, RoleChange]] = []
        self.overlaps: list[tuple[float, list[str]]] = []
        self.etcd = EtcdClient([endpoint])
        self._watchdog: asyncio.Task[None] | None = None
        self._clients: list[EtcdClient] = [self.etcd]

    def add(self, name: str, *, endpoint: str | None = None, **kw: Any) -> Coordinator:
        cfg = member_config(endpoint or self.endpoint, self.prefix, name, self.ttl_ms)
        c = Coordinator(cfg, **kw)
        if "client" in kw:  # the member does not close a client it was given
            self._clients.append(kw["client"])
        c.add_listener(lambda change: self.changes.append((name, change)))
        self.members[name] = c
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(self._watch())
        return c

    async def start(self, *names: str, **kw: Any) -> list[Coordinator]:
        out = []
        for name in names:
            c = self.add(name, **kw)
            await c.start()
            out.append(c)
        return out

    async def _watch(self) -> None:
        while True:
            acking = [n for n, c in self.members.items() if c.may_acknowledge()]
            if len(acking) > 1:
                self.overlaps.append((fence_clock(), acking))
            await asyncio.sleep(0.001)

    def acking(self) -> list[str]:
        return [n for n, c in self.members.items() if c.may_acknowledge()]

    async def primary(self, timeout_s: float = WAIT_S) -> Coordinator:
        (name,) = await until(lambda: (a := self.acking()) and len(a) == 1 and a, timeout_s, "one primary")
        return self.members[name]

    def terms(self) -> list[tuple[str, int, float, float]]:
        """(member, epoch, elected at, stopped acknowledging at) from the role changes."""
        out, open_terms = [], {}
        for name, c in self.changes:
            if c.role is Role.PRIMARY:
                open_terms[name] = (c.epoch, c.at_s)
            elif name in open_terms:
                epoch, start = open_terms.pop(name)
                out.append((name, epoch, start, c.at_s))
        out.extend((name, epoch, start, float("inf")) for name, (epoch, start) in open_terms.items())
        return sorted(out, key=lambda t: t[2])

    def check_never_two_primaries(self) -> None:
        assert self.overlaps == [], self.overlaps
        terms = self.terms()
        for before, after in zip(terms, terms[1:], strict=False):
            assert before[3] < after[2], f"terms overlap: {before} and {after}"
            assert before[1] < after[1], f"epoch did not grow: {before} then {after}"

    async def etcd_primary(self) -> dict[str, Any] | None:
        kv = (await self.etcd.get(self.keys.primary)).get(self.keys.primary)
        return json.loads(kv.value) if kv else None

    async def etcd_epoch(self) -> int:
        kv = (await self.etcd.get(self.keys.epoch)).get(self.keys.epoch)
        return int(kv.value) if kv else 0

    async def seed_isr(self, *members: str) -> None:
        """What a running shard's primary would have written: these members are in sync."""
        await self.etcd.put(self.keys.isr, json.dumps({"epoch": 0, "members": list(members)}).encode())

    async def close(self) -> None:
        for c in self.members.values():
            await c.stop()
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        for client in self._clients:
            await client.close()


@pytest.fixture
async def shard(etcd: EtcdProcess) -> AsyncIterator[Shard]:
    s = Shard(etcd.endpoint)
    yield s
    await s.close()


@pytest.fixture
async def short_shard(etcd: EtcdProcess) -> AsyncIterator[Shard]:
    s = Shard(etcd.endpoint, SHORT_TTL_MS)
    yield s
    await s.close()


async def test_one_primary_among_three_and_describe(shard: Shard) -> None:
    await shard.start("a", "b", "c")
    p = await shard.primary()
    followers = [c for c in shard.members.values() if c is not p]
    await until(lambda: all(f.primary is not None and f.primary.member == p.member for f in followers),
                what="followers know the primary")
    assert all(f.role is Role.FOLLOWER and not f.may_acknowledge() for f in followers)
    held = await shard.etcd_primary()
    assert held == {"member": p.member, "url": p.url, "epoch": p.epoch}
    assert await shard.etcd_epoch() == p.epoch >= 1
    await until(lambda: len(shard.changes) and True, what="registration")
    d = await followers[0].describe()
    assert d["primary"] == held and d["epoch"] == p.epoch
    assert d["isr"]["members"] == [p.member]  # the bootstrap winner's set is itself alone
    assert d["self"] == {"member": followers[0].member, "role": "follower", "epoch": p.epoch,
                         "may_acknowledge": False, "fence_left_ms": None}
    roles = {m["member"]: (m["role"], m["in_sync"]) for m in d["members"]}
    assert roles[p.member] == ("primary", True)
    assert {n: r for n, r in roles.items() if n != p.member} == {f.member: ("follower", False) for f in followers}
    mine = await p.describe()
    assert mine["self"]["role"] == "primary" and mine["self"]["may_acknowledge"] is True
    assert 0 < mine["self"]["fence_left_ms"] <= TTL_MS
    shard.check_never_two_primaries()


async def test_epoch_only_grows_across_failovers(shard: Shard) -> None:
    await shard.seed_isr("a", "b", "c")
    await shard.start("a", "b", "c")
    epochs = []
    for _ in range(3):
        p = await shard.primary()
        epochs.append(p.epoch)
        await p.stop()  # hands its lease back: the next election need not wait for it to expire
        del shard.members[p.member]
        await shard.start(p.member)  # the same member comes back as a follower
    p = await shard.primary()
    epochs.append(p.epoch)
    assert epochs == sorted(set(epochs)), epochs
    assert await shard.etcd_epoch() == epochs[-1]
    elected = [c.epoch for _, c in shard.changes if c.reason is Reason.ELECTED]
    assert elected == epochs
    shard.check_never_two_primaries()


async def test_fence_deadline_counts_from_the_renewal_send_time(etcd: EtcdProcess, shard: Shard) -> None:
    """With a clock the test moves: the deadline is send time + TTL * (1 - drift) - margin, where
    the send time is that of the last successful renewal, however long its answer took."""
    now = [100.0]
    renewals: list[float] = []
    hold_second = asyncio.Event()

    class SlowAnswers(EtcdClient):
        async def lease_keepalive(self, lease_id: int, *, timeout_s: float | None = None) -> int:
            if lease_id != coord.lease_id:  # the member registry's lease: leave it alone
                return await super().lease_keepalive(lease_id, timeout_s=timeout_s)
            renewals.append(now[0])
            if len(renewals) == 1:
                now[0] += 0.3  # this answer takes 300 ms to come back
                return await super().lease_keepalive(lease_id, timeout_s=timeout_s)
            await hold_second.wait()  # the next one never comes back
            return 0

    window = 1.0 * (TTL_MS / 1000) * (1 - CLOCK_RATE_DRIFT) - MARGIN_MS / 1000
    coord = shard.add("a", client=SlowAnswers([etcd.endpoint]), clock=lambda: now[0])
    await coord.start()
    await until(lambda: coord.role is Role.PRIMARY, what="elected")
    assert coord.fence_deadline == pytest.approx(100.0 + window)  # from the grant's send time
    now[0] = 100.5
    await until(lambda: len(renewals) >= 2, what="a renewal answered and the next one sent")
    assert renewals[0] == 100.5
    assert coord.fence_deadline == pytest.approx(100.5 + window)  # not 100.8 + window
    now[0] = 100.5 + window - 0.001
    assert coord.may_acknowledge()
    now[0] = 100.5 + window
    assert not coord.may_acknowledge()
    assert coord.role is Role.FOLLOWER and coord.stats.lost_primary == 1
    assert shard.changes[-1][1].reason is Reason.LOST_PRIMARY
    now[0] = 100.0  # even a clock that went back cannot bring the term back
    assert not coord.may_acknowledge()
    hold_second.set()


async def test_partitioned_primary_stops_acknowledging_before_etcd_expires_its_lease(
        etcd: EtcdProcess, short_shard: Shard) -> None:
    shard = short_shard
    proxy = await TcpProxy("127.0.0.1", etcd.client_port).start()
    try:
        await shard.seed_isr("a", "b", "c")
        (a,) = await shard.start("a", endpoint=proxy.endpoint)
        assert await shard.primary() is a
        await shard.start("b", "c")
        await until(lambda: all(c.primary and c.primary.member == "a" for c in shard.members.values()))
        lease, epoch = a.lease_id, a.epoch
        assert lease is not None
        proxy.partition()
        # Ask etcd (on a path of our own) about a's lease until it is gone, noting when it last had it.
        last_alive = None
        deadline = time.monotonic() + WAIT_S
        while await shard.etcd.lease_time_to_live(lease) >= 0:
            last_alive = fence_clock()
            assert time.monotonic() < deadline, "a's lease never expired"
            await asyncio.sleep(0.01)
        lost = [c for n, c in shard.changes if n == "a" and c.role is Role.FOLLOWER and c.reason is Reason.LOST_PRIMARY]
        assert len(lost) == 1 and last_alive is not None
        # a had stopped acknowledging while etcd still held its lease.
        assert lost[0].at_s < last_alive, (lost[0].at_s, last_alive)
        new = await shard.primary()
        assert new.member in ("b", "c") and new.epoch == epoch + 1
        elected = next(c for n, c in shard.changes if n == new.member and c.reason is Reason.ELECTED)
        assert lost[0].at_s < elected.at_s
        proxy.heal()
        await until(lambda: a.primary is not None and a.primary.member == new.member, what="a follows the new primary")
        assert a.role is Role.FOLLOWER and (await shard.etcd_primary() or {}).get("member") == new.member
        shard.check_never_two_primaries()
    finally:
        await proxy.stop()


async def test_primary_steps_down_at_once_when_its_key_is_taken(shard: Shard) -> None:
    (a,) = await shard.start("a")
    await shard.primary()
    deadline = a.fence_deadline
    assert deadline is not None
    intruder = {"member": "z", "url": "http://z.test:7070", "epoch": a.epoch + 1}
    await shard.etcd.put(shard.keys.primary, json.dumps(intruder).encode())
    await until(lambda: a.role is Role.FOLLOWER, what="a steps down")
    change = shard.changes[-1][1] if shard.changes[-1][1].role is Role.FOLLOWER else None
    deposed = [c for _, c in shard.changes if c.reason is Reason.DEPOSED]
    assert len(deposed) == 1 and deposed[0].at_s < deadline  # from the watch, not by running out
    assert change is not None and a.stats.deposed == 1
    assert not a.may_acknowledge()
    await until(lambda: a.primary is not None and a.primary.member == "z", what="a follows z")


async def test_a_member_outside_a_non_empty_isr_never_wins(short_shard: Shard) -> None:
    shard = short_shard
    await shard.start("a", "b", "c")
    p = await shard.primary()
    isr = await p.read_isr()
    assert isr.members == (p.member,)
    others = sorted(n for n in shard.members if n != p.member)
    in_sync, outsider = shard.members[others[0]], shard.members[others[1]]
    await p.update_isr([p.member, in_sync.member], isr.revision)
    await in_sync.stop()
    mark, campaigns = len(shard.changes), outsider.stats.campaigns
    await p.stop()
    # The outsider is alone and there is no primary: it looks, declines, and keeps declining.
    seen = outsider.stats.declined_not_in_isr
    await until(lambda: outsider.stats.declined_not_in_isr >= seen + 2, what="the outsider declines")
    assert await shard.etcd_primary() is None
    assert not any(n == outsider.member and ch.role is not Role.FOLLOWER for n, ch in shard.changes[mark:])
    assert outsider.stats.campaigns == campaigns and outsider.role is Role.FOLLOWER
    # An in-sync member comes back: it wins, with the next epoch.
    del shard.members[in_sync.member]
    (back,) = await shard.start(in_sync.member)
    assert await shard.primary() is back
    assert back.epoch == p.epoch + 1 and outsider.role is Role.FOLLOWER
    shard.check_never_two_primaries()


async def test_isr_changes_are_compare_and_swap(shard: Shard) -> None:
    await shard.start("a", "b", "c")
    p = await shard.primary()
    follower = next(c for c in shard.members.values() if c is not p)
    first = await p.read_isr()
    grown = await p.update_isr([p.member, follower.member], first.revision)
    assert grown.members == tuple(sorted([p.member, follower.member])) and grown.epoch == p.epoch
    assert (await p.read_isr()) == grown
    with pytest.raises(StaleIsr, match=f"not {first.revision}"):  # a writer that read before the change
        await p.update_isr([p.member], first.revision)
    assert (await p.read_isr()) == grown
    with pytest.raises(ValueError, match="always in its own"):
        await p.update_isr([follower.member], grown.revision)
    with pytest.raises(NotPrimary):
        await follower.update_isr([follower.member], grown.revision)
    # A deposed primary's update loses even with the current revision.
    await shard.etcd.delete(shard.keys.primary)
    with pytest.raises(NotPrimary):
        await p.update_isr([p.member], grown.revision)
    assert (await p.read_isr()) == grown


async def test_etcd_restarted_under_a_running_shard(own_etcd: EtcdProcess) -> None:
    shard = Shard(own_etcd.endpoint, SHORT_TTL_MS)
    try:
        await shard.seed_isr("a", "b", "c")
        await shard.start("a", "b", "c")
        old = await shard.primary()
        old_epoch = old.epoch
        own_etcd.kill9()
        await until(lambda: not shard.acking(), what="the primary fences itself")
        assert old.stats.lost_primary == 1
        own_etcd.start()  # same ports, same data: the old lease is back and is revoked, not waited out
        new = await shard.primary()
        assert new.epoch > old_epoch
        held = await shard.etcd_primary()
        assert held == {"member": new.member, "url": new.url, "epoch": new.epoch}
        await until(lambda: all(c.primary and c.primary.member == new.member for c in shard.members.values()
                                if c is not new), what="everyone follows the new primary")
        shard.check_never_two_primaries()
    finally:
        await shard.close()


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


async def test_sigstop_longer_than_the_lease_then_sigcont(etcd: EtcdProcess, short_shard: Shard,
                                                          tmp_path: Path) -> None:
    shard = short_shard
    await shard.seed_isr("x", "b")
    out = tmp_path / "x.jsonl"
    cfg = asdict(member_config(etcd.endpoint, shard.prefix, "x", SHORT_TTL_MS))
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.coord_member", json.dumps(cfg), str(out)],
                            cwd=ROOT, stdin=subprocess.DEVNULL)
    try:
        await until(lambda: any(d.get("event") == "primary" for d in _lines(out)), what="x is primary")
        await until(lambda: any(d.get("check") is True for d in _lines(out)), what="x acknowledges")
        (b,) = await shard.start("b")
        await until(lambda: b.primary is not None and b.primary.member == "x", what="b follows x")
        x_epoch = b.primary.epoch if b.primary else 0
        os.kill(proc.pid, signal.SIGSTOP)
        frozen_at = fence_clock()
        await shard.primary()  # b, once x's lease ran out at etcd
        assert b.epoch == x_epoch + 1
        # Not before x's lease ran out at etcd: its last renewal went at most one renewal
        # interval before the freeze, and etcd keeps the lease a TTL after that.
        renew_every_s = b.fence_window_s(SHORT_TTL_MS // 1000) / RENEWALS_PER_WINDOW
        assert fence_clock() - frozen_at >= SHORT_TTL_MS / 1000 * (1 - CLOCK_RATE_DRIFT) - renew_every_s
        # Frozen longer than the lease in any case (b may have been elected a little sooner).
        await until(lambda: fence_clock() - frozen_at > SHORT_TTL_MS / 1000 + 0.05, what="a freeze past the lease")
        seen = len(_lines(out))
        os.kill(proc.pid, signal.SIGCONT)
        woke = await until(lambda: next((d for d in _lines(out)[seen:] if "check" in d), None),
                           what="x's first check after waking")
        assert woke["gap_s"] > SHORT_TTL_MS / 1000 and woke["check"] is False, woke
        await until(lambda: any(d.get("event") == "follower" and d.get("primary") == "b"
                                for d in _lines(out)[seen:]), what="x follows b")
        after = _lines(out)[seen:]
        assert any(d.get("reason") == "lost_primary" for d in after), after
        assert not any(d.get("check") is True for d in after), after
        assert (await shard.etcd_primary() or {}).get("member") == "b" and b.may_acknowledge()
        shard.check_never_two_primaries()
    finally:
        proc.kill()
        proc.wait(10)


async def test_changes_stream_the_role_changes(shard: Shard) -> None:
    c = shard.add("a")
    seen: list[Reason] = []

    async def consume() -> None:
        async with contextlib.aclosing(c.changes()) as changes:
            async for change in changes:
                seen.append(change.reason)
                if change.role is Role.PRIMARY:
                    return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)  # the iterator is listening from its first step on
    await c.start()
    await asyncio.wait_for(task, WAIT_S)
    assert seen == [Reason.STARTED, Reason.CAMPAIGN, Reason.ELECTED]
    assert [ch.reason for n, ch in shard.changes] == seen  # the same as the listener's


async def test_nobody_campaigns_while_the_isr_is_unreadable(short_shard: Shard) -> None:
    shard = short_shard
    await shard.etcd.put(shard.keys.isr, b"{not json")
    (a,) = await shard.start("a")
    await until(lambda: a.stats.etcd_errors >= 2, what="a fails to read the shard, twice")
    assert a.stats.campaigns == 0 and a.role is Role.FOLLOWER
    assert await shard.etcd_primary() is None
    await shard.etcd.delete(shard.keys.isr)  # an operator resets the set: a bootstrap again
    assert await shard.primary() is a
    assert (await a.read_isr()).members == ("a",)


async def test_a_member_that_resigns_hands_the_shard_over_and_holds_off(shard: Shard) -> None:
    # An elected member whose promotion failed gives its term up (Replication calls resign):
    # another one takes the shard without waiting for the lease to run out, and the one that
    # resigned does not campaign again before its hold-off has passed.
    await shard.seed_isr("a", "b")
    await shard.start("a", "b")
    p = await shard.primary()
    other = shard.members["b" if p.member == "a" else "a"]
    resigned_at = fence_clock()
    p.resign("promotion failed: a test", hold_off_s=3.0)
    assert not p.may_acknowledge() and p.role is Role.FOLLOWER and p.stats.resigned == 1
    assert await shard.primary(timeout_s=2.5) is other  # before the lease (2 s) plus the hold-off
    assert [c.detail for n, c in shard.changes if n == p.member and c.reason is Reason.RESIGNED] == \
        ["promotion failed: a test"]
    await other.stop()
    del shard.members[other.member]
    assert await shard.primary() is p
    elected = [c.at_s for n, c in shard.changes if n == p.member and c.reason is Reason.ELECTED]
    assert elected[-1] >= resigned_at + 3.0, "campaigned during its hold-off"
    shard.check_never_two_primaries()
