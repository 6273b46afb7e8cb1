"""Consumer groups: lease-based pull over a topic's ready queue.

Each group keeps, over the topic's ready-queue indexes:

    floor    every index below is acked (or dead-lettered)
    cursor   every index below was handed out at least once
    done     acked/dead indexes in [floor, cursor)
    leases   index -> Lease (receipt token, deadline, attempt) for messages out with consumers
    retry    heap of (available_at_ms, index): nacked or lease-expired, waiting for redelivery

Durable state is what a restart must keep: floor, done and dead letters (plus settings, push
settings among them: a push group is served by broker.push through the same take/ack/nack).
Every change of it is appended to the commit log as a GROUP record (so it rides the same
group commit as produce) and snapshotted in the checkpoint; recovery replays the records
after the checkpoint. Leases and attempt counts are not durable: after a restart every
unacked message is redelivered, from attempt 1.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import heapq
import itertools
import secrets
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from delayd.broker.pushconfig import PushConfig
from delayd.storage import batch
from delayd.storage.batch_pull import PROW, PULL
from delayd.storage.readyqueue import UNIT_SIZE, ReadyUnit, tag_hash
from delayd.storage.store import Store

TAKE_READ = 1024  # ready units read per step of a take
_PULL_TAIL = struct.Struct("<QII")  # what a PullRow adds to its ready unit: index, attempt, token number
_PULL_INDEX = struct.Struct(f"<{UNIT_SIZE}xQ8x")  # a PullRow's index
_PULL_INDEX_AT = UNIT_SIZE // 8  # ... as the u64 it is of a PullRow's (PROW // 8 of them)
assert PROW % 8 == 0 and UNIT_SIZE % 8 == 0 and _PULL_INDEX.size == PROW
_UNIT_SEQ = struct.Struct("<32xQ")  # a ready unit's seq
_NOT_CANONICAL = 0xFFFFFFFF  # parse_receipts' token number of a receipt it leaves to parse_receipt
BACKOFF_BASE_MS = 1000
BACKOFF_MAX_MS = 600_000


def backoff_ms(attempt: int) -> int:
    return min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** max(0, attempt - 1))


@dataclass(slots=True, eq=False)
class Lease:
    """Messages out with a consumer under one receipt token: all new messages of one take share
    one (`indexes`), a redelivery or an extended lease has its own. `out` counts the indexes still
    held under it; at 0 its entry in the deadline heap is stale. `packed`: a take's `indexes`
    (strictly ascending) as u64s, what an ack of exactly them is recognised by."""
    token: str
    deadline_ms: int
    attempt: int
    indexes: Sequence[int]
    out: int
    packed: bytes = b""


@dataclass(slots=True)
class Dead:
    seq: int
    attempt: int
    reason: str


@dataclass
class Group:
    topic: str
    name: str
    max_attempts: int
    floor: int
    cursor: int
    start: str = "earliest"
    done: set[int] = field(default_factory=set)
    leases: dict[int, Lease] = field(default_factory=dict)  # index -> its lease (shared by a take's new ones)
    retry: list[tuple[int, int]] = field(default_factory=list)
    deadlines: list[tuple[int, int, Lease]] = field(default_factory=list)  # (deadline, number, lease) heap
    ahead: list[int] = field(default_factory=list)  # sorted done indexes >= cursor (acked before a restart)
    attempts: dict[int, int] = field(default_factory=dict)
    dead: dict[int, Dead] = field(default_factory=dict)
    revived: set[int] = field(default_factory=set)  # redriven indexes below the floor
    push: PushConfig | None = None  # None: a pull subscription
    acked_total: int = 0
    nacked_total: int = 0
    dead_total: int = 0
    deleted: bool = False  # removed by DELETE; a long-poll still holding it ends empty

    @property
    def key(self) -> str:
        return f"{self.topic}/{self.name}"

    def settings(self) -> dict[str, Any]:
        out = {"topic": self.topic, "group": self.name, "start": self.start, "max_attempts": self.max_attempts}
        if self.push is not None:
            out["push"] = self.push.view()
        return out

    def snapshot(self) -> dict[str, Any]:
        snap = {"max_attempts": self.max_attempts, "start": self.start, "floor": self.floor, "done": sorted(self.done),
                "dead": {i: [d.seq, d.attempt, d.reason] for i, d in self.dead.items()},
                "revived": sorted(self.revived)}
        if self.push is not None:
            snap["push"] = self.push.to_record()
        return snap

    def live(self, index: int) -> bool:
        """Not yet acked or dead-lettered."""
        if index < self.floor:
            return index in self.revived
        return index not in self.done and index not in self.dead

    def revive(self, index: int) -> None:
        self.dead.pop(index, None)
        self.attempts.pop(index, None)
        if index < self.floor:
            self.revived.add(index)
        else:
            self.done.discard(index)

    def mark_done(self, index: int) -> None:
        self.mark_done_many((index,))

    def mark_done_many(self, indexes: Iterable[int], ascending: bool = False) -> None:
        """Acked or dead-lettered: the floor moves past every index settled below it.
        `ascending`: `indexes` is a list known to be strictly ascending."""
        floor, done, attempts = self.floor, self.done, self.attempts
        if isinstance(indexes, list) and indexes and not attempts and (
                indexes[0] == floor and indexes[-1] == floor + len(indexes) - 1 if ascending else
                min(indexes) == floor and max(indexes) == floor + len(indexes) - 1
                and len(set(indexes)) == len(indexes)):
            floor += len(indexes)  # exactly [floor, floor + n): a consumer settling in order
            if done:
                done.difference_update(indexes)
            indexes = ()
        for i in indexes:
            if i < floor:
                self.revived.discard(i)
                continue
            done.add(i)
            if attempts:
                attempts.pop(i, None)
        while floor in done:
            done.discard(floor)
            floor += 1
        self.floor = floor
        self.cursor = max(self.cursor, floor)

    def excluded(self, first: int, end: int) -> bytes:
        """Indexes in [first, end) the cursor must pass over (settled before a restart), packed
        u64 for the batch core's take_rows; forgets those before `first` (the cursor passed)."""
        ahead = self.ahead
        if not ahead:
            return b""
        del ahead[:bisect.bisect_left(ahead, first)]
        return array("Q", ahead[:bisect.bisect_left(ahead, end)]).tobytes()


@dataclass(slots=True)
class Delivery:
    unit: ReadyUnit
    receipt: str
    attempt: int


@dataclass(slots=True)
class Taken:
    """What one take leased: PullRows (storage.batch_pull.PULL: the ready unit, its index, attempt and
    the number of its lease token in `tokens`), for the batch core to answer the pull with."""
    rows: bytes = b""
    tokens: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows) // PROW

    def deliveries(self) -> list[Delivery]:
        """The rows decoded (push workers, tests, the JSON answer)."""
        return [Delivery(ReadyUnit(index, off, size, th, due, released, seq), f"{index:x}.{self.tokens[t]}", attempt)
                for off, size, th, due, released, seq, index, attempt, t in PULL.iter_unpack(self.rows)]


class Groups:
    """All consumer groups of the broker."""

    def __init__(self, store: Store, now_ms: Callable[[], int], log_event: Callable[[str, str, dict], None],
                 default_max_attempts: int) -> None:
        self.store = store
        self.now_ms = now_ms
        self.log_event = log_event  # appends a GROUP record (durable with the next group commit)
        self.default_max_attempts = default_max_attempts
        self.groups: dict[str, Group] = {}
        self.changed: dict[str, asyncio.Event] = {}  # topic -> set when messages became available
        # topic -> callbacks run by notify: push workers, which must not clear `changed` (a pull
        # long-poll could miss its wake-up) and cannot miss one themselves
        self.watchers: dict[str, set[Callable[[], None]]] = {}
        self._salt = secrets.token_hex(3)
        self._tokens = itertools.count(1)
        self._heap_order = itertools.count()  # ties in a deadline heap never compare two Leases

    # -- lifecycle ------------------------------------------------------------------------------
    def restore(self, snapshot: dict[str, Any], events: list[tuple[str, str, dict]]) -> None:
        for key, s in snapshot.items():
            topic, _, name = key.partition("/")
            g = Group(topic, name, s["max_attempts"], s["floor"], s["floor"], s.get("start", "earliest"),
                      set(s["done"]))
            g.dead = {int(i): Dead(*d) for i, d in s.get("dead", {}).items()}
            g.revived = set(s.get("revived", ()))
            g.push = PushConfig.from_record(s["push"]) if s.get("push") else None
            self.groups[key] = g
        for topic, name, ev in events:
            self.apply(topic, name, ev)
        self.resume()

    def resume(self) -> None:
        """Start delivering from the logged state (after recovery, or on a replica promoted to
        primary, which applied the primary's events as they came)."""
        for g in self.groups.values():
            g.cursor = g.floor  # everything unacked is redelivered after a restart
            g.ahead = sorted(g.done)  # (all at or above the floor) acked out of order: never again
            g.retry = [(0, i) for i in sorted(g.revived)]
            g.leases.clear()  # (a replica's groups hold none: pulls go to the primary)
            g.deadlines.clear()

    def apply(self, topic: str, name: str, ev: dict[str, Any]) -> None:
        """Replay one logged event (recovery)."""
        op = ev.get("op")
        key = f"{topic}/{name}"
        g = self.groups.get(key)
        if op == "create":
            if g is None:
                self.groups[key] = Group(topic, name, ev["max_attempts"], ev["start"], ev["start"],
                                         ev.get("mode", "earliest"))
            else:
                g.max_attempts = ev["max_attempts"]
            return
        if g is None:
            return
        if op == "delete":
            del self.groups[key]
            return
        if op == "ack":
            for i in ev["idx"]:
                g.mark_done(i)
                g.dead.pop(i, None)
        elif op == "dead":
            for i, seq, attempt, reason in ev["items"]:
                g.dead[i] = Dead(seq, attempt, reason)
                g.mark_done(i)
        elif op == "redrive":
            for i in ev["idx"]:
                if i in g.dead:
                    g.revive(i)
        elif op == "push":
            g.push = PushConfig.from_record(ev["push"]) if ev.get("push") else None

    def snapshot(self) -> dict[str, Any]:
        return {k: g.snapshot() for k, g in self.groups.items()}

    # -- groups ---------------------------------------------------------------------------------
    def get_or_create(self, topic: str, name: str, start: str = "earliest",
                      max_attempts: int | None = None) -> Group:
        key = f"{topic}/{name}"
        g = self.groups.get(key)
        if g is None:
            q = self.store.queue(topic)
            first = self.store.earliest(topic) if start == "earliest" else q.end
            g = Group(topic, name, max_attempts or self.default_max_attempts, first, first, start)
            self.groups[key] = g
            self.log_event(topic, name, {"op": "create", "start": first, "mode": start,
                                         "max_attempts": g.max_attempts})
        elif max_attempts is not None and max_attempts != g.max_attempts:
            g.max_attempts = max_attempts
            self.log_event(topic, name, {"op": "create", "start": g.floor, "mode": g.start,
                                         "max_attempts": max_attempts})
        return g

    def delete(self, topic: str, name: str) -> bool:
        """Remove a group: its position, leases and dead letters are forgotten, and the
        deletion is logged like every other group event. False when there is no such group."""
        g = self.groups.get(f"{topic}/{name}")
        if g is None:
            return False
        self.log_event(topic, name, {"op": "delete"})  # first: a write that fails changes nothing
        del self.groups[g.key]
        g.deleted = True
        g.leases.clear()
        self.notify(topic)  # long-polls of the deleted group end now
        return True

    def set_push(self, g: Group, push: PushConfig | None) -> bool:
        """Make the group push (or pull again, with None); False when nothing changed."""
        if push == g.push:
            return False
        # Logged first: a write that fails (disk full) leaves the group as it was.
        self.log_event(g.topic, g.name, {"op": "push", "push": None if push is None else push.to_record()})
        g.push = push
        self.notify(g.topic)  # a waiting pusher re-reads the settings
        return True

    def event(self, topic: str) -> asyncio.Event:
        ev = self.changed.get(topic)
        if ev is None:
            ev = self.changed[topic] = asyncio.Event()
        return ev

    def notify(self, topic: str) -> None:
        ev = self.changed.get(topic)
        if ev is not None:
            ev.set()
        for wake in self.watchers.get(topic, ()):
            wake()

    def watch(self, topic: str, wake: Callable[[], None]) -> None:
        self.watchers.setdefault(topic, set()).add(wake)

    def unwatch(self, topic: str, wake: Callable[[], None]) -> None:
        self.watchers.get(topic, set()).discard(wake)

    # -- pull -----------------------------------------------------------------------------------
    def _expire(self, g: Group, now: int) -> None:
        """Leases past their deadline go back for redelivery. The deadline heap keeps this
        proportional to what expires, not to what is leased."""
        heap, leases = g.deadlines, g.leases
        while heap and heap[0][0] <= now:
            _deadline, _n, lease = heapq.heappop(heap)
            if not lease.out:
                continue
            for i in lease.indexes:
                if leases.get(i) is lease:
                    del leases[i]
                    g.attempts[i] = lease.attempt
                    heapq.heappush(g.retry, (now, i))
            lease.out = 0

    def next_wakeup_ms(self, g: Group) -> int | None:
        """When something becomes pullable without new messages (retry or lease expiry)."""
        heap = g.deadlines
        while heap and not heap[0][2].out:  # drop entries of settled or extended leases
            heapq.heappop(heap)
        times = [t for t, _ in g.retry[:1]] + [d for d, _, _ in heap[:1]]
        return min(times) if times else None

    def take(self, g: Group, max_n: int, lease_ms: int, tags: list[str] | None) -> list[Delivery]:
        """`take_rows`, decoded."""
        return self.take_rows(g, max_n, lease_ms, tags).deliveries()

    def take_rows(self, g: Group, max_n: int, lease_ms: int, tags: list[str] | None) -> Taken:
        """Lease up to `max_n` messages: redeliveries first, then new ones from the cursor (the
        batch core walks the ready units; one lease token covers all new ones of this take).

        With `tags`, messages whose tag is not listed are skipped for this group (RocketMQ's
        subscription filter): they count as consumed by it and are not redelivered.
        """
        now = self.now_ms()
        self._expire(g, now)
        q = self.store.queue(g.topic)
        deadline = now + lease_ms
        taken = Taken()
        rows: list[bytes] = []
        dead_items: list[list[Any]] = []
        while g.retry and g.retry[0][0] <= now and len(rows) < max_n:
            _, i = heapq.heappop(g.retry)
            if not g.live(i) or i in g.leases:
                continue
            first, unit = q.read_packed(i, 1)
            if first != i or not unit:
                continue
            attempt = g.attempts.get(i, 0) + 1
            if attempt > g.max_attempts:
                seq = _UNIT_SEQ.unpack_from(unit)[0]
                g.dead[i] = Dead(seq, attempt - 1, "max_attempts")
                dead_items.append([i, seq, attempt - 1, "max_attempts"])
                continue
            self._lease(g, self._token(), deadline, attempt, (i,))
            rows.append(unit + _PULL_TAIL.pack(i, attempt, len(taken.tokens)))
            taken.tokens.append(g.leases[i].token)
        skipped: list[int] = []
        if len(rows) < max_n and g.cursor < q.end:
            token = len(taken.tokens)
            wanted = array("I", {tag_hash(t) for t in tags}).tobytes() if tags else None
            fresh: list[bytes] = []
            n = len(rows)
            while n < max_n and g.cursor < q.end:
                first, units = q.read_packed(g.cursor, max(1, min(TAKE_READ, max_n - n)) if wanted is None else TAKE_READ)
                if not units:
                    break
                got, examined, skip = batch.ops.take_rows(units, first, g.excluded(first, first + len(units) // UNIT_SIZE),
                                                          wanted, max_n - n, 1, token)
                g.cursor = first + examined
                if skip:
                    skipped.extend(array("Q", skip))
                if got:
                    fresh.append(got)
                    n += len(got) // PROW
            if fresh:
                new = b"".join(fresh)
                indexes = array("Q", new)[_PULL_INDEX_AT::PROW // 8]
                self._lease(g, self._token(), deadline, 1, indexes.tolist(), indexes.tobytes())
                taken.tokens.append(g.leases[_PULL_INDEX.unpack_from(new)[0]].token)
                rows.extend(fresh)
        if skipped:
            g.mark_done_many(skipped)
            self.log_event(g.topic, g.name, {"op": "ack", "idx": skipped})
        if dead_items:
            g.mark_done_many(i for i, *_ in dead_items)
            g.dead_total += len(dead_items)
            self.log_event(g.topic, g.name, {"op": "dead", "items": dead_items})
        taken.rows = b"".join(rows)
        return taken

    def _token(self) -> str:
        # Unique per lease: a salt per process (restarts) and a counter (no urandom per lease).
        return f"{self._salt}{next(self._tokens):x}"

    def _lease(self, g: Group, token: str, deadline: int, attempt: int, indexes: Sequence[int],
               packed: bytes = b"") -> None:
        lease = Lease(token, deadline, attempt, indexes, len(indexes), packed)
        if len(indexes) == 1:
            g.leases[indexes[0]] = lease
        else:
            g.leases.update(dict.fromkeys(indexes, lease))
        heapq.heappush(g.deadlines, (deadline, next(self._heap_order), lease))

    # -- settle ---------------------------------------------------------------------------------
    @staticmethod
    def parse_receipt(receipt: str) -> tuple[int, str] | None:
        """Receipts are `<message id>.<index hex>.<token>`; the id part is for routing."""
        parts = receipt.rsplit(".", 2)
        if len(parts) != 3:
            return None
        try:
            return int(parts[1], 16), parts[2]
        except ValueError:
            return None

    def _leased(self, g: Group, receipts: list[str], now: int) -> Iterator[tuple[str, int, Lease | None]]:
        """(receipt, index, its live lease or None: stale) for each receipt. The batch core parses
        those in canonical form; `parse_receipt` decides the others."""
        indexes, token_ids, tokens = batch.ops.parse_receipts(receipts)
        leases = g.leases
        for r, i, t in zip(receipts, array("Q", indexes), array("I", token_ids), strict=True):
            if t == _NOT_CANONICAL:
                parsed = self.parse_receipt(r) if isinstance(r, str) else None
                if parsed is None:
                    yield r, -1, None
                    continue
                i, token = parsed
            else:
                token = tokens[t]
            lease = leases.get(i)
            if lease is None or lease.token != token or lease.deadline_ms <= now:
                yield r, i, None
            else:
                yield r, i, lease

    @staticmethod
    def _release(g: Group, i: int, lease: Lease) -> None:
        del g.leases[i]
        lease.out -= 1

    def ack(self, g: Group, receipts: list[str]) -> tuple[int, list[str]]:
        """(acked, stale receipts); what was acked is done for the group, in one GROUP record."""
        now = self.now_ms()
        whole = self.ack_whole(g, batch.ops.parse_receipts(receipts), now)
        if whole is not None:
            return whole, []
        return self._ack_each(g, receipts, now)

    def _ack_each(self, g: Group, receipts: list[str], now: int) -> tuple[int, list[str]]:
        """`ack`, receipt by receipt: any mix of leases, stale and malformed receipts."""
        acked, stale = [], []
        for r, i, lease in self._leased(g, receipts, now):
            if lease is None:
                stale.append(r)
                continue
            self._release(g, i, lease)
            acked.append(i)
        if acked:
            g.mark_done_many(acked)
            g.acked_total += len(acked)
            self.log_event(g.topic, g.name, {"op": "ack", "idx": acked})
        return len(acked), stale

    def ack_whole(self, g: Group, parsed: tuple[bytes, bytes, list[str]], now: int) -> int | None:
        """`ack` of receipts that all hold one live lease, each index once (a consumer acking what
        one pull gave it: the common case), without a step per receipt in Python, from what the
        batch core's `parse_receipts` (or `parse_receipts_raw`) made of them; None when they do
        not, and `ack` decides receipt by receipt."""
        indexes, token_ids, tokens = parsed
        if len(tokens) != 1 or not indexes:
            return None
        if token_ids != bytes(len(token_ids)):  # a receipt batch_core left to parse_receipt (token 0: the one)
            return None
        leases = g.leases
        lease = leases.get(int.from_bytes(indexes[:8], "little"))
        acked: Sequence[int]
        if lease is not None and lease.packed == indexes and lease.out == len(lease.indexes):
            acked, ascending = lease.indexes, True  # exactly one take's messages, in its order, all out
        else:
            ascending = False
            acked = array("Q", indexes).tolist()  # one int object per index, for every step below
            got = list(map(leases.get, acked))
            lease = got[0]
            if lease is None or got.count(lease) != len(got):
                return None
            if len(set(acked)) != len(acked):
                return None  # an index twice: the second is stale
        if lease.token != tokens[0] or lease.deadline_ms <= now:
            return None
        collections.deque(map(leases.pop, acked), 0)
        lease.out -= len(acked)
        g.mark_done_many(acked, ascending)
        g.acked_total += len(acked)
        self.log_event(g.topic, g.name, {"op": "ack", "idx": acked})
        return len(acked)

    def nack(self, g: Group, receipts: list[str], delay_ms: int | None,
             reason: str = "nacked") -> tuple[int, list[str]]:
        now = self.now_ms()
        n, stale, dead_items = 0, [], []
        for r, i, lease in self._leased(g, receipts, now):
            if lease is None:
                stale.append(r)
                continue
            self._release(g, i, lease)
            n += 1
            if lease.attempt >= g.max_attempts:
                seq = self.store.queue(g.topic).read(i, 1)[0].seq
                g.dead[i] = Dead(seq, lease.attempt, reason)
                dead_items.append([i, seq, lease.attempt, reason])
                g.mark_done(i)
                continue
            g.attempts[i] = lease.attempt
            wait = backoff_ms(lease.attempt) if delay_ms is None else delay_ms
            heapq.heappush(g.retry, (now + wait, i))
        g.nacked_total += n
        if dead_items:
            g.dead_total += len(dead_items)
            self.log_event(g.topic, g.name, {"op": "dead", "items": dead_items})
        if n:
            self.notify(g.topic)
        return n, stale

    def dead_letter(self, g: Group, index: int, seq: int, attempt: int, reason: str) -> None:
        lease = g.leases.get(index)
        if lease is not None:
            self._release(g, index, lease)
        g.dead[index] = Dead(seq, attempt, reason)
        g.mark_done(index)
        g.dead_total += 1
        self.log_event(g.topic, g.name, {"op": "dead", "items": [[index, seq, attempt, reason]]})

    def extend(self, g: Group, receipts: list[str], lease_ms: int) -> tuple[int, list[str]]:
        now = self.now_ms()
        n, stale = 0, []
        for r, i, lease in self._leased(g, receipts, now):
            if lease is None:
                stale.append(r)
                continue
            # The message leaves its take's shared lease for one of its own, same token (its
            # receipt stays valid), new deadline.
            self._release(g, i, lease)
            self._lease(g, lease.token, now + lease_ms, lease.attempt, (i,))
            n += 1
        return n, stale

    def redrive(self, g: Group, seqs: set[int] | None) -> int:
        idx = [i for i, d in g.dead.items() if seqs is None or d.seq in seqs]
        now = self.now_ms()
        for i in idx:
            g.revive(i)
            heapq.heappush(g.retry, (now, i))
        if idx:
            self.log_event(g.topic, g.name, {"op": "redrive", "idx": idx})
            self.notify(g.topic)
        return len(idx)

    def needed(self) -> dict[str, int]:
        """Per topic, the lowest ready-queue index some group still needs (retention pins)."""
        out: dict[str, int] = {}
        for g in self.groups.values():
            low = min([g.floor, *g.dead.keys(), *g.revived])
            out[g.topic] = min(out.get(g.topic, low), low)
        return out

    # -- observe --------------------------------------------------------------------------------
    def stats(self, g: Group) -> dict[str, int]:
        q = self.store.queue(g.topic)
        now = self.now_ms()
        waiting = sum(1 for _t, i in g.retry if g.live(i))
        expired = sum(1 for lease in g.leases.values() if lease.deadline_ms <= now)
        inflight = len(g.leases) - expired
        return {"backlog": max(0, q.end - g.cursor) + waiting + expired, "inflight": inflight,
                "dead": len(g.dead), "oldest_unacked_age_ms": self.oldest_unacked_age_ms(g, now)}

    def oldest_unacked_due_ms(self, g: Group) -> int | None:
        """`deliver_at` of the group's oldest message that is due and not acked (nor dead), or
        None when it has none. Everything below the floor is settled except redriven dead
        letters, and the floor itself is never settled, so this is one ready-queue read."""
        q = self.store.queue(g.topic)
        oldest = min([g.floor, *g.revived])
        if oldest >= q.end:
            return None
        units = q.read(oldest, 1)
        return units[0].deliver_at if units else None

    def oldest_unacked_age_ms(self, g: Group, now: int) -> int:
        """How long ago the group's oldest due, unacked message fell due (SQS's
        ApproximateAgeOfOldestMessage, RocketMQ's consumer lag time); 0 when none waits."""
        due = self.oldest_unacked_due_ms(g)
        return 0 if due is None else max(0, now - due)


def encode_event(ev: dict[str, Any]) -> bytes:
    return msgpack.packb(ev)


def decode_event(body: bytes) -> dict[str, Any]:
    ev = msgpack.unpackb(body, strict_map_key=False)
    return ev if isinstance(ev, dict) else {}
