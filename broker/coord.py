"""Replication coordination for one member of one shard: election, fencing and the in-sync set,
kept in etcd (docs/replication.md is the design note; read it first).

Keys, under `{key_prefix}/shards/{shard}/`:

| key | value (JSON) | written by | how |
|---|---|---|---|
| `primary` | `{"member", "url", "epoch"}` | the election winner | election txn, attached to the winner's lease |
| `epoch` | a decimal number | the election winner | election txn: +1, never anything else |
| `isr` | `{"epoch", "members"}` | the primary (the bootstrap winner first) | compare-and-swap on its mod revision |
| `members/{name}` | `{"member", "url"}` | each member | put with the member's session lease |

Election (one txn): IF `primary` does not exist AND `isr`'s mod revision is the one read AND
`epoch`'s mod revision is the one read, THEN put `primary` (with a fresh lease) and `epoch` + 1 (and,
at bootstrap only, `isr` = {the winner}). A member campaigns only when `primary` is absent and it is
in the in-sync set, or the set is absent or empty (bootstrap).

Fencing: the primary may acknowledge only while the local clock is before
`sent + ttl * (1 - clock_drift) - fence_margin`, where `sent` is when the last successful renewal of
its lease (or the grant) was *sent*: etcd renewed the lease no earlier than that, so the lease lives
at least `ttl` etcd-seconds after it. Once that deadline passes the term is over for good
(`Reason.LOST_PRIMARY`): the member stops renewing, revokes the lease and is a follower.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from delayd.broker.config import ReplicationConfig
from delayd.broker.errors import CoordinationError, NotPrimary, StaleIsr
from delayd.broker.etcd import Compare, CompareTarget, EtcdClient, Get, KeyValue, Put, RangeResult

log = logging.getLogger("delayd.coord")

# How much faster etcd's clock may run than ours while a lease runs down. NTP keeps rates within
# 500 ppm; ten times that costs 15 ms of a 3 s lease.
CLOCK_RATE_DRIFT = 0.005
# Renewals per fence window: two may fail before the primary has to stop acknowledging.
RENEWALS_PER_WINDOW = 3
# A failed renewal, read or watch is retried this many times per fence window ...
RETRIES_PER_WINDOW = 10
# ... but not more often than this.
MIN_RETRY_S = 0.02
# How long stop() spends handing the lease back (then etcd expires it by itself).
STOP_TIMEOUT_S = 1.0
UNREADABLE = "<unreadable>"


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


# The fence clock must keep counting whenever etcd's does. CLOCK_MONOTONIC stops while the machine
# is suspended, CLOCK_BOOTTIME does not (a suspended primary must wake up fenced); both count on
# while this process is stopped (SIGSTOP) and neither follows wall-clock steps.
fence_clock: Callable[[], float] = _boottime if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


class Role(Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    PRIMARY = "primary"


class Reason(Enum):
    """Why a RoleChange happened."""
    STARTED = "started"
    CAMPAIGN = "campaign"  # the primary key is absent and this member may be promoted
    ELECTED = "elected"
    LOST_ELECTION = "lost_election"  # another member's txn went first, or the txn failed
    PRIMARY_CHANGED = "primary_changed"  # a follower saw another primary (or none)
    LOST_PRIMARY = "lost_primary"  # the fence deadline passed without a newer successful renewal
    DEPOSED = "deposed"  # the primary key is gone, taken, or names a higher epoch
    RESIGNED = "resigned"  # elected, it could not serve (its promotion failed) and gave the term up
    STOPPED = "stopped"


@dataclass(frozen=True)
class PrimaryInfo:
    member: str
    url: str
    epoch: int

    def to_json(self) -> bytes:
        return _dumps({"member": self.member, "url": self.url, "epoch": self.epoch})


@dataclass(frozen=True)
class Isr:
    """The in-sync set as etcd holds it. `revision` is the key's mod revision (0: never written),
    the operand of the next compare-and-swap."""
    epoch: int
    members: tuple[str, ...]
    revision: int = 0

    def to_json(self) -> bytes:
        return _dumps({"epoch": self.epoch, "members": list(self.members)})


@dataclass(frozen=True)
class RoleChange:
    role: Role
    epoch: int  # the member's own epoch when PRIMARY, else the highest epoch it has seen
    primary: PrimaryInfo | None  # who the member believes is primary
    reason: Reason
    detail: str
    at_s: float  # fence clock


@dataclass
class CoordStats:
    campaigns: int = 0
    elections_won: int = 0
    declined_not_in_isr: int = 0  # reads that found no primary while this member may not be promoted
    lost_primary: int = 0
    deposed: int = 0
    resigned: int = 0  # terms given up because the promotion failed
    etcd_errors: int = 0  # failed reads, watches and campaigns (each retried)


@dataclass(frozen=True)
class ShardKeys:
    prefix: bytes  # b"/delayd/shards/s0/"

    @classmethod
    def of(cls, key_prefix: str, shard: str) -> ShardKeys:
        return cls(f"{key_prefix}/shards/{shard}/".encode())

    @property
    def primary(self) -> bytes:
        return self.prefix + b"primary"

    @property
    def epoch(self) -> bytes:
        return self.prefix + b"epoch"

    @property
    def isr(self) -> bytes:
        return self.prefix + b"isr"

    @property
    def members(self) -> bytes:
        return self.prefix + b"members/"

    def member(self, name: str) -> bytes:
        return self.members + name.encode()


@dataclass(frozen=True)
class ShardState:
    """One consistent read of every key of the shard."""
    revision: int
    primary: PrimaryInfo | None
    primary_revision: int  # mod revision of the primary key (0 when absent)
    primary_lease: int
    epoch: int
    epoch_revision: int
    isr: Isr
    members: dict[str, str]  # name -> url, members whose session lease is alive

    @classmethod
    def parse(cls, keys: ShardKeys, result: RangeResult) -> ShardState:
        primary, primary_rev, primary_lease = None, 0, 0
        epoch, epoch_rev = 0, 0
        isr = Isr(0, ())
        members: dict[str, str] = {}
        for kv in result.kvs:
            if kv.key == keys.primary:
                primary_rev, primary_lease = kv.mod_revision, kv.lease
                try:
                    d = json.loads(kv.value)
                    primary = PrimaryInfo(str(d["member"]), str(d["url"]), int(d["epoch"]))
                except (ValueError, KeyError, TypeError):
                    # Held, but not by anyone we can name: nobody campaigns, a primary steps down.
                    primary = PrimaryInfo(UNREADABLE, "", 0)
            elif kv.key == keys.epoch:
                epoch_rev = kv.mod_revision
                try:
                    epoch = int(kv.value)
                except ValueError as e:
                    raise CoordinationError(f"{keys.epoch.decode()} is not a number: {kv.value[:80]!r}") from e
            elif kv.key == keys.isr:
                isr = _parse_isr(kv)
            elif kv.key.startswith(keys.members):
                name = kv.key[len(keys.members):].decode(errors="replace")
                try:
                    members[name] = str(json.loads(kv.value)["url"])
                except (ValueError, KeyError, TypeError):
                    members[name] = ""
        return cls(result.revision, primary, primary_rev, primary_lease, epoch, epoch_rev, isr, members)


@dataclass
class _Term:
    """This member's time as primary: one lease, one epoch."""
    lease_id: int
    ttl_s: int
    epoch: int
    key_revision: int  # mod revision of the primary key the election wrote
    renewed_s: float  # send time of the last successful grant or renewal (fence clock)
    deadline_s: float  # may acknowledge while the fence clock is before this


@dataclass
class _Session:
    lease_id: int = 0
    registered: bool = False


class Coordinator:
    """Election, fencing and the in-sync set for one member of one shard.

    `start()` runs it in the background; `may_acknowledge()` is the fence the data path checks
    before every acknowledgement; `changes()` / `add_listener()` report role and primary changes.
    """

    def __init__(self, cfg: ReplicationConfig, *, client: EtcdClient | None = None,
                 clock: Callable[[], float] = fence_clock, clock_drift: float = CLOCK_RATE_DRIFT) -> None:
        self.cfg = cfg
        self.keys = ShardKeys.of(cfg.key_prefix, cfg.shard)
        self.member = cfg.member
        self.url = cfg.advertise_url
        self._client = client or EtcdClient(cfg.etcd_endpoints, timeout_s=cfg.etcd_timeout_ms / 1000)
        self._owns_client = client is None
        self._clock = clock
        self._drift = clock_drift
        self._ttl_s = cfg.lease_ttl_ms // 1000
        window = self.fence_window_s(self._ttl_s)
        self._renew_every_s = window / RENEWALS_PER_WINDOW
        self._retry_s = max(MIN_RETRY_S, window / RETRIES_PER_WINDOW)
        self.role = Role.FOLLOWER
        self.primary: PrimaryInfo | None = None
        self.registered: frozenset[str] | None = None  # members/ as last read (None: not read yet)
        self.stats = CoordStats()
        self._seen_epoch = 0
        self._term: _Term | None = None
        self._session = _Session()
        self._revoking: set[int] = set()
        self._candidate_lease = 0  # granted for a campaign whose txn has not answered yet
        self._listeners: list[Callable[[RoleChange], None]] = []
        self._wake = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._etcd_ok = True
        self._stopping = False
        self._campaign_after = 0.0  # fence-clock time before which this member does not campaign

    # -- the fence ----------------------------------------------------------------------------

    def fence_window_s(self, ttl_s: int) -> float:
        """How long after sending a successful renewal the primary may acknowledge."""
        return ttl_s * (1 - self._drift) - self.cfg.fence_margin_ms / 1000

    @property
    def fence_deadline(self) -> float | None:
        """Fence-clock time at which acknowledging stops, unless a renewal sent before it succeeds."""
        return self._term.deadline_s if self._term else None

    @property
    def epoch(self) -> int:
        """This member's epoch while primary; else the highest epoch it has seen."""
        return self._term.epoch if self._term else self._seen_epoch

    @property
    def lease_id(self) -> int | None:
        """The etcd lease that holds the primary key while this member is primary."""
        return self._term.lease_id if self._term else None

    def may_acknowledge(self) -> bool:
        """True only while this member holds the primary key and the fence deadline has not passed.
        Pure arithmetic on the local clock, no I/O: after a pause of any length the first call
        says no (and ends the term)."""
        term = self._term
        if term is None:
            return False
        if self._clock() < term.deadline_s:
            return True
        silent_s = self._clock() - term.renewed_s
        self._end_term(term, Reason.LOST_PRIMARY,
                       f"no lease renewal succeeded for {silent_s:.3f}s (lease {term.ttl_s}s): stopped acknowledging")
        return False

    # -- events -----------------------------------------------------------------------------

    def add_listener(self, callback: Callable[[RoleChange], None]) -> None:
        """Call `callback` (in the event loop, synchronously) on every role or primary change."""
        self._listeners.append(callback)

    async def changes(self) -> AsyncIterator[RoleChange]:
        """Every role or primary change from the iterator's first step on, as an async iterator
        (use contextlib.aclosing to stop listening when done)."""
        queue: asyncio.Queue[RoleChange] = asyncio.Queue()
        self._listeners.append(queue.put_nowait)
        try:
            while True:
                yield await queue.get()
        finally:
            self._listeners.remove(queue.put_nowait)

    def _emit(self, reason: Reason, detail: str) -> None:
        change = RoleChange(self.role, self.epoch, self.primary, reason, detail, self._clock())
        log.info("shard %s member %s: %s epoch %d primary %s (%s: %s)", self.cfg.shard, self.member,
                 self.role.value, change.epoch, self.primary.member if self.primary else "-", reason.value, detail)
        for callback in list(self._listeners):
            try:
                callback(change)
            except Exception:  # one broken listener must not stop coordination
                log.exception("replication listener %r failed", callback)

    def _set_role(self, role: Role, reason: Reason, detail: str) -> None:
        self.role = role
        self._emit(reason, detail)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._tasks:
            return
        self._stopping = False
        self._emit(Reason.STARTED, f"advertising {self.url}")
        self._spawn("run", self._run())
        self._spawn("session", self._keep_session())

    async def stop(self) -> None:
        """Step down (handing the lease back, so another member is elected at once), leave the
        registry and close. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        if self._term is not None:
            self._end_term(self._term, Reason.STOPPED, "stopping")
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.role is not Role.FOLLOWER:  # stopped in the middle of a campaign
            self._set_role(Role.FOLLOWER, Reason.STOPPED, "stopping")
        # A campaign cut short may have won with a lease it never learnt it holds: hand it back too.
        leases = set(self._revoking) | {self._session.lease_id, self._candidate_lease} - {0}
        self._revoking.clear()
        for lease in leases:
            try:
                await self._client.lease_revoke(lease, timeout_s=STOP_TIMEOUT_S)
            except CoordinationError as e:  # etcd expires it by itself
                log.info("shard %s member %s: lease %x not handed back: %s", self.cfg.shard, self.member, lease, e)
        self._session = _Session()
        if self._owns_client:
            await self._client.close()

    def _spawn(self, name: str, coro: Any) -> None:
        self._tasks[name] = asyncio.create_task(coro, name=f"coord-{self.cfg.shard}-{self.member}-{name}")

    # -- the main loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                state = await self._read()
                self._etcd_back()
                self._observe(state)
                if self._term is None and state.primary is None:
                    if (wait_s := self._campaign_after - self._clock()) > 0:
                        await self._pause(wait_s)  # resigned: another member may take the shard first
                        continue
                    if self._eligible(state.isr):
                        await self._campaign(state)
                        continue
                    self.stats.declined_not_in_isr += 1
                await self._wait_for_change(state.revision)
            except CoordinationError as e:
                self._etcd_failed(e)
                await self._pause(self._retry_s)

    async def _read(self) -> ShardState:
        return ShardState.parse(self.keys, await self._client.get(self.keys.prefix, prefix=True))

    def _eligible(self, isr: Isr) -> bool:
        """A member may be promoted if it is in the in-sync set. An absent or empty set is the
        bootstrap: anyone may win, and the winner's txn makes the set {winner}."""
        return not isr.members or self.member in isr.members

    def _observe(self, state: ShardState) -> None:
        self._seen_epoch = max(self._seen_epoch, state.epoch)
        self.registered = frozenset(state.members)  # the live members, as of this read
        term = self._term
        p = state.primary
        if term is not None and state.revision >= term.key_revision and (
                p is None or p.member != self.member or p.epoch != term.epoch
                or state.primary_lease != term.lease_id):
            self._end_term(term, Reason.DEPOSED, "the primary key is gone" if p is None else
                           f"the primary key names {p.member} epoch {p.epoch}")
        if self._term is None and p != self.primary:
            self.primary = p
            self._emit(Reason.PRIMARY_CHANGED, f"{p.member} at {p.url}, epoch {p.epoch}" if p else "no primary")

    async def _campaign(self, state: ShardState) -> None:
        self.stats.campaigns += 1
        bootstrap = not state.isr.members
        self._set_role(Role.CANDIDATE, Reason.CAMPAIGN, "bootstrap: the in-sync set is empty" if bootstrap
                       else f"no primary; in the in-sync set {list(state.isr.members)}")
        epoch = state.epoch + 1
        sent = self._clock()  # the lease runs from the grant: it cannot expire before sent + ttl
        try:
            lease = await self._client.lease_grant(self._ttl_s)
        except CoordinationError as e:
            self._set_role(Role.FOLLOWER, Reason.LOST_ELECTION, f"lease grant failed: {e}")
            raise
        if lease.ttl_s != self._ttl_s:
            log.warning("shard %s member %s: etcd granted a %ds lease for the %ds asked: its minimum is "
                        "1.5 election timeouts (docs/replication.md)", self.cfg.shard, self.member,
                        lease.ttl_s, self._ttl_s)
        k = self.keys
        me = PrimaryInfo(self.member, self.url, epoch)
        compare = [Compare(k.primary, CompareTarget.CREATE, 0),
                   Compare(k.isr, CompareTarget.MOD, state.isr.revision),
                   Compare(k.epoch, CompareTarget.MOD, state.epoch_revision)]
        success = [Put(k.primary, me.to_json(), lease.id), Put(k.epoch, str(epoch).encode())]
        if bootstrap:
            success.append(Put(k.isr, Isr(epoch, (self.member,)).to_json()))
        self._candidate_lease = lease.id
        try:
            result = await self._client.txn(compare, success)
        except CoordinationError as e:
            # Maybe it won, maybe not: revoking the lease deletes the key if it did. Nothing was
            # acknowledged in that term; the epoch it may have used is simply skipped.
            self._candidate_lease = 0
            self._revoke_later(lease.id)
            self._set_role(Role.FOLLOWER, Reason.LOST_ELECTION, f"election txn failed: {e}")
            raise
        self._candidate_lease = 0  # (left set when cancelled: stop() revokes it)
        if not result.succeeded:
            self._revoke_later(lease.id)
            self._set_role(Role.FOLLOWER, Reason.LOST_ELECTION, "another member changed the shard first")
            return
        window = self.fence_window_s(lease.ttl_s)
        term = _Term(lease.id, lease.ttl_s, epoch, result.revision, sent, sent + window)
        self._term = term
        self._seen_epoch = max(self._seen_epoch, epoch)
        self.stats.elections_won += 1
        self.primary = me
        self._set_role(Role.PRIMARY, Reason.ELECTED, f"epoch {epoch}, lease {lease.id:x} ({lease.ttl_s}s)")
        if self.may_acknowledge():  # the election itself may have taken longer than the window
            self._spawn("hold", self._hold(term))

    async def _wait_for_change(self, revision: int) -> None:
        """Until something under the shard's prefix changes after `revision`, the member is woken
        (a step-down), or a lease's time has passed (then re-read anyway)."""
        watch = asyncio.ensure_future(self._client.watch_once(self.keys.prefix, revision + 1, prefix=True,
                                                              timeout_s=float(self._ttl_s)))
        wake = asyncio.ensure_future(self._wake.wait())
        try:
            done, _ = await asyncio.wait({watch, wake}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (watch, wake):
                t.cancel()
            await asyncio.gather(watch, wake, return_exceptions=True)
        self._wake.clear()
        if watch in done and not watch.cancelled():
            watch.result()  # raises what broke the watch

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        self._wake.clear()

    def _etcd_failed(self, e: CoordinationError) -> None:
        self.stats.etcd_errors += 1
        if self._etcd_ok:
            log.warning("shard %s member %s: etcd: %s (retrying every %.2fs)", self.cfg.shard, self.member,
                        e, self._retry_s)
        self._etcd_ok = False

    def _etcd_back(self) -> None:
        if not self._etcd_ok:
            log.info("shard %s member %s: etcd answers again", self.cfg.shard, self.member)
        self._etcd_ok = True

    # -- holding the primary lease ------------------------------------------------------------

    async def _hold(self, term: _Term) -> None:
        """Renew the primary lease every third of the fence window; retry failures quickly. The
        term ends when etcd no longer has the lease or the deadline passes first."""
        next_at = term.renewed_s + self._renew_every_s
        while self.may_acknowledge() and self._term is term:
            await asyncio.sleep(max(0.0, min(next_at, term.deadline_s) - self._clock()))
            if not self.may_acknowledge():
                return
            sent = self._clock()
            try:
                ttl = await self._client.lease_keepalive(term.lease_id, timeout_s=term.deadline_s - sent)
            except CoordinationError as e:
                log.warning("shard %s member %s: primary lease renewal failed (%.3fs of the fence left): %s",
                            self.cfg.shard, self.member, term.deadline_s - self._clock(), e)
                next_at = self._clock() + self._retry_s
                continue
            # The deadline passing while the renewal was on its way ends the term all the same.
            if self._term is not term or not self.may_acknowledge():
                return
            if ttl <= 0:
                self._end_term(term, Reason.DEPOSED, "etcd no longer has the primary lease")
                return
            term.renewed_s = sent
            term.deadline_s = max(term.deadline_s, sent + self.fence_window_s(ttl))
            next_at = sent + self._renew_every_s

    def resign(self, detail: str, hold_off_s: float) -> None:
        """Give the current term up (stop acknowledging, hand the lease back) and do not campaign
        for `hold_off_s`: a member elected that cannot serve (its promotion failed) would otherwise
        keep renewing a lease it does nothing with, and the shard would have no primary for good."""
        self._campaign_after = self._clock() + hold_off_s
        if self._term is not None:
            self.stats.resigned += 1
            self._end_term(self._term, Reason.RESIGNED, detail)

    def _end_term(self, term: _Term, reason: Reason, detail: str) -> None:
        """Stop acknowledging now; the lease is never renewed again and is handed back."""
        if self._term is not term:
            return
        self._term = None
        if reason is Reason.LOST_PRIMARY:
            self.stats.lost_primary += 1
        elif reason is Reason.DEPOSED:
            self.stats.deposed += 1
        hold = self._tasks.pop("hold", None)
        if hold is not None and hold is not asyncio.current_task():
            hold.cancel()
        self.primary = None
        self._set_role(Role.FOLLOWER, reason, detail)
        self._revoke_later(term.lease_id)
        self._wake.set()

    def _revoke_later(self, lease_id: int) -> None:
        """Revoke in the background until etcd has done it (or never had it): the primary key goes
        with the lease, so the next election need not wait for the lease to expire."""
        self._revoking.add(lease_id)
        if not self._stopping and "revoke" not in self._tasks:
            self._spawn("revoke", self._revoke_pending())

    async def _revoke_pending(self) -> None:
        try:
            while self._revoking:
                for lease_id in list(self._revoking):
                    try:
                        await self._client.lease_revoke(lease_id)
                        self._revoking.discard(lease_id)
                    except CoordinationError as e:
                        log.debug("revoking lease %x: %s", lease_id, e)
                        await asyncio.sleep(self._retry_s)
        finally:
            if self._tasks.get("revoke") is asyncio.current_task():
                del self._tasks["revoke"]

    # -- the member registry ------------------------------------------------------------------

    async def _keep_session(self) -> None:
        """Keep `members/{name}` alive on a lease of its own, re-registering after it lapsed."""
        while True:
            s = self._session
            try:
                if not s.lease_id:
                    s.lease_id = (await self._client.lease_grant(self._ttl_s)).id
                    s.registered = False
                if not s.registered:
                    value = _dumps({"member": self.member, "url": self.url})
                    await self._client.put(self.keys.member(self.member), value, lease=s.lease_id)
                    s.registered = True
                    await asyncio.sleep(self._renew_every_s)
                    continue
                if await self._client.lease_keepalive(s.lease_id) <= 0:
                    s.lease_id, s.registered = 0, False
                    continue
                await asyncio.sleep(self._renew_every_s)
            except CoordinationError as e:
                log.debug("member registry: %s", e)
                await asyncio.sleep(self._retry_s)

    # -- the in-sync set ----------------------------------------------------------------------

    async def read_isr(self) -> Isr:
        kv = (await self._client.get(self.keys.isr)).get(self.keys.isr)
        return Isr(0, ()) if kv is None else _parse_isr(kv)

    async def update_isr(self, members: Iterable[str], expected_revision: int) -> Isr:
        """Replace the in-sync set if its mod revision is still `expected_revision` and this member
        still holds the primary key of its term. Raises StaleIsr when the set changed first, and
        NotPrimary when this member is not (any more) the primary."""
        term = self._term
        if term is None or not self.may_acknowledge():
            raise NotPrimary(f"{self.member} is not the primary of shard {self.cfg.shard}")
        new = tuple(sorted(set(members)))
        if self.member not in new:
            raise ValueError("the primary is always in its own in-sync set")
        k = self.keys
        result = await self._client.txn(
            [Compare(k.isr, CompareTarget.MOD, expected_revision),
             Compare(k.primary, CompareTarget.MOD, term.key_revision)],
            [Put(k.isr, Isr(term.epoch, new).to_json())],
            [Get(k.isr), Get(k.primary)])
        if result.succeeded:
            return Isr(term.epoch, new, result.revision)
        found = {kv.key: kv for kv in result.ranges()}
        held = found.get(k.primary)
        if held is None or held.mod_revision != term.key_revision:
            self._end_term(term, Reason.DEPOSED, "the primary key changed under an in-sync set update")
            raise NotPrimary(f"{self.member} lost the primary key of shard {self.cfg.shard}")
        current = found.get(k.isr)
        raise StaleIsr(f"the in-sync set of shard {self.cfg.shard} is at revision "
                       f"{current.mod_revision if current else 0}, not {expected_revision}: "
                       f"{current.value.decode(errors='replace') if current else 'absent'}")

    # -- describe ----------------------------------------------------------------------------

    async def describe(self) -> dict[str, Any]:
        """The shard as etcd has it (what GET /v1/cluster will serve), plus this member's view."""
        state = await self._read()
        names = sorted(set(state.members) | set(state.isr.members)
                       | ({state.primary.member} if state.primary else set()))
        members = []
        for name in names:
            is_primary = state.primary is not None and state.primary.member == name
            url = state.primary.url if is_primary and state.primary else state.members.get(name, "")
            members.append({"member": name, "url": url, "role": "primary" if is_primary else "follower",
                            "in_sync": name in state.isr.members, "registered": name in state.members})
        deadline = self.fence_deadline
        return {
            "shard": self.cfg.shard,
            "epoch": state.epoch,
            "primary": ({"member": state.primary.member, "url": state.primary.url, "epoch": state.primary.epoch}
                        if state.primary else None),
            "isr": {"epoch": state.isr.epoch, "members": list(state.isr.members), "revision": state.isr.revision},
            "members": members,
            "self": {"member": self.member, "role": self.role.value, "epoch": self.epoch,
                     "may_acknowledge": self.may_acknowledge(),
                     "fence_left_ms": None if deadline is None else max(0, int((deadline - self._clock()) * 1000))},
        }


def _parse_isr(kv: KeyValue) -> Isr:
    try:
        d = json.loads(kv.value)
        return Isr(int(d["epoch"]), tuple(str(m) for m in d["members"]), kv.mod_revision)
    except (ValueError, KeyError, TypeError) as e:
        # Nobody can tell who is in sync: nobody may be promoted until it is fixed.
        raise CoordinationError(f"{kv.key.decode(errors='replace')} is unreadable: {kv.value[:80]!r}") from e


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()

