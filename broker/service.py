"""The broker: storage + pipeline + consumer groups, behind the operations of API v1.

The HTTP layer decodes and validates; this module decides. All state changes happen on the
event loop thread, so a check followed by a change (cancel vs. release) is atomic.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import re
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import EllipsisType
from typing import Any, TypeVar, cast

from delayd.broker import codec, errors
from delayd.broker.clock import Clock
from delayd.broker.config import Config
from delayd.broker.groups import Delivery, Group, Groups, Taken, decode_event, encode_event
from delayd.broker.pipeline import GroupCommit, Pipeline
from delayd.broker.push import Pusher, PushOutcome
from delayd.broker.pushconfig import PushConfig
from delayd.storage import batch
from delayd.storage.batch_pull import PROW
from delayd.storage.browse import Page, Query
from delayd.storage.commitlog import Record
from delayd.storage.datadir import DataDir
from delayd.storage.dispatch import Released
from delayd.storage.errors import OutOfDescriptors, StorageError
from delayd.storage.msgtable import MessageState
from delayd.storage.readyqueue import UNIT_DELIVER_AT
from delayd.storage.readyqueue import UNIT_SIZE as READY_UNIT
from delayd.storage.recovery import recover
from delayd.storage.store import NewMessage, Store

log = logging.getLogger("delayd.broker")

ID_NUMBER = re.compile(r"[1-9a-f][0-9a-f]{0,15}")
LATENESS_SAMPLE = 10_000  # the last this many released messages' lateness: stats' p50/p99/max
LIST_CATCH_UP_S = 1.0  # how long a listing waits for indexing to catch up with earlier produces
STATE_NAMES = {MessageState.SCHEDULED: "scheduled", MessageState.DELIVERED: "delivered",
               MessageState.CANCELLED: "cancelled"}


@dataclass(slots=True)
class Produced:
    id: str
    deliver_at: int
    duplicate: bool = False


@dataclass(slots=True)
class _Keyed:
    """The key check of one produce batch (`Broker._keyed`)."""
    named: int = 0  # messages of the batch with a key
    fresh: list[int] | range = field(default_factory=list)  # indexes of the messages to store (ascending)
    held: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (seq, deliver_at) of its holder
    same: dict[int, int] = field(default_factory=dict)  # index -> the earlier message of this batch with its key
    cancels: list[tuple[int, str, str | None]] = field(default_factory=list)  # holders replaced: (seq, topic, key)


# The checkpoint's writes (the key index's SQLite transaction, the fsyncs, the checkpoint file)
# run in a thread of their own at a lower CPU priority: where the cores are busy, the event loop
# (produce, release, pull) gets them first and the checkpoint lags, which only delays the next
# checkpoint (keyed produce is refused for a while if the key index falls max_unwritten_keys
# behind). Linux sets a thread's nice value by its id; elsewhere the thread keeps the process's.
CHECKPOINT_NICE = 10


def background_priority() -> None:
    """Lower the calling thread's CPU priority by CHECKPOINT_NICE (Linux only)."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + CHECKPOINT_NICE)
        except OSError as e:  # (a container may forbid it: the thread keeps the process's)
            log.debug("checkpoint thread priority unchanged: %s", e)


# A key that repeats in a batch is one of the keys a claim could not rule out (KeyIndex.claim_many):
# up to this many of them, each is counted in the batch (a C loop over it, about 10 us a key asked
# in a batch of 1,000) instead of making a set of the whole batch's keys (about 24 us; BENCHMARKS.md).
# A filter of a few million keys answers "maybe" for several keys of a batch of new ones.
REPEAT_COUNTS = 2
ROOM_POLL_S = 0.05  # how often a produce refused for room tries again (Config.backpressure_wait_ms)
T = TypeVar("T")


def repeats(named: Sequence[str], maybe: list[str] | None) -> bool:
    """Whether a key repeats in `named`; `maybe`: keys among which any that repeats is (None: not known).
    `named` a produce's Keys (storage/batch_keyseq.c): asked of it, without a str a key."""
    if maybe is not None and len(maybe) <= REPEAT_COUNTS:
        return any(named.count(k) > 1 for k in set(maybe))
    if not isinstance(named, list):
        return bool(named.repeats())  # type: ignore[attr-defined]
    return len(set(named)) != len(named)


class BrokerState(enum.Enum):
    """The broker's lifecycle, in order (`/readyz` is 200 only while READY)."""
    INITIAL = "initial"  # built; the data directory is not open yet
    OPEN = "open"  # the data directory is locked and its formats checked; not recovered yet
    RECOVERING = "recovering"
    READY = "ready"  # recovered, the pipeline runs: serving
    STOPPING = "stopping"  # shutdown began: long-polls answer, the pipeline drains
    STOPPED = "stopped"  # final checkpoint written, files closed


class Broker:
    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        self.cfg = config
        self.clock = clock or Clock()
        self.state = BrokerState.INITIAL
        self.data: DataDir | None = None
        self.node_id = config.node_id  # the data directory's, once it is open
        self._id_prefix = config.node_id + "-"
        # what the batch core checks a message against (the order of storage.batch.encode_produce's limits)
        self._limits = (config.max_body_bytes, config.max_delay_ms, codec.MAX_TAG_CHARS, codec.MAX_TAG_BYTES,
                        codec.MAX_KEY_BYTES, codec.MAX_HEADERS, codec.MAX_HEADER_BYTES)
        self.store: Store | None = None
        self.pipeline: Pipeline | None = None
        self.groups: Groups | None = None
        self.committer: GroupCommit | None = None
        self.recovery_seconds = 0.0
        self.recovery_line = ""
        # The lateness of the last LATENESS_SAMPLE released messages, as the batch core's packed
        # i64 chunks (one per release batch, the oldest dropped once the rest hold the sample).
        self.lateness: deque[bytes] = deque()
        self._lateness_n = 0
        # metrics hooks: objects with on_release(released, now) and on_push(topic, group, outcome, seconds)
        self.listeners: list[Any] = []
        self.fsync_listeners: list[Callable[[float], None]] = []  # each commit-log fsync's seconds
        self.pusher: Pusher | None = None
        # broker.replication.Replication when replication is on (set by the daemon before start)
        self.repl: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._writing: asyncio.Future[None] | None = None  # a checkpoint being written in a thread
        self._keys_waiting = asyncio.Event()  # half of max_unwritten_keys wait: checkpoint now
        self._t0 = time.monotonic()

    @property
    def ready(self) -> bool:
        return self.state is BrokerState.READY

    # ---------------------------------------------------------------------------------- lifecycle
    def open(self) -> None:
        """Lock the data directory, check its formats and settle the node id. Quick, and done
        before the daemon binds its port: a directory in use or written by a newer build fails
        here, with nothing changed."""
        if self.data is not None:
            return
        self.data = DataDir.open(Path(self.cfg.data_dir), self.cfg.node_id or None)
        self.node_id = self.data.node_id
        self._id_prefix = self.node_id + "-"
        self.state = BrokerState.OPEN

    async def recover(self) -> None:
        """Recovery, in a worker thread (it reads files only; /healthz answers meanwhile)."""
        self.open()
        assert self.data is not None
        self._t0 = time.monotonic()
        self.state = BrokerState.RECOVERING
        loop = asyncio.get_running_loop()
        store, report = await loop.run_in_executor(None, recover, self.data, self.cfg.store_config(),
                                                   self.clock.now_ms)
        self.store = store
        self.recovery_line = report.line()
        log.info(self.recovery_line)
        self.groups = Groups(store, self.clock.now_ms, self._log_group_event, self.cfg.default_max_attempts)
        events = [(rec.topic, rec.key or "", decode_event(rec.body)) for rec in report.group_events]
        self.groups.restore(store.groups_snapshot, events)
        self.committer = GroupCommit(store, self.cfg.fsync, self.cfg.fsync_interval_ms,
                                     on_fsync=self._on_fsync, on_durable=self._on_durable)

    def start_pipeline(self) -> None:
        """Start the stages, the group commit, the checkpoint loop and the push workers: the
        broker is READY."""
        store = self.store
        assert store is not None and self.groups is not None and self.committer is not None
        follower = self.repl is not None and not self.repl.serving
        self.pipeline = self._new_pipeline(store, follower)
        # A checkpoint right after recovery makes the next restart start from here. The key
        # index's writes that recovery queued (its replay of the keys past its commit: after a
        # kill -9 under a keyed load, a second's keys or more) ride the checkpoint loop's first
        # checkpoint, in its thread, instead of keeping the daemon from being ready.
        store.checkpoint(self.pipeline.inflight.read_time(), self.groups.snapshot(), keys=False)
        self.pipeline.start()
        self._tasks = [asyncio.create_task(self.committer.run(), name="group_commit"),
                       asyncio.create_task(self._checkpoint_loop(), name="checkpoint")]
        # Push workers start once recovery is done: they lease like any consumer (a replication
        # follower pushes nothing: its primary does).
        if not follower:
            self._start_pusher(store)
        self.recovery_seconds = time.monotonic() - self._t0
        self.state = BrokerState.READY

    def _new_pipeline(self, store: Store, follower: bool) -> Pipeline:
        return Pipeline(store, self.clock, lookahead_ms=self.cfg.lookahead_ms,
                        queue_batches=self.cfg.stage_queue_batches, release_capacity=self.cfg.release_capacity,
                        on_release=self._on_release, follower=follower,
                        limit=self.repl.watermark if self.repl is not None and not follower else None,
                        carry_to=self.repl.carry_target if self.repl is not None and follower else None)

    def _start_pusher(self, store: Store) -> None:
        assert self.groups is not None and self.committer is not None
        self.pusher = Pusher(self.groups, store, self.clock, self.message_id, self.committer.durable,
                             self.cfg.push_max_in_flight, self._on_push)
        self.pusher.start()

    async def switch_role(self, follower: bool) -> None:
        """Replication: run the whole pipeline (primary) or its enqueue side only (follower)."""
        store = self.store
        if store is None or self.pipeline is None or self.state is not BrokerState.READY:
            return
        if self.pusher is not None:
            await self.pusher.stop()
            self.pusher = None
        await self.pipeline.stop()  # (what it held unreleased is walked again by the next one)
        self.pipeline = self._new_pipeline(store, follower)
        if not follower:
            store.apply_releases()  # before this member releases anything itself
            if self.groups is not None:
                self.groups.resume()
        self.pipeline.start()
        if not follower:
            self._start_pusher(store)

    async def restart_storage(self, cut_offset: int | None = None) -> None:
        """Replication: close the store, cut its log back to `cut_offset` with every derived file
        (storage.cut), and recover it again — a member whose log went past the primary's."""
        from delayd.storage.cut import cut
        await self.stop_pipeline()
        self.close_storage()
        self.data = None
        self.store = self.pipeline = self.groups = self.committer = None
        if cut_offset is not None:
            await asyncio.get_running_loop().run_in_executor(None, cut, Path(self.cfg.data_dir), cut_offset,
                                                             self.cfg.store_config())
        self.state = BrokerState.INITIAL
        await self.recover()
        self.start_pipeline()

    async def start(self) -> None:
        """open + recover + start_pipeline."""
        await self.recover()
        self.start_pipeline()

    def stopping(self) -> None:
        """Shutdown began: pending long-polls answer now (with what they have) instead of
        holding the shutdown until their wait ends."""
        if self.state in (BrokerState.STOPPING, BrokerState.STOPPED):
            return
        self.state = BrokerState.STOPPING
        if self.pusher is not None:
            self.pusher.stop_taking()
        if self.groups is not None:
            for ev in self.groups.changed.values():
                ev.set()

    async def stop_pipeline(self) -> None:
        """Stop the push workers, drain the stages (bounded), stop the group commit and the
        checkpoint loop."""
        self.stopping()
        if self.pusher is not None:
            await self.pusher.stop()
        if self.pipeline is not None:
            await self.pipeline.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)

    def close_storage(self) -> dict[str, Any]:
        """Flush, write the final checkpoint, close the files and the LOCK. Idempotent."""
        if self.state is BrokerState.STOPPED:
            return {}
        self.state = BrokerState.STOPPED
        if self.store is None:
            if self.data is not None:
                self.data.close()
            return {}
        store = self.store
        summary = {"produced": store.totals["produced"], "delivered": store.totals["delivered"],
                   "cancelled": store.totals["cancelled"], "scheduled": store.scheduled}
        try:
            store.flush_commit()
            if self.pipeline is not None and self.groups is not None:
                store.checkpoint(self.pipeline.inflight.read_time(), self.groups.snapshot())
        finally:
            store.close()
        return summary

    async def stop(self) -> dict[str, Any]:
        """Idempotent: drain the pipeline, flush, final checkpoint, close files."""
        if self.state is BrokerState.STOPPED:
            return {}
        await self.stop_pipeline()
        return self.close_storage()

    async def _checkpoint_loop(self) -> None:
        writer = ThreadPoolExecutor(1, "delayd-checkpoint", initializer=background_priority)
        try:
            await self._checkpoints(writer)
        finally:  # (a write under way goes on; stop_pipeline waits for it)
            writer.shutdown(wait=False)

    async def _checkpoints(self, writer: ThreadPoolExecutor) -> None:
        assert self.store and self.pipeline and self.groups
        loop = asyncio.get_running_loop()
        next_retention = time.monotonic() + self.cfg.retention_interval_ms / 1000
        failed = False
        while True:
            await self._next_checkpoint(early=not failed)
            self.expire_keys()
            try:
                pending = self.store.prepare_checkpoint(self.pipeline.inflight.read_time(), self.groups.snapshot())
            except OSError as e:  # no descriptor to dup: try again next round
                log.error("checkpoint failed: %s: %s", type(e).__name__, e)
                failed = True
                continue
            try:
                # The fsyncs take the disk's time, not the event loop's. Shielded: a stop
                # waits for this write to end rather than racing it.
                self._writing = loop.run_in_executor(writer, self.store.finish_checkpoint, pending)
                await asyncio.shield(self._writing)
            except Exception as e:  # disk full, I/O error, SQLite error: try again next round
                log.error("checkpoint failed: %s: %s", type(e).__name__, e)
                self.store.checkpoint_failed(pending)
                failed = True
                continue
            self.store.checkpoint_saved(pending)
            failed = False
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + self.cfg.retention_interval_ms / 1000
                try:
                    gone = self.store.retain(self.clock.now_ms(), self.cfg.retention_ms, self.groups.needed())
                except OutOfDescriptors as e:
                    log.warning("retention skipped this round: %s", e)
                    continue
                if any(gone.values()):
                    log.info("retention deleted segments: %s", gone)

    async def _next_checkpoint(self, early: bool) -> None:
        """Wait for the next checkpoint: checkpoint_interval_ms, or, with `early`, until half of
        `max_unwritten_keys` keys wait to be written (`_key_room` says so): a keyed flood's keys are
        then written before the produce is refused for them, not a whole interval later (a
        sustained flood of random keys took 60-70 % more a second, BENCHMARKS.md). Not early
        after a failed checkpoint: its retry waits the interval."""
        interval = self.cfg.checkpoint_interval_ms / 1000
        if not early:
            await asyncio.sleep(interval)
            return
        try:
            await asyncio.wait_for(self._keys_waiting.wait(), interval)
        except TimeoutError:
            pass
        self._keys_waiting.clear()

    def failure(self) -> BaseException | None:
        if self.pipeline is not None and (e := self.pipeline.failed()) is not None:
            return e
        for t in self._tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                return t.exception()
        return None

    # ---------------------------------------------------------------------------------- ids
    def message_id(self, seq: int) -> str:
        return self._id_prefix + format(seq, "x")

    def parse_id(self, message_id: str) -> int:
        """The sequence number of an id this node issued; only the exact spelling counts."""
        node, _, num = message_id.partition("-")
        if node != self.node_id or not ID_NUMBER.fullmatch(num):
            raise errors.NotFound(f"no message {message_id!r}")
        return int(num, 16)

    # ---------------------------------------------------------------------------------- produce
    def _require_ready(self) -> Store:
        if not self.ready or self.store is None:
            raise errors.NotReady("recovery is still running", retry_after_s=1)
        return self.store

    async def produce(self, messages: list[NewMessage], replace: list[bool] | None = None) -> list[Produced]:
        """Store messages of one topic (all or nothing) and answer once they are durable: the
        reference path (JSON bodies, and msgpack bodies `produce_raw` does not decide).

        Keys: a key held by a pending message (or one delivered within the dedup window)
        makes the message a duplicate: nothing is stored and the holder is answered. With
        `replace`, a pending holder is cancelled in the same atomic write instead. Everything
        from lookup to append runs without yielding, so two concurrent produces of one key
        cannot both store a message. Refused for room, it waits (`_with_room`).
        """
        return await self._with_room(lambda: self._produce(messages, replace))

    async def _with_room(self, produce: Callable[[], Awaitable[T]]) -> T:
        """`produce()`, tried again every ROOM_POLL_S while it is refused for room
        (errors.Backpressure: an index is behind; nothing was stored) until
        `backpressure_wait_ms` have passed, then refused (429). The writes that make room run in
        other threads and stages; a flood's produce then goes on when a checkpoint has written
        the keys, instead of its client waiting out a Retry-After second (BENCHMARKS.md)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.backpressure_wait_ms / 1000
        while True:
            try:
                return await produce()
            except errors.Backpressure:
                if loop.time() + ROOM_POLL_S > deadline:
                    raise
            await asyncio.sleep(ROOM_POLL_S)

    async def _produce(self, messages: list[NewMessage], replace: list[bool] | None) -> list[Produced]:
        store = self._writable()
        now = self.clock.now_ms()
        replace = replace or [False] * len(messages)
        topic = messages[0].topic if messages else ""
        assert all(m.topic == topic for m in messages), "one topic per produce"
        keys = [m.key for m in messages]
        found = None
        if any(k is not None for k in keys):
            self._key_room(store)
            found = self._keyed(store, topic, keys, replace, now)
        fresh_at = found.fresh if found is not None else range(len(messages))
        fresh = [messages[i] for i in fresh_at]
        if fresh:
            self._far_room(store, lambda: max(m.deliver_at for m in fresh), now)
        results: list[Produced | None] = [None] * len(messages)
        if fresh:
            # A failure here (disk full, no descriptors) is answered by broker.errors' table.
            seqs = store.append_messages(fresh, now, found.cancels if found is not None else [])
            for i, seq in zip(fresh_at, seqs, strict=True):
                results[i] = Produced(self.message_id(seq), messages[i].deliver_at)
            assert self.pipeline is not None
            self.pipeline.appended.set()
        if found is not None:
            for i, holder in found.held.items():
                results[i] = Produced(self.message_id(holder[0]), holder[1], duplicate=True)
            for i, first in found.same.items():
                r = results[first]
                assert r is not None
                results[i] = Produced(r.id, r.deliver_at, duplicate=True)
        # Also for pure duplicates: the holder may itself still be on its way to the disk.
        await self._durable()
        return [r for r in results if r is not None]

    async def produce_raw(self, topic: str, raw: bytes | bytearray, as_json: bool) -> bytes | None:
        """A msgpack produce body straight to records and its answer straight to bytes (the
        batch core's `encode_produce_raw` and `encode_produced`): `produce` without a Python
        object per message. None when the core does not decide the body; the caller then
        parses it and calls `produce`, which answers it (an invalid body's error included).
        Nothing is stored before the body is decided. Refused for room, it waits (`_with_room`);
        its delays count from its arrival, as the reference path's do."""
        now = self.clock.now_ms()
        return await self._with_room(lambda: self._produce_raw(topic, raw, as_json, now))

    async def _produce_raw(self, topic: str, raw: bytes | bytearray, as_json: bool, now: int) -> bytes | None:
        store = self._writable()
        cfg = self.cfg
        topic_b = topic.encode()
        args = (topic_b, now, store.next_seq, self._limits, cfg.max_batch, cfg.max_request_elements)
        got = batch.ops.encode_produce_raw(raw, *args, None)
        if got is None:
            return None
        records, sizes, dues, keys, replace = got
        n = len(dues) // 8
        deliver_at = array("q", dues)
        found = None
        if keys is not None or replace is not None:
            if keys is not None:
                self._key_room(store)
            try:
                found = self._keyed(store, topic, keys or [None] * n, replace or [False] * n, now, claim=True)
            except errors.InvalidMessage:
                return None  # `produce` raises it again, as the reference path does everything
            if len(found.fresh) < n:
                records, sizes, *_ = batch.ops.encode_produce_raw(raw, *args, array("I", found.fresh).tobytes())
        fresh = found.fresh if found is not None else range(n)
        if fresh:  # (over all of them: a duplicate stores nothing, but rarely decides it)
            self._far_room(store, lambda: max(deliver_at), now)
        every = len(fresh) == n  # the usual batch: every message stored, their seqs from `first` on
        seqs = array("Q", bytes(0 if every else 8 * n))
        first = 0
        duplicate = bytearray(n)
        if fresh:
            # The key index keeps both (read-only views, or copies).
            run_keys: list[str | None] | None = keys
            run_dues: Sequence[int] = memoryview(dues).cast("q")
            claimed = found.named if found is not None else None  # (a batch of replace flags only: 0)
            if keys is not None and len(fresh) < n:
                run_keys, run_dues = [keys[i] for i in fresh], array("q", [deliver_at[i] for i in fresh])
                claimed = len(run_keys) - run_keys.count(None)
            first = store.append_packed(topic, records, sizes, now, run_keys, run_dues,
                                        found.cancels if found is not None else [], claimed)
            if not every:
                for j, i in enumerate(fresh):
                    seqs[i] = first + j
            assert self.pipeline is not None
            self.pipeline.appended.set()
        if found is not None:
            for i, (seq, due) in found.held.items():
                seqs[i], deliver_at[i], duplicate[i] = seq, due, 1
            for i, k in found.same.items():
                seqs[i], deliver_at[i], duplicate[i] = seqs[k], deliver_at[k], 1
        # (consecutive seqs go as the first: an array of them cost the loop 16 ns a message)
        answer = batch.ops.encode_produced(first if every else seqs.tobytes(), deliver_at.tobytes(), bytes(duplicate),
                                           self._id_prefix.encode(), as_json)
        await self._durable()  # also for pure duplicates: the holder may still be on its way to the disk
        if answer is None:  # JSON with a node id the core does not write itself
            answer = json.dumps({"messages": [{"id": self.message_id(s), "deliver_at": d, "duplicate": bool(u)}
                                              for s, d, u in zip(range(first, first + n) if every else seqs,
                                                                 deliver_at, duplicate, strict=True)]},
                                separators=(",", ":")).encode()
        return answer

    def _writable(self) -> Store:
        store = self._require_ready()
        if store.commit.end - store.indexed > self.cfg.max_unindexed_bytes:
            raise errors.Backpressure("indexing is behind; retry shortly", retry_after_s=1)
        return store

    def _key_room(self, store: Store) -> None:
        """A keyed produce is refused for now while the key index's writes are behind: the keys
        it has not written yet are held in memory (storage.keyindex `unwritten`)."""
        if store.keys.unwritten > self.cfg.max_unwritten_keys:
            raise errors.Backpressure("the key index is behind; retry shortly", retry_after_s=1)
        if store.keys.unwritten > self.cfg.max_unwritten_keys // 2:
            self._keys_waiting.set()  # (checkpoint now: _next_checkpoint)

    def _far_room(self, store: Store, last_due: Callable[[], int], now: int) -> None:
        """A produce holding a message due beyond the roll window is refused for now while the far
        index's writes are behind: what it has not written yet is held in memory
        (storage.farindex `unwritten`). `last_due()`, the batch's latest due time, is asked only
        then (the max of a batch's due times cost the event loop 20 ns a message)."""
        if store.far.unwritten > self.cfg.max_unwritten_far and last_due() > now + self.cfg.roll_window_ms:
            raise errors.Backpressure("the far-future index is behind; retry shortly", retry_after_s=1)

    def _keyed(self, store: Store, topic: str, keys: Sequence[str | None], replace: list[bool], now: int,
               claim: bool = False) -> _Keyed:
        """Which messages of a keyed batch are stored, and what the others answer (see `produce`).
        `claim`: the stored ones are put next, with no other put between (KeyIndex.claim_many)."""
        out = _Keyed()
        in_batch: dict[str, int] = {}
        # Keys are never empty, so filter(None, ...) leaves out exactly the Nones (and compares nothing);
        # a batch of keys only is asked as it is (a produce body's: storage.batch Keys, no str a key).
        named = cast("Sequence[str]", keys) if not keys.count(None) else list(filter(None, keys))
        out.named = len(named)
        holders, maybe = store.claim_holders(topic, named) if claim else (store.key_holders(topic, named), None)
        if not holders and not repeats(named, maybe):  # the usual batch: new keys, none repeated
            out.fresh = range(len(keys))
            return out
        fresh: list[int] = []
        out.fresh = fresh
        for i, key in enumerate(keys):
            if key is not None:
                if key in in_batch:
                    if replace[i]:
                        raise errors.InvalidMessage(f"message {i}: key {key!r} repeats in this batch", index=i)
                    out.same[i] = in_batch[key]
                    continue
                holder = holders.get(key)
                if holder is not None:
                    seq, st, deliver_at, done_at = holder
                    if st == MessageState.SCHEDULED and replace[i]:
                        out.cancels.append((seq, topic, key))
                    elif st == MessageState.SCHEDULED or (
                            not replace[i] and now - (done_at or deliver_at) < self.cfg.dedup_window_ms):
                        out.held[i] = (seq, deliver_at)
                        continue
                in_batch[key] = i
            fresh.append(i)
        return out

    async def _durable(self) -> None:
        assert self.committer is not None and self.store is not None
        end = self.store.commit.end  # (this request's records are below it)
        await self.committer.durable()  # NotDurable when the fsync failed: 507 (broker.errors)
        if self.repl is not None:
            # ... and on every in-sync member; then the fence (docs/replication.md).
            await self.repl.replicated(end)

    # ---------------------------------------------------------------------------------- cancel
    async def cancel(self, message_id: str) -> dict[str, str]:
        store = self._require_ready()
        seq = self.parse_id(message_id)
        st, off, size, _ = store.state(seq)
        if st == MessageState.UNKNOWN:
            raise errors.NotFound(f"no message {message_id!r}")
        if st == MessageState.DELIVERED:
            raise errors.AlreadyDelivered(f"message {message_id} was already delivered")
        if st == MessageState.SCHEDULED:
            rec = self._record(off, size, message_id)
            store.append_cancel(seq, rec.topic, rec.key)
            assert self.pipeline is not None
            self.pipeline.appended.set()
        await self._durable()  # also for a repeat: the first cancel may still be in flight
        return {"id": message_id, "state": "cancelled"}

    def _record(self, offset: int, size: int, message_id: str) -> Record:
        assert self.store is not None
        try:
            return self.store.read_record(offset, size)
        except OutOfDescriptors:
            raise  # transient: 503 (broker.errors), not "gone"
        except StorageError as e:
            raise errors.NotFound(f"message {message_id} is no longer readable ({e})") from e

    def id_for_key(self, topic: str, key: str) -> str:
        """The pending message holding `key` (API.md: GET and DELETE by key name "the pending
        message with that key"). A delivered holder still blocks a duplicate produce for the
        dedup window, but it is not pending: by key it is 404, not 200 `delivered` or 409."""
        holder = self._require_ready().key_holder(topic, key)
        if holder is None or holder[1] != MessageState.SCHEDULED:
            raise errors.NotFound(f"no pending message with key {key!r} in topic {topic!r}")
        return self.message_id(holder[0])

    def expire_keys(self) -> None:
        if self.store is not None:
            self.store.keys.expire(self.clock.now_ms() - self.cfg.dedup_window_ms)

    # ---------------------------------------------------------------------------------- inspect
    def get(self, message_id: str) -> tuple[Record, str]:
        store = self._require_ready()
        seq = self.parse_id(message_id)
        st, off, size, _ = store.state(seq)
        if st == MessageState.UNKNOWN:
            raise errors.NotFound(f"no message {message_id!r}")
        return self._record(off, size, message_id), STATE_NAMES[st]

    # ---------------------------------------------------------------------------------- consume
    def group(self, topic: str, name: str, start: str = "earliest", max_attempts: int | None = None) -> Group:
        self._require_ready()
        assert self.groups is not None
        return self.groups.get_or_create(topic, name, start, max_attempts)

    async def subscribe(self, topic: str, name: str, start: str = "earliest", max_attempts: int | None = None,
                        push: PushConfig | None | EllipsisType = ...) -> Group:
        """Create or update a group; `push` makes it push (a PushConfig), pull (None), or is left
        as it is (...). Answered once the settings are durable: a push URL answered 200 is still
        pushed to after a crash."""
        g = self.group(topic, name, start, max_attempts)
        assert self.groups is not None and self.pusher is not None
        if push is not ...:
            self.groups.set_push(g, push)
            self.pusher.sync()
        await self._durable()
        return g

    async def pull(self, topic: str, name: str, max_n: int, wait_ms: int, lease_ms: int,
                   tags: list[str] | None, gone: Callable[[], bool] = lambda: False) -> Taken:
        """Lease up to `max_n` due messages, waiting up to `wait_ms` for the first. `gone`
        says the client hung up: then nothing is leased (it would sit out its lease). The
        answer is made by `pulled_msgpack` or `pulled`."""
        g = self.group(topic, name)
        assert self.groups is not None
        deadline = self.clock.monotonic() + wait_ms / 1000
        while True:
            if g.push is not None:  # also when it became push during a long-poll
                raise errors.PushSubscription(f"group {name!r} of topic {topic!r} is a push subscription; "
                                              "PUT it with \"push\": null to pull from it")
            if gone() or g.deleted:
                return Taken()
            got = self.groups.take_rows(g, max_n, lease_ms, tags)
            left = deadline - self.clock.monotonic()
            if got or left <= 0 or self.state is not BrokerState.READY:
                break
            ev = self.groups.event(topic)
            ev.clear()
            wake = self.groups.next_wakeup_ms(g)
            if wake is not None:
                left = min(left, max(0.001, (wake - self.clock.now_ms()) / 1000))
            try:
                async with asyncio.timeout(left):
                    await ev.wait()
            except TimeoutError:
                pass
        return got

    def pulled_msgpack(self, taken: Taken, fields: int) -> bytes | None:
        """The msgpack answer of a pull (of the `fields` that encode_pull's mask names), made by
        the batch core from the leased rows and one read per stretch of the log; None when a
        record needs the slow path (`pulled`: a read that crossed a segment's end, or a record
        that does not check out)."""
        assert self.store is not None
        reads = self.store.dispatch.read_runs(taken.rows, PROW)
        body, problems = batch.ops.encode_pull(taken.rows, self._id_prefix.encode(), taken.tokens, reads, fields)
        return None if problems else body

    def pulled(self, topic: str, name: str, taken: Taken) -> list[tuple[Delivery, Record]]:
        """The leased messages with their records; one whose record is unreadable is
        dead-lettered instead (a damaged record would otherwise come back forever)."""
        assert self.store is not None and self.groups is not None
        got = taken.deliveries()
        out = []
        recs = self.store.read_many([(d.unit.commit_offset, d.unit.commit_size) for d in got])
        g = self.groups.groups.get(f"{topic}/{name}")
        for d, rec in zip(got, recs, strict=True):
            if isinstance(rec, Record):
                out.append((d, rec))
            elif g is not None:
                log.error("ready message %d unreadable (%s); dead-lettering it", d.unit.seq, rec)
                self.groups.dead_letter(g, d.unit.index, d.unit.seq, d.attempt, "unreadable")
        return out

    def subscription(self, topic: str, name: str) -> dict[str, Any]:
        """An existing group's settings and counts; unlike pull, looking does not create it."""
        self._require_ready()
        assert self.groups is not None
        g = self.groups.groups.get(f"{topic}/{name}")
        if g is None:
            raise errors.NotFound(f"no subscription {name!r} on topic {topic!r}")
        return {**g.settings(), **self.groups.stats(g)}

    async def delete_group(self, topic: str, name: str) -> dict[str, Any]:
        """Remove a group durably (404 when there is none, as SQS's DeleteQueue and RocketMQ's
        deleteSubGroup answer for an unknown name); a pull after this creates it afresh."""
        self._require_ready()
        assert self.groups is not None
        if not self.groups.delete(topic, name):
            raise errors.NotFound(f"no subscription {name!r} on topic {topic!r}")
        await self._durable()
        return {"topic": topic, "group": name, "deleted": True}

    async def ack_raw(self, topic: str, name: str, body: bytes | bytearray, max_receipts: int) -> int | None:
        """An ack whose msgpack body is exactly `{"receipts": [...]}` with receipts of one live
        lease (what one pull gave), read by the batch core without a Python object per receipt:
        how many were acked. None for any other body, and the caller decodes it and calls
        `settle`, which answers it (its errors and stale receipts included)."""
        parsed = batch.ops.parse_receipts_raw(body, max_receipts)
        if parsed is None:
            return None
        g = self.group(topic, name)
        assert self.groups is not None
        n = self.groups.ack_whole(g, parsed, self.groups.now_ms())
        if n:
            await self._durable()  # an acked message must not come back after a crash
        return n

    async def settle(self, op: str, topic: str, name: str, receipts: list[str],
                     delay_ms: int | None = None, lease_ms: int = 30_000) -> tuple[int, list[str]]:
        g = self.group(topic, name)
        assert self.groups is not None
        if op == "ack":
            n, stale = self.groups.ack(g, receipts)
            if n:
                await self._durable()  # an acked message must not come back after a crash
            return n, stale
        if op == "nack":
            return self.groups.nack(g, receipts, delay_ms)
        return self.groups.extend(g, receipts, lease_ms)

    def dead(self, topic: str, name: str, limit: int) -> list[tuple[int, Any, Record | None]]:
        g = self.group(topic, name)
        assert self.store is not None
        out = []
        for i, d in sorted(g.dead.items())[:limit]:
            st, off, size, _ = self.store.state(d.seq)
            try:
                rec = self.store.read_record(off, size) if off >= 0 else None
            except OutOfDescriptors:
                raise
            except StorageError:
                rec = None
            out.append((i, d, rec))
        return out

    async def redrive(self, topic: str, name: str, ids: list[str] | None) -> int:
        g = self.group(topic, name)
        assert self.groups is not None
        seqs = None
        if ids is not None:
            seqs = set()
            for i in ids:
                try:
                    seqs.add(self.parse_id(i))
                except errors.NotFound:
                    continue
        n = self.groups.redrive(g, seqs)
        if n:
            await self._durable()
        return n

    def _log_group_event(self, topic: str, group: str, ev: dict[str, Any]) -> None:
        assert self.store is not None and self.pipeline is not None
        self.store.append_group_event(topic, group, encode_event(ev))
        self.pipeline.appended.set()

    # ---------------------------------------------------------------------------------- release
    def _on_release(self, released: Released, now: int) -> None:
        """A release batch: wake the topics' consumers and push workers, keep the lateness
        sample (the units' release time minus their due time, computed by the batch core)."""
        assert self.groups is not None
        sample = self.lateness
        for topic, _first, units in released.batches:
            chunk = batch.ops.lateness(units[-READY_UNIT * LATENESS_SAMPLE:], READY_UNIT, UNIT_DELIVER_AT, now)
            sample.append(chunk)
            self._lateness_n += len(chunk) // 8
            while self._lateness_n - len(sample[0]) // 8 >= LATENESS_SAMPLE:
                self._lateness_n -= len(sample.popleft()) // 8
            self.groups.notify(topic)
        for listener in self.listeners:
            listener.on_release(released, now)

    def _on_durable(self, _end: int) -> None:
        # A replicated primary indexes up to its watermark, which this fsync may have moved (the
        # followers' acks can come first): enqueue-get looks again.
        if self.repl is not None and self.pipeline is not None:
            self.pipeline.appended.set()

    def _on_fsync(self, seconds: float) -> None:
        for listener in self.fsync_listeners:
            listener(seconds)

    def _on_push(self, topic: str, group: str, outcome: PushOutcome, seconds: float) -> None:
        for listener in self.listeners:
            listener.on_push(topic, group, outcome, seconds)

    # ---------------------------------------------------------------------------------- observe
    def lateness_summary(self) -> dict[str, int]:
        xs = sorted(array("q", b"".join(self.lateness))[-LATENESS_SAMPLE:])
        if not xs:
            return {"p50": 0, "p99": 0, "max": 0}
        return {"p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))], "max": xs[-1]}

    def stats(self) -> dict[str, Any]:
        store = self._require_ready()
        assert self.groups is not None and self.pipeline is not None
        return {
            "node_id": self.node_id,
            "scheduled": store.scheduled,
            "produced_total": store.totals["produced"],
            "delivered_total": store.totals["delivered"],
            "cancelled_total": store.totals["cancelled"],
            "rolled_total": store.totals["rolled"],
            "lateness_ms": self.lateness_summary(),
            "topics": {t: {"scheduled": c["scheduled"], "delivered_total": c["delivered_total"],
                           "produced_total": c["produced_total"], "cancelled_total": c["cancelled_total"]}
                       for t, c in store.topic_counts.items()},
            "groups": {g.key: self.groups.stats(g) for g in self.groups.groups.values()},
            "pipeline": self.pipeline.depths(),
            "pipeline_state": self.pipeline.states(),
            "disk_bytes": store.disk_bytes(),
            "recovery_seconds": round(self.recovery_seconds, 3),
            "wall_clock_skew_ms": self.clock.wall_skew_ms(),
        }

    def schedule(self, start: int, end: int, step: int) -> list[list[int]]:
        return self._require_ready().schedule_buckets(start, end, step)

    async def browse(self, query: Query) -> tuple[Page, list[Record | StorageError]]:
        """One page of pending messages in due order (storage.browse) and their records. Waits
        (up to LIST_CATCH_UP_S) for indexing to reach what was produced before the call, so a
        message whose produce was answered is listed; the event loop runs while a big slot is
        walked."""
        store = self._require_ready()
        assert self.pipeline is not None
        target = store.commit.end
        deadline = self.clock.monotonic() + LIST_CATCH_UP_S
        while store.indexed < target and self.clock.monotonic() < deadline:
            await asyncio.sleep(0.005)
        steps = store.browse(query, self.pipeline.inflight.read_time())
        while True:
            self._require_ready()  # shutdown closes the files between steps
            try:
                next(steps)
            except StopIteration as done:
                page: Page = done.value
                break
            await asyncio.sleep(0)
        return page, store.read_many([(i.commit_offset, i.commit_size) for i in page.items])
