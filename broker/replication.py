"""The replication data path (docs/replication.md): the primary streams its commit log to the
followers, counts their acknowledgements, keeps the in-sync set honest, and answers a write only
once every in-sync member has it; a follower appends what it receives at the same offsets,
fsyncs, acknowledges, and runs the enqueue side of its pipeline.

    primary                                         follower
    produce ─▶ commit log ─▶ fsync ─┐               ws /internal/replication/stream?from=&epoch=&member=&last_epoch=
                                    │   ◀── open ── (from: its log end; last_epoch: its epoch file's last)
    stream: read_raw(pos) ──────────┼── frame ──▶   append_raw + message table/keys/groups ─▶ fsync
                                    │   ◀── ack ──  (its fsynced end)
    answer ◀─ every ISR member acked ≥ the write's end, and may_acknowledge()

Frames (websocket): binary `epoch(8) offset(8)` + whole atomic batches of log bytes; the follower
answers binary `end(8)`, its fsynced log end. Text frames are JSON: `hello` (the primary's epoch
and epoch file), `truncate` (the follower's log goes past where its last epoch ends in the
primary's history: cut back to `to` and reconnect), `ping` (idle; the primary's log end),
`progress` (the primary's durable dequeue cursor `read_time` moved: every slot before it was
dispatched, and what that wrote — RELEASE and ROLL records — lies below `end`; the follower's
cursor follows it once it has indexed up to `end`, or after PROGRESS_WAIT_S: pipeline.Carry).

Coordination (election, fencing, the ISR in etcd) is broker.coord's; this module reacts to its
RoleChange events: `elected` → write the epoch boundary and serve; anything else while serving →
stop acknowledging at once and follow the new primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from delayd.broker import errors
from delayd.broker.coord import Coordinator, Isr, Reason, Role, RoleChange
from delayd.broker.groups import decode_event
from delayd.storage.epochs import EpochFile
from delayd.storage.segments import fsync_all

if TYPE_CHECKING:
    from delayd.broker.service import Broker

log = logging.getLogger("delayd.replication")

STREAM_PATH = "/internal/replication/stream"
FRAME = struct.Struct("<Qq")  # epoch, offset: the head of a binary frame
ACK = struct.Struct("<q")  # the follower's fsynced log end
FRAME_BYTES = 1 << 20  # log bytes per frame (about: a batch is never split)
PING_S = 0.2  # an idle stream says the primary's end this often
TICK_S = 0.05  # the in-sync set is checked this often
GONE_HOLDING_S = 0.2  # a follower with no stream (or registration) holding a write up this long leaves
PROMOTION_GRACE_S = 0.5  # ... but not before the followers had this long to find a new primary
PROGRESS_HELD = 16  # a follower keeps this many of the primary's cursor moves waiting for its indexing
PROGRESS_WAIT_S = 5.0  # ... and each at most this long
IDLE_S = 1.0  # a follower that hears nothing (not even a ping) this long reconnects
RETRY_S = 0.2  # a follower reconnects after this
RETRY_AFTER_S = 1


@dataclass
class Follower:
    """What the primary knows of one follower."""
    member: str
    acked: int = 0  # its fsynced log end
    streams: int = 0  # open streams (0: gone)
    last_ack_s: float = 0.0


class Replication:
    def __init__(self, broker: Broker, coordinator: Coordinator) -> None:
        self.broker = broker
        self.coord = coordinator
        self.cfg = broker.cfg
        self.member = coordinator.member
        self.min_insync = self.cfg.replication_min_insync
        self.max_lag_s = self.cfg.replication_max_lag_ms / 1000
        self.serving = False  # primary, epoch boundary written, pipeline releasing
        self.epoch = 0  # the epoch this member serves (primary) or the highest seen in frames (follower)
        self.isr = Isr(0, ())
        self.followers: dict[str, Follower] = {}
        self.epochs: EpochFile | None = None
        self.primary_url: str | None = None
        self.primary_end = 0  # follower: the primary's log end as last heard
        self._progress: deque[tuple[float, int, int]] = deque()  # follower: (heard at, log end, primary's read time)
        self._carry_to = 0  # follower: the primary's read time, once indexed up to where it was said
        self.elections = 0
        self._changed = asyncio.Event()  # acks, ISR changes, role changes: waiters look again
        self._grew = asyncio.Event()  # the log grew: streams send
        self._isr_busy = False
        self._promoted_s = 0.0
        self._ends: deque[tuple[float, int]] = deque()  # (when, log end): how old a follower's lag is
        self._changes: asyncio.Queue[RoleChange] = asyncio.Queue()
        self._primary_known = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._streams: set[web.WebSocketResponse] = set()
        self._session: aiohttp.ClientSession | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._restarting = False  # the follow task is cutting and reopening the store: leave it be
        self._stopping = False

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """After recovery: follow (the pipeline runs the enqueue side) until elected."""
        store = self.broker.store
        assert store is not None
        self.epochs = EpochFile(store.data.layout.epochs)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=2))
        self.coord.add_listener(self._on_change)
        self._tasks = [asyncio.create_task(self._roles(), name="replication roles"),
                       asyncio.create_task(self._watch_isr(), name="replication isr")]
        self._follow_task = asyncio.create_task(self._follow(), name="replication follow")
        await self.coord.start()

    async def stop(self) -> None:
        """Step down (the lease is revoked: another member is elected at once) and end every stream.
        Called when shutdown begins, before aiohttp waits for open handlers (a stream's handler
        runs until its websocket closes), and again, doing nothing, when the pipeline stops."""
        if self._stopping:
            return
        self._stopping = True  # the role changes stop() itself causes need no pipeline switch
        self.serving = False
        self._changed.set()
        await self.coord.stop()
        for t in [*self._tasks, self._follow_task]:
            if t is not None:
                t.cancel()
        await asyncio.gather(*self._tasks, *([self._follow_task] if self._follow_task else []),
                             return_exceptions=True)
        for ws in list(self._streams):
            await ws.close()
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------------------ roles
    def _on_change(self, change: RoleChange) -> None:
        # Synchronously, in the coordinator's callback: a primary that lost its term stops
        # acknowledging before anything else runs (may_acknowledge() says no as well).
        if change.role is not Role.PRIMARY and self.serving:
            self.serving = False
            self._changed.set()
        url = change.primary.url if change.primary is not None and change.primary.member != self.member else None
        if url != self.primary_url:
            self.primary_url = url
            if url is not None:
                self._primary_known.set()
            # Following another (or no) primary: drop the stream now, not when the old one speaks.
            if self._follow_task is not None and not self._follow_task.done() and not self._restarting:
                self._follow_task.cancel()
                self._follow_task = asyncio.create_task(self._follow(), name="replication follow")
        self._changes.put_nowait(change)

    async def _roles(self) -> None:
        while True:
            change = await self._changes.get()
            if self._stopping:
                continue
            try:
                if change.reason is Reason.ELECTED and change.role is Role.PRIMARY:
                    await self._become_primary(change.epoch)
                elif change.role is not Role.PRIMARY and self.broker.pipeline is not None \
                        and not self.broker.pipeline.follower:
                    await self._become_follower(change)
            except Exception as e:
                log.exception("replication: role change %s failed", change.reason.value)
                if change.reason is Reason.ELECTED and not self.serving:
                    # Elected but not serving: hand the term back, or the shard has no primary
                    # for as long as this member keeps renewing its lease.
                    self.coord.resign(f"promotion failed: {type(e).__name__}: {e}", self.cfg.replication_lease_ttl_ms / 1000)

    async def _become_primary(self, epoch: int) -> None:
        if not self.coord.may_acknowledge() or self.coord.epoch != epoch:
            return  # the term already ended
        if self._follow_task is not None:
            self._follow_task.cancel()
            await asyncio.gather(self._follow_task, return_exceptions=True)
            self._follow_task = None
        await self._wait_ready()
        store = self.broker.store
        assert store is not None and self.epochs is not None
        self.isr = await self.coord.read_isr()
        # Everything up to here is this term's truth; followers cut what they have beyond it.
        self.epochs.begin(epoch, store.commit.end)
        self.epoch = epoch
        self.followers = {m: Follower(m) for m in self.isr.members if m != self.member}
        self._ends.clear()
        self._promoted_s = time.monotonic()
        self.elections += 1
        await self.broker.switch_role(follower=False)
        self.serving = self.coord.may_acknowledge() and self.coord.epoch == epoch
        log.info("replication: primary of shard %s at epoch %d from offset %d, in-sync %s", self.cfg.node_id,
                 epoch, store.commit.end, list(self.isr.members))
        self._changed.set()

    async def _become_follower(self, change: RoleChange) -> None:
        self.serving = False
        self._changed.set()
        for ws in list(self._streams):
            await ws.close()
        await self.broker.switch_role(follower=True)
        if self._follow_task is None or self._follow_task.done():
            self._follow_task = asyncio.create_task(self._follow(), name="replication follow")
        log.info("replication: now a follower (%s: %s)", change.reason.value, change.detail)

    async def _wait_ready(self) -> None:
        while not self.broker.ready:
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------------------------ the gate
    def check_writable(self, write: bool) -> None:
        """Before a request that needs the primary: 421 with the primary's URL on a follower (503
        while none is known); for a write, 503 insufficient_replicas before anything is stored
        when the in-sync set is below replication_min_insync."""
        if self.serving and not self.coord.may_acknowledge():
            self.serving = False  # the fence passed (a pause, etcd out of reach): not one more write
        if not self.serving:
            if self.primary_url is not None:
                raise errors.NotPrimaryError(f"member {self.member} is a follower of shard {self.cfg.node_id}",
                                             self.primary_url)
            raise errors.NoPrimary(f"shard {self.cfg.node_id} has no primary right now",
                                   retry_after_s=RETRY_AFTER_S)
        if write and len(self.isr.members) < self.min_insync:
            raise errors.InsufficientReplicas(
                f"{len(self.isr.members)} in-sync copies ({', '.join(self.isr.members)}), "
                f"replication_min_insync is {self.min_insync}", retry_after_s=RETRY_AFTER_S)

    def durable_end(self) -> int:
        store, committer = self.broker.store, self.broker.committer
        assert store is not None
        if committer is not None and committer.policy == "always":
            return committer.durable_end
        return store.commit.end

    def watermark(self) -> int:
        """What every in-sync member has fsynced: the primary indexes (and releases) up to here."""
        end = self.durable_end()
        for m in self.isr.members:
            if m != self.member:
                f = self.followers.get(m)
                end = min(end, f.acked if f is not None else 0)
        store = self.broker.store
        return max(end, store.indexed if store is not None else 0)

    async def replicated(self, offset: int) -> None:
        """Wait until every in-sync member has fsynced the log up to `offset`, then check the fence."""
        self._grew.set()
        while True:
            if not self.serving:
                raise errors.NotPrimaryError("this member stopped being the primary before the write was "
                                             "acknowledged; it may or may not be stored", self.primary_url)
            if len(self.isr.members) < self.min_insync:
                raise errors.UnderReplicated(
                    f"the in-sync set shrank to {len(self.isr.members)} while the write waited "
                    f"(replication_min_insync {self.min_insync})", retry_after_s=RETRY_AFTER_S)
            if not self._isr_busy and all(self._acked(m) >= offset for m in self.isr.members if m != self.member):
                if self.coord.may_acknowledge():
                    return
                self.serving = False
                continue
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._changed.wait()

    def _acked(self, member: str) -> int:
        f = self.followers.get(member)
        return f.acked if f is not None else 0

    def lag_s(self, acked: int, now: float) -> float:
        """How long ago the log first went past `acked` (0: not behind)."""
        for t, end in self._ends:
            if end > acked:
                return now - t
        store = self.broker.store
        return 0.0 if store is None or acked >= store.commit.end else TICK_S

    async def _watch_isr(self) -> None:
        """Primary: drop a lagging (or gone) follower from the in-sync set before any write is
        acknowledged without it; add a caught-up one back."""
        while True:
            await asyncio.sleep(TICK_S)
            if not self.serving or self.broker.store is None:
                continue
            now = time.monotonic()
            end = self.broker.store.commit.end
            if not self._ends or self._ends[-1][1] < end:
                self._ends.append((now, end))
            low = min([f.acked for f in self.followers.values()] + [end])
            while len(self._ends) > 1 and self._ends[0][1] <= low:
                self._ends.popleft()
            members = set(self.isr.members)
            drop = set()
            for m in members - {self.member}:
                f = self.followers.setdefault(m, Follower(m))
                lag = self.lag_s(f.acked, now)
                # Gone: no stream, or its registration lapsed (frozen, cut off: its stream may
                # look open for a long time), and it holds a write up.
                lapsed = self.coord.registered is not None and m not in self.coord.registered
                gone = (f.streams == 0 or lapsed) and lag > GONE_HOLDING_S \
                    and now - self._promoted_s > PROMOTION_GRACE_S
                if lag > self.max_lag_s or gone:
                    drop.add(m)
            hw = min([self._acked(m) for m in members - {self.member}] + [self.durable_end()])
            add = {m for m, f in self.followers.items() if m not in members and f.streams and f.acked >= hw}
            if drop or add:
                await self._update_isr(drop, add)

    def _watermark_moved(self) -> None:
        """An ack or a change of the in-sync set: the writes waiting for it look again, and so
        does the primary's enqueue-get, which indexes up to `watermark`."""
        self._changed.set()
        if self.broker.pipeline is not None:
            self.broker.pipeline.appended.set()

    async def _update_isr(self, drop: set[str], add: set[str]) -> None:
        self._isr_busy = True  # no write is acknowledged while the set changes
        try:
            members = set(self.isr.members)
            if add:  # again, with no acknowledgement in between: it has all that was acknowledged
                hw = min([self._acked(m) for m in members - {self.member}] + [self.durable_end()])
                add = {m for m in add if self._acked(m) >= hw}
            new = (members - drop) | add | {self.member}
            if new == members:
                return
            try:
                self.isr = await self.coord.update_isr(new, self.isr.revision)
                log.warning("replication: in-sync set now %s (left: %s, back: %s)", list(self.isr.members),
                            sorted(drop) or "-", sorted(add) or "-")
            except errors.StaleIsr:
                self.isr = await self.coord.read_isr()
            except errors.NotPrimary:
                self.serving = False
            except errors.CoordinationError as e:
                log.warning("replication: in-sync set update failed: %s", e)
        finally:
            self._isr_busy = False
            self._watermark_moved()  # (it follows the in-sync set)

    # ------------------------------------------------------------------------------ primary: stream
    def log_grew(self) -> None:
        self._grew.set()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """GET /internal/replication/stream: one follower's stream (see the module docstring)."""
        q = request.query
        try:
            member, start = q["member"], int(q["from"])
            seen, last_epoch = int(q.get("epoch", "0")), int(q.get("last_epoch", "0"))
        except (KeyError, ValueError) as e:
            raise errors.BadRequest(f"stream: {e}") from e
        if not self.serving:
            self.check_writable(False)
        if seen > self.epoch:
            raise errors.NotPrimaryError(f"the follower has seen epoch {seen}, this primary serves {self.epoch}",
                                         None)
        store = self.broker.store
        assert store is not None and self.epochs is not None
        ws = web.WebSocketResponse(max_msg_size=0, heartbeat=None)
        await ws.prepare(request)
        epoch = self.epoch
        upto = self.epochs.end_of(last_epoch, store.commit.end)
        if start > upto or start < store.commit.start:
            await ws.send_str(json.dumps({"type": "truncate", "to": min(upto, start), "epoch": epoch,
                                          "start": store.commit.start}))
            await ws.close()
            return ws
        log.info("replication: %s streams from offset %d (epoch %d, its last epoch %d)", member, start, self.epoch,
                 last_epoch)
        f = self.followers.setdefault(member, Follower(member))
        f.acked = max(f.acked, start) if f.streams else start
        f.streams += 1
        self._streams.add(ws)
        self._changed.set()
        await ws.send_str(json.dumps({"type": "hello", "epoch": epoch, "epochs": self.epochs.entries}))
        reader = asyncio.create_task(self._read_acks(ws, f))
        pos = start
        said_read_time = -1
        try:
            while self.serving and self.epoch == epoch and not ws.closed and not reader.done():
                store = self.broker.store
                if store is None:
                    break
                if store.read_time_ms != said_read_time:
                    said_read_time = store.read_time_ms
                    await ws.send_str(json.dumps({"type": "progress", "epoch": epoch, "read_time": said_read_time,
                                                  "end": store.commit.end}))
                data = store.commit.read_raw(pos, FRAME_BYTES) if pos < store.commit.end else b""
                if data:
                    await ws.send_bytes(FRAME.pack(epoch, pos) + data)
                    pos += len(data)
                    continue
                self._grew.clear()
                try:
                    async with asyncio.timeout(PING_S):
                        await self._grew.wait()
                except TimeoutError:
                    await ws.send_str(json.dumps({"type": "ping", "epoch": epoch, "end": store.commit.end}))
        except (ConnectionError, RuntimeError) as e:
            log.info("replication: stream to %s ended: %s", member, e)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            f.streams -= 1
            self._streams.discard(ws)
            await ws.close()
            self._changed.set()
        return ws

    async def _read_acks(self, ws: web.WebSocketResponse, f: Follower) -> None:
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY and len(msg.data) == ACK.size:
                (end,) = ACK.unpack(msg.data)
                if end > f.acked:
                    f.acked = end
                    f.last_ack_s = time.monotonic()
                    self._watermark_moved()

    # ------------------------------------------------------------------------------ follower
    def _superseded(self) -> bool:
        """A follow task that is no longer the current one (cancelled for a new primary) ends at
        its next check, even if it missed its cancellation: two streams into one log would
        each see the other's frames as gaps, and two cuts would race for the data directory."""
        return asyncio.current_task() is not self._follow_task

    async def _follow(self) -> None:
        while not self._superseded():
            if self.primary_url is None:
                self._primary_known.clear()
                # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that
                # arrives as the event is set (as _on_change does both), and this task lived on.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._primary_known.wait()
                continue
            try:
                await self._wait_ready()
                await self._follow_once(self.primary_url)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # connection refused, reset, a frame that does not fit: start over
                log.info("replication: following %s: %s: %s", self.primary_url, type(e).__name__, e)
            await asyncio.sleep(RETRY_S)

    async def _follow_once(self, url: str) -> None:
        broker = self.broker
        store = broker.store
        assert store is not None and self.epochs is not None and self._session is not None
        self.epoch = max(self.epoch, self.coord.epoch)
        params = {"from": str(store.commit.end), "epoch": str(self.epoch), "member": self.member,
                  "last_epoch": str(self.epochs.last_epoch)}
        primary_epochs: list[tuple[int, int]] = []
        self._progress.clear()
        loop = asyncio.get_running_loop()
        token = self.cfg.stream_token()
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with self._session.ws_connect(url.rstrip("/") + STREAM_PATH, params=params, max_msg_size=0,
                                            heartbeat=None, headers=headers) as ws:
            while True:
                try:
                    msg = await ws.receive(timeout=IDLE_S)
                except TimeoutError:
                    log.info("replication: nothing from %s for %.1fs: reconnecting", url, IDLE_S)
                    return
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING,
                                aiohttp.WSMsgType.ERROR):
                    return
                if self.serving or broker.store is not store or url != self.primary_url or self._superseded():
                    return
                if msg.type == aiohttp.WSMsgType.TEXT:
                    d = json.loads(msg.data)
                    if d.get("epoch", 0) < self.epoch:
                        log.warning("replication: %s speaks for epoch %s, this member saw %d: refused", url,
                                    d.get("epoch"), self.epoch)
                        return
                    if d["type"] == "truncate":
                        await ws.close()
                        to = int(d["to"])
                        if to < store.commit.end and broker.store is store and not self._restarting:
                            log.warning("replication: cutting the log back from %d to %d, where the primary's "
                                        "history and this member's part", store.commit.end, to)
                            self._restarting = True
                            try:
                                await asyncio.shield(broker.restart_storage(cut_offset=to))
                            finally:
                                self._restarting = False
                                if broker.store is not None:  # storage.cut rewrote the epoch file
                                    self.epochs = EpochFile(broker.store.data.layout.epochs)
                        else:
                            log.error("replication: the primary holds [%s, ...) only; this member needs a copy "
                                      "of its data directory", d.get("start"))
                            await asyncio.sleep(5)
                        return
                    if d["type"] == "hello":
                        self.epoch = int(d["epoch"])
                        primary_epochs = [(int(e), int(s)) for e, s in d["epochs"]]
                        self.epochs.adopt(primary_epochs, store.commit.end)
                    elif d["type"] == "ping":
                        self.primary_end = int(d["end"])
                    elif d["type"] == "progress":
                        if len(self._progress) >= PROGRESS_HELD:  # indexing lags: wait for the newest
                            self._progress.pop()
                        self._progress.append((time.monotonic(), int(d["end"]), int(d["read_time"])))
                    continue
                if msg.type != aiohttp.WSMsgType.BINARY:
                    return
                data = msg.data
                epoch, offset = FRAME.unpack_from(data)
                if epoch < self.epoch:
                    log.warning("replication: a frame of epoch %d after epoch %d: refused", epoch, self.epoch)
                    return
                self.epoch = epoch
                if offset != store.commit.end:
                    log.warning("replication: a frame at %d, the log ends at %d: reconnecting", offset,
                                store.commit.end)
                    return
                groups = store.apply_replicated(offset, data[FRAME.size:])
                self.primary_end = max(self.primary_end, store.commit.end)
                if broker.groups is not None:
                    for rec in groups:
                        broker.groups.apply(rec.topic, rec.key or "", decode_event(rec.body))
                if broker.pipeline is not None:
                    broker.pipeline.appended.set()
                end = store.commit.end
                await loop.run_in_executor(None, fsync_all, store.commit_handles())
                if primary_epochs:
                    self.epochs.adopt(primary_epochs, end)
                await ws.send_bytes(ACK.pack(end))

    def carry_target(self) -> int:
        """A follower's dequeue cursor target (pipeline.Carry): the primary's durable read time,
        once everything its dispatch wrote before saying it is indexed here, or after
        PROGRESS_WAIT_S in any case: carrying early is safe (what is still pending moves along),
        only more work, and an indexer blocked on a cursor that stood still for days (a follower
        down that long) needs the cursor to move first."""
        store = self.broker.store
        if store is not None:
            waited = time.monotonic() - PROGRESS_WAIT_S
            while self._progress and (self._progress[0][1] <= store.indexed or self._progress[0][0] <= waited):
                self._carry_to = max(self._carry_to, self._progress.popleft()[2])
        return self._carry_to

    # ------------------------------------------------------------------------------ views
    def role(self) -> str:
        return "primary" if self.serving else "follower"

    def primary(self) -> str | None:
        return self.coord.url if self.serving else self.primary_url

    async def describe(self) -> dict[str, Any]:
        out = await self.coord.describe()
        out["replication"] = True
        out["role"] = self.role()
        store = self.broker.store
        end = store.commit.end if store is not None else 0
        out["log_end"] = end
        out["read_time_ms"] = store.read_time_ms if store is not None else 0
        now = time.monotonic()
        if self.serving:
            for m in out.get("members", []):
                if m["member"] == self.member:
                    m["log_end"], m["lag_bytes"], m["lag_ms"] = end, 0, 0
                    continue
                f = self.followers.get(m["member"])
                acked = f.acked if f is not None else None
                m["log_end"] = acked
                m["lag_bytes"] = None if acked is None else max(0, end - acked)
                m["lag_ms"] = None if acked is None else int(self.lag_s(acked, now) * 1000)
                m["streaming"] = bool(f and f.streams)
        else:
            out["primary_log_end"] = self.primary_end
        return out

    def metrics(self) -> dict[str, Any]:
        store = self.broker.store
        end = store.commit.end if store is not None else 0
        now = time.monotonic()
        lag = {m: (max(0, end - f.acked), self.lag_s(f.acked, now)) for m, f in self.followers.items()} \
            if self.serving else {}
        return {"role": self.role(), "epoch": self.coord.epoch, "isr_size": len(self.isr.members) if self.serving
                else 0, "elections": self.elections, "lag": lag,
                "follower_lag_bytes": max(0, self.primary_end - end) if not self.serving else 0}
