"""The store: every on-disk structure of one data directory, and recovery.

Directory layout::

    LOCK                  flock: one daemon per data directory
    commitlog/<20 digits> the commit log (storage.commitlog) — the source of truth
    timerlog/<20 digits>  TimerLog units (storage.timerlog)
    timerwheel            the TimerWheel (storage.timerwheel)
    msgtable/<20 digits>  per-message state (storage.msgtable)
    ready/<topic>/<20 d.> ready queues (storage.readyqueue)
    checkpoint            storage.checkpoint

The broker's five stages call the synchronous methods here; nothing blocks for long.

Crash consistency in one paragraph: the checkpoint records (C) the commit-log offset below
which everything is indexed, (T) the TimerLog end at that moment, (R) the wheel time below
which everything is dispatched, and each ready queue's end. Recovery cuts a torn commit-log
tail, unlinks TimerLog units at or after T from the wheel and truncates the TimerLog to T,
marks as delivered what the ready queues hold past the checkpoint, and then re-indexes the
commit log from C — the same code path as normal operation. The message table makes every
step idempotent: a unit whose record is no longer the message's current one (it rolled), or
whose message is delivered or cancelled, is dropped at dispatch.
"""

from __future__ import annotations

import collections
import fcntl
import itertools
import logging
import os
import time
import zlib
from array import array
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delayd.storage import checkpoint as ckpt
from delayd.storage import farindex, recovery, retention
from delayd.storage.browse import Browser, Page, Query
from delayd.storage.commitlog import (
    CommitLog,
    Record,
    RecordFlag,
    RecordType,
    decode,
    encode,
    encode_messages,
)
from delayd.storage.errors import CorruptData, StorageError
from delayd.storage.msgtable import MessageState, MessageTable
from delayd.storage.readyqueue import ReadyQueue, tag_hash
from delayd.storage.recovery import RecoveryReport
from delayd.storage.segments import fsync_all
from delayd.storage.timerindex import Entry, TimerIndex
from delayd.storage.timerlog import Unit, UnitMagic

log = logging.getLogger("delayd.storage")

HOUR_MS = 3_600_000

# msgtable flag bits: where the message's current unit is counted in the schedule.
FLAG_SLOT = 1  # counted in the per-slot array (a DEFAULT unit in the window)
FLAG_FAR = 2  # counted in the hourly far-future map (parked in a ROLL unit)
BLOCKED = object()  # index(): the next unit would overwrite an undispatched wheel lap
READ_SPAN = 1 << 20  # resolve_many reads at most this much of the log at once
READ_GAP = 64 * 1024  # and bridges gaps up to this between records it needs
# Plain-int and module-level aliases for the per-message hot path (enum attribute lookups and
# IntFlag arithmetic cost more than the rest of the work there).
_MESSAGE, _ROLL, _CANCEL, _GROUP = RecordType.MESSAGE, RecordType.ROLL, RecordType.CANCEL, RecordType.GROUP
_SCHEDULED, _DELIVERED, _CANCELLED = MessageState.SCHEDULED, MessageState.DELIVERED, MessageState.CANCELLED
_DEFAULT_BIT, _ROLL_BIT = int(UnitMagic.DEFAULT), int(UnitMagic.ROLL)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    precision_ms: int = 1000
    roll_window_ms: int = 2 * 86_400_000
    lookahead_ms: int = 300  # how far ahead of the clock dequeue-get loads slots
    commit_segment_bytes: int = 64 * 1024 * 1024
    timerlog_segment_units: int = 1 << 20
    ready_segment_units: int = 1 << 18
    msgtable_segment_entries: int = 1 << 20

    @property
    def slot_count(self) -> int:
        # Twice the window plus margin: a lap is read long before the next one is written.
        return 2 * self.roll_window_ms // self.precision_ms + 64


@dataclass(slots=True)
class NewMessage:
    topic: str
    body: bytes
    deliver_at: int
    tag: str | None = None
    key: str | None = None
    headers: dict[str, str] | None = None


@dataclass(slots=True)
class Due:
    """A message leaving the timer: released into its topic's ready queue at `deliver_at`."""
    deliver_at: int
    seq: int
    topic: str
    commit_offset: int
    commit_size: int
    tag_hash: int
    slot_time: int
    key: str | None = None


class Store:
    def __init__(self, data_dir: Path, config: StoreConfig | None = None,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.dir = Path(data_dir)
        self.cfg = config or StoreConfig()
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(self._lock_fd)
            raise StorageError(f"{self.dir} is in use by another process") from e
        self.commit = CommitLog(self.dir / "commitlog", self.cfg.commit_segment_bytes)
        self._msgtable_existed = (self.dir / "msgtable").is_dir()  # recover() checks it against the checkpoint
        self.msgs = MessageTable(self.dir / "msgtable", self.cfg.msgtable_segment_entries)
        self.keys_rebuilt = False  # the key index was unusable and starts empty
        self.keys = recovery.open_keys(self)
        self.far, self.far_rebuild = farindex.open_far(self.dir)  # recover() rebuilds or replays it
        self._far_ops: tuple[list[Any], int] = ([], 0)  # far-index writes riding the checkpoint
        self._browser: Browser | None = None
        self.timers: TimerIndex  # opened by recover()
        self.ready: dict[str, ReadyQueue] = {}
        for p in sorted((self.dir / "ready").glob("*")) if (self.dir / "ready").exists() else []:
            self.ready[p.name] = ReadyQueue(p, self.cfg.ready_segment_units)
        self.next_seq = 1
        self.indexed = 0  # C: commit-log offset fully indexed
        self.durable_indexed = 0  # C as of the last checkpoint written
        self.indexed_at: dict[int, int] = {}  # commit segment base -> time a checkpoint covered it
        self._msgtable_pins: dict[int, int] = {}  # msgtable segment -> a pending seq that pins it
        self._key_ops: tuple[list[Any], int] = ([], 0)  # key-index writes riding the checkpoint
        self.read_time_ms = 0  # R as of the last checkpoint (lap safety uses the durable one)
        self.load_time_ms = 0  # D: next slot dequeue-get will load
        self.slot_counts = array("i", bytes(4 * self.cfg.slot_count))
        self.far_counts: dict[int, int] = {}
        self.topic_counts: dict[str, dict[str, int]] = {}
        self.totals = {"produced": 0, "delivered": 0, "cancelled": 0, "rolled": 0}
        self.groups_snapshot: dict[str, Any] = {}
        self.topic_names: dict[int, str] = {}
        self._topic_hashes: dict[str, int] = {}  # memo of _topic_hash
        self._slot_count = self.cfg.slot_count  # a computed property of the config
        self._full = False  # a full rescan: each message's current record counts as first indexed
        self.late: list[Due] = []  # indexed into a slot already loaded: dequeue-put takes them directly

    # ---------------------------------------------------------------------------------- recovery
    def recover(self) -> RecoveryReport:
        """Bring every derived structure up to the commit log (see storage.recovery)."""
        return recovery.recover(self)

    def retain(self, now_ms: int, retention_ms: int, needed: dict[str, int]) -> dict[str, int]:
        """Delete the segments nothing needs any more (see storage.retention)."""
        return retention.retain(self, now_ms, retention_ms, needed)

    # ---------------------------------------------------------------------------------- produce
    def append_messages(self, msgs: list[NewMessage], now_ms: int,
                        cancels: list[tuple[int, str, str | None]] = ()) -> list[int]:  # type: ignore[assignment]
        """Append messages (not yet durable: call flush) and return their sequence numbers.

        `cancels` (seq, topic, key) are cancelled in the same atomic write: a replace by key
        either happens whole or not at all, also across a crash.
        """
        first = self.next_seq
        recs = [encode(Record(RecordType.CANCEL, seq, topic, key=key, produced_at=now_ms), RecordFlag.CONTINUED)
                for seq, topic, key in cancels]
        n = len(msgs)
        recs += encode_messages(msgs, first, now_ms)
        offsets = self.commit.append(recs)[len(cancels):]
        self.next_seq = first + n
        for seq, topic, key in cancels:
            self._cancelled(seq, topic, key)
        self.msgs.set_run(first, [(MessageState.SCHEDULED, off, len(r), 0)
                                  for off, r in zip(offsets, recs[len(cancels):], strict=True)])
        keyed = [(m.topic, m.key, first + i, m.deliver_at) for i, m in enumerate(msgs) if m.key is not None]
        if keyed:
            self.keys.put_many(keyed)
        for topic, k in collections.Counter(m.topic for m in msgs).items():
            self._count(topic, "produced_total", k)
            self._count(topic, "scheduled", k)
        self.totals["produced"] += len(msgs)
        return list(range(first, first + len(msgs)))

    def append_cancel(self, seq: int, topic: str, key: str | None = None) -> None:
        """Log the cancel, then mark the message cancelled (dispatch checks the mark). If the
        append fails (disk full) nothing changed."""
        self.commit.append([encode(Record(RecordType.CANCEL, seq, topic, key=key, produced_at=self.clock_ms()))])
        self._cancelled(seq, topic, key)

    def _cancelled(self, seq: int, topic: str, key: str | None) -> None:
        self.msgs.set_state(seq, MessageState.CANCELLED)
        if key is not None:
            self.keys.release(topic, key, seq)
        self._count(topic, "cancelled_total", 1)
        self._count(topic, "scheduled", -1)
        self.totals["cancelled"] += 1

    def append_group_event(self, topic: str, group: str, body: bytes) -> None:
        self.commit.append([encode(Record(RecordType.GROUP, 0, topic, body, key=group,
                                          produced_at=self.clock_ms()))])

    def flush_commit(self) -> None:
        self.commit.flush()

    def commit_handles(self) -> list[int]:
        """fds to fsync (with storage.segments.fsync_all, possibly in a thread) to make every
        append so far durable: the broker's group commit."""
        return self.commit.files.dirty_handles()

    def state(self, seq: int) -> tuple[MessageState, int, int, int]:
        return self.msgs.get(seq)

    def read_record(self, offset: int, size: int = 0) -> Record:
        return self.commit.read(offset, size)

    # ---------------------------------------------------------------------------------- enqueue
    def read_records(self, pos: int, max_records: int) -> tuple[list[Record], int]:
        """enqueue-get: up to `max_records` records from `pos`, and the position after them."""
        out: list[Record] = []
        for rec in self.commit.scan(pos, verify=False):
            out.append(rec)
            if len(out) >= max_records:
                break
        if out:
            pos = out[-1].offset + out[-1].size
        return out, pos

    def index(self, records: list[Record], now_ms: int) -> int:
        """enqueue-put: index records in log order. Returns how many were consumed; stops early
        (returning fewer) when a unit would overwrite a wheel lap not yet dispatched."""
        entries: list[Entry] = []
        done = 0
        msgs = self.msgs
        # The batch's message-table entries are read (and written back) a run at a time.
        msgs.begin_batch([rec.seq for rec in records if rec.type != _GROUP])
        try:
            entry_for, get, set_flags, hashes = self._entry_for, msgs.get, msgs.set_flags, self._topic_hashes
            # Fixed for the whole batch (nothing below moves them): hoisted for the fast path.
            d = self.load_time_ms
            window_end = max(now_ms, d) + self.cfg.roll_window_ms
            unsafe_from = self.read_time_ms + self.timers.wheel.span_ms  # fire >= this: BLOCKED
            precision, nslots, counts = self.cfg.precision_ms, self._slot_count, self.slot_counts
            fast = not self._full
            for rec in records:
                rtype = rec.type
                if fast and rtype == _MESSAGE:
                    # The common case, exactly as _entry_for decides it: a scheduled message due
                    # inside the window, in a slot not loaded yet. Anything else goes the long way.
                    deliver_at = rec.deliver_at
                    if d <= deliver_at <= window_end and deliver_at < unsafe_from:
                        st, off, _size, _roll = get(rec.seq)
                        if st == _SCHEDULED and off == rec.offset:
                            th = hashes.get(rec.topic)
                            if th is None:
                                th = self._topic_hash(rec.topic)
                            counts[deliver_at // precision % nslots] += 1
                            set_flags(rec.seq, FLAG_SLOT)
                            entries.append(Entry(deliver_at, _DEFAULT_BIT, off, rec.size, th, rec.seq))
                            done += 1
                            continue
                if rtype == _MESSAGE or rtype == _ROLL:
                    entry = entry_for(rec, now_ms)
                    if entry is BLOCKED:
                        break
                    if entry is not None:
                        entries.append(entry)  # type: ignore[arg-type]
                elif rtype == _CANCEL:
                    self._on_cancel_record(rec)
                done += 1
        finally:
            self.msgs.end_batch()
        if entries:
            self.timers.add(entries, now_ms)
        if done:
            last = records[done - 1]
            self.indexed = max(self.indexed, last.offset + last.size)
        return done

    def _entry_for(self, rec: Record, now_ms: int) -> Entry | object | None:
        """The unit to write for a message record; None to skip it, BLOCKED to stop the batch.
        (Runs once per message: locals and plain ints on purpose.)"""
        seq = rec.seq
        msgs = self.msgs
        st, off, size, roll = msgs.get(seq)
        th = self._topic_hashes.get(rec.topic)
        if th is None:
            th = self._topic_hash(rec.topic)
        is_message = rec.type == _MESSAGE
        first = is_message or self._full
        if self._full:
            if st != _SCHEDULED or off != rec.offset:
                return None
            self._count(rec.topic, "scheduled", 1)
        elif is_message:
            if st == _CANCELLED:
                msgs.set_flags(seq, 0)  # never in the schedule (see module notes)
                return None
            if st == _DELIVERED or off != rec.offset:
                return None
        else:  # a roll copy: current only if the table points at it (or is about to)
            if st != _SCHEDULED:
                return None
            if off != rec.offset:
                if rec.roll_count < roll:
                    return None
                msgs.set(seq, _SCHEDULED, rec.offset, rec.size, rec.roll_count)
        d = self.load_time_ms
        base = now_ms if now_ms > d else d  # never roll into a slot that is already behind the reader
        window = self.cfg.roll_window_ms
        deliver_at = rec.deliver_at
        if deliver_at > base + window:
            remain = deliver_at - base - window
            fire = base + (window // 2 if remain < window // 3 else window)
            magic = _ROLL_BIT
        else:
            fire = deliver_at
            magic = _DEFAULT_BIT
        if fire < d:
            fire = d
        if fire - self.timers.wheel.span_ms >= self.read_time_ms:  # not timers.safe_to_write()
            return BLOCKED
        if magic == _ROLL_BIT:
            if first:
                self._far_add(deliver_at, 1)
                self.far.put(deliver_at, seq, th)
            msgs.set_flags(seq, FLAG_FAR)
        else:
            if not first:
                self._far_add(deliver_at, -1)
                self.far.remove(deliver_at, seq)
            if deliver_at >= d:
                self.slot_counts[deliver_at // self.cfg.precision_ms % self._slot_count] += 1
                msgs.set_flags(seq, FLAG_SLOT)
            else:
                # Its slot was already loaded: the unit goes into the next slot (the durable path),
                # and the message also goes straight to dequeue-put so it is not a slot late.
                msgs.set_flags(seq, 0)
                self.late.append(Due(rec.deliver_at, rec.seq, rec.topic, rec.offset, rec.size,
                                     tag_hash(rec.tag), self.timers.wheel.slot_time(fire), rec.key))
        return Entry(fire, magic, rec.offset, rec.size, th, rec.seq)

    def _on_cancel_record(self, rec: Record) -> None:
        flags = self._flags(rec.seq)
        if flags & FLAG_FAR:
            st, off, size, roll = self.msgs.get(rec.seq)
            try:
                deliver_at = self.commit.read(off, size).deliver_at
                self._far_add(deliver_at, -1)
                self.far.remove(deliver_at, rec.seq)
            except (StorageError, CorruptData):
                pass
        elif flags & FLAG_SLOT:
            st, off, size, roll = self.msgs.get(rec.seq)
            try:
                target = self.commit.read(off, size).deliver_at
            except (StorageError, CorruptData):
                target = -1
            if target >= self.load_time_ms:
                i = self._slot_index(target)
                self.slot_counts[i] = max(0, self.slot_counts[i] - 1)
                # RIP-43's cancel marker; dispatch also checks the table, which is what makes
                # a cancel that races the slot still win.
                self.timers.add([Entry(target, UnitMagic.DELETE, off, size, self._topic_hash(rec.topic),
                                       rec.seq)], self.clock_ms())

    def _flags(self, seq: int) -> int:
        return self.msgs.flags(seq)

    def _set_flags(self, seq: int, flags: int) -> None:
        self.msgs.set_flags(seq, flags)

    def _far_add(self, deliver_at: int, n: int) -> None:
        h = deliver_at // HOUR_MS
        v = self.far_counts.get(h, 0) + n
        if v > 0:
            self.far_counts[h] = v
        else:
            self.far_counts.pop(h, None)

    def _slot_index(self, t: int) -> int:
        return t // self.cfg.precision_ms % self.cfg.slot_count

    def _topic_hash(self, topic: str) -> int:
        h = self._topic_hashes.get(topic)
        if h is None:
            h = self._topic_hashes[topic] = zlib.crc32(topic.encode())
            self.topic_names.setdefault(h, topic)
        return h

    def _count(self, topic: str, name: str, n: int) -> None:
        c = self.topic_counts.get(topic)
        if c is None:
            c = self.topic_counts[topic] = {"scheduled": 0, "produced_total": 0, "delivered_total": 0,
                                            "cancelled_total": 0}
            self._topic_hash(topic)
        c[name] = c.get(name, 0) + n

    @property
    def scheduled(self) -> int:
        return sum(c["scheduled"] for c in self.topic_counts.values())

    # ---------------------------------------------------------------------------------- dequeue
    def key_holder(self, topic: str, key: str) -> tuple[int, MessageState, int, int | None] | None:
        """(seq, state, deliver_at, done_at) of the message holding `key` now, or None."""
        return self.key_holders(topic, [key]).get(key)

    def key_holders(self, topic: str, keys: list[str]) -> dict[str, tuple[int, MessageState, int, int | None]]:
        """Holders of many keys with one index query. The state comes from the message
        table, so a stale index entry cannot mislead."""
        out: dict[str, tuple[int, MessageState, int, int | None]] = {}
        for key, (seq, deliver_at, done_at) in self.keys.lookup_many(topic, keys).items():
            st = self.msgs.get(seq)[0]
            if st not in (MessageState.UNKNOWN, MessageState.CANCELLED):
                out[key] = (seq, st, deliver_at, done_at)
        return out

    def take_late(self) -> list[Due]:
        late, self.late = self.late, []
        return late

    def load_slot(self, slot_time: int) -> list[Unit]:
        """dequeue-get: take slot `slot_time` (must be the next one) out of the wheel."""
        return [u for chunk in self.open_slot(slot_time) for u in chunk]

    def open_slot(self, slot_time: int, chunk: int = 1024) -> Iterator[list[Unit]]:
        """Take slot `slot_time` (the next one) out of the wheel and walk it in chunks.

        The slot counts as loaded at once: later units for it go to the next slot. Its chain
        as of now is walked lazily, so a large slot does not hold the event loop.
        """
        self.slot_counts[self._slot_index(slot_time)] = 0
        self.load_time_ms = slot_time + self.cfg.precision_ms
        return self._walk(slot_time, chunk)

    def _walk(self, slot_time: int, chunk: int) -> Iterator[list[Unit]]:
        out: list[Unit] = []
        passed: set[int] = set()
        try:
            for u in self.timers.walk(slot_time):
                out.append(u)
                if len(out) >= chunk:
                    passed.update(x.pos for x in out)
                    yield out
                    out = []
        except CorruptData as e:
            # A chain that does not hold together: the TimerLog is the truth, rebuild from it
            # and walk the slot again, skipping units already passed on.
            log.error("TimerWheel slot %d damaged (%s); rebuilding the wheel from the TimerLog", slot_time, e)
            # From the durable read time, not `slot_time`: slots loaded since the checkpoint may
            # still be in flight and are walked again if we crash before the next checkpoint.
            recovery.rebuild_wheel(self)
            out = [u for u in self.timers.walk(slot_time) if u.pos not in passed]
        if out:
            yield out

    def resolve(self, unit: Unit, slot_time: int) -> Due | Record | None:
        """dequeue-get-message for one unit: a Due to release, a Record to roll forward, or None
        (cancelled, already delivered, or a stale unit of a message that rolled since)."""
        r = self.resolve_many([unit], slot_time)[0]
        if isinstance(r, CorruptData):
            raise r
        return r

    def resolve_many(self, units: list[Unit], slot_time: int) -> list[Due | Record | CorruptData | None]:
        """`resolve` for a chunk of one slot: the message-table entries with one read per run
        of ids and the records with one read per stretch of the log (a burst of one second
        is a few long runs, not a million small reads). A record that does not decode comes
        back as its CorruptData, so one damaged message does not stop the others."""
        msgs = self.msgs
        msgs.begin_batch(u.seq for u in units)
        try:
            states = [msgs.get(u.seq) for u in units]
        finally:
            msgs.end_batch()
        out: list[Due | Record | CorruptData | None] = [None] * len(units)
        live = [i for i, (u, st) in enumerate(zip(units, states, strict=True))
                if st[0] == MessageState.SCHEDULED and st[1] == u.commit_offset]
        recs = self.read_many([(states[i][1], states[i][2]) for i in live])
        for i, rec in zip(live, recs, strict=True):
            if isinstance(rec, StorageError):
                out[i] = rec if isinstance(rec, CorruptData) else CorruptData(str(rec))
            elif units[i].magic & UnitMagic.ROLL:
                out[i] = rec
            else:
                out[i] = Due(rec.deliver_at, rec.seq, rec.topic, rec.offset, rec.size, tag_hash(rec.tag),
                             slot_time, rec.key)
        return out

    def read_many(self, locations: list[tuple[int, int]]) -> list[Record | StorageError]:
        """The records at (offset, size) locations, in the order asked, with one read per
        stretch of the log rather than one per record. A record that does not decode comes
        back as its error (CorruptData, or OffsetOutOfRange for a deleted segment), so one
        unreadable message does not fail the others."""
        out: list[Record | StorageError | None] = [None] * len(locations)
        order = sorted(range(len(locations)), key=lambda i: locations[i][0])
        j = 0
        while j < len(order):
            start = locations[order[j]][0]
            k = j + 1
            while k < len(order):
                off, size = locations[order[k]]
                prev_off, prev_size = locations[order[k - 1]]
                if off + size - start > READ_SPAN or off - (prev_off + prev_size) > READ_GAP:
                    break
                k += 1
            last_off, last_size = locations[order[k - 1]]
            end = max(last_off + last_size, start)
            try:
                buf = self.commit.files.read(start, end - start) if self._one_segment(start, end) else None
            except StorageError:
                buf = None
            for i in order[j:k]:
                off, size = locations[i]
                try:
                    out[i] = decode(buf, off - start, off) if buf is not None and len(buf) >= end - start \
                        else self.commit.read(off, size)
                except StorageError as e:
                    out[i] = e
            j = k
        return out  # type: ignore[return-value]

    def _one_segment(self, start: int, end: int) -> bool:
        base = self.commit.files.segment_of(start)
        return end <= self.commit.files.segment_end(base)

    def roll_forward(self, rec: Record) -> None:
        """Re-append a far message so the old segment is not pinned; enqueue indexes the copy."""
        rec.type = RecordType.ROLL
        rec.roll_count += 1
        self.commit.append([encode(rec)])
        self.totals["rolled"] += 1

    def release(self, items: list[Due], now_ms: int) -> list[Due]:
        """dequeue-put: make due messages visible. Checks the state once more, so a cancel that
        arrived while the message was in the pipeline still wins. Returns what was released."""
        self.msgs.begin_batch(d.seq for d in items)
        try:
            return self._release(items, now_ms)
        finally:
            self.msgs.end_batch()

    def _release(self, items: list[Due], now_ms: int) -> list[Due]:
        by_topic: dict[str, list[Due]] = {}
        seen: set[int] = set()
        for d in items:
            # One message can come twice in a batch: straight from enqueue-put (its slot had
            # passed) and from the slot it was also written to. The state check covers earlier
            # batches; `seen` covers this one.
            if d.seq in seen:
                continue
            st, off, _s, _r = self.msgs.get(d.seq)
            if st == MessageState.SCHEDULED and off == d.commit_offset:
                seen.add(d.seq)
                by_topic.setdefault(d.topic, []).append(d)
        out = []
        for topic, ds in by_topic.items():
            q = self.queue(topic)
            q.append([(d.commit_offset, d.commit_size, d.tag_hash, d.deliver_at, now_ms, d.seq) for d in ds])
            keyed = []
            for d in ds:
                self.msgs.set_state(d.seq, MessageState.DELIVERED)
                if d.key is not None:
                    keyed.append((now_ms, topic, d.key, d.seq))
            if keyed:
                self.keys.delivered(keyed)
            self._count(topic, "scheduled", -len(ds))
            self._count(topic, "delivered_total", len(ds))
            self.totals["delivered"] += len(ds)
            out.extend(ds)
        return out

    def queue(self, topic: str) -> ReadyQueue:
        q = self.ready.get(topic)
        if q is None:
            q = self.ready[topic] = ReadyQueue(self.dir / "ready" / topic, self.cfg.ready_segment_units)
        return q

    # ---------------------------------------------------------------------------------- schedule
    def schedule(self, start: int, end: int, step: int) -> list[list[int]]:
        """Pending messages per [t, t+step) bucket: per slot inside the wheel, per hour beyond
        it (far messages are counted by the hour of their due time). A slot or hour that
        straddles `start` counts in the first bucket: nothing pending in range is left out."""
        n = (end - start + step - 1) // step
        buckets = [[start + i * step, 0] for i in range(n)]
        p, count = self.cfg.precision_ms, self.cfg.slot_count
        lo = max(start, self.load_time_ms)
        lo -= lo % p
        hi = min(end, self.load_time_ms + self.timers.wheel.span_ms)
        if hi > lo:
            first, slots = lo // p % count, (hi - lo + p - 1) // p
            counts = self.slot_counts
            # Two array slices cover the range (it may wrap); compress() finds the non-empty
            # slots in C, so a wide range costs what its pending slots cost.
            parts = [(0, first, min(count, first + slots))]
            if first + slots > count:
                parts.append((count - first, 0, first + slots - count))
            for offset, a, b in parts:
                chunk = counts[a:b]
                for i in itertools.compress(range(len(chunk)), chunk):
                    t = lo + (offset + i) * p
                    buckets[(max(t, start) - start) // step][1] += chunk[i]
        for h, c in self.far_counts.items():
            t = max(h * HOUR_MS, start)
            if t < end and t < (h + 1) * HOUR_MS:
                buckets[(t - start) // step][1] += c
        return buckets

    # ---------------------------------------------------------------------------------- browse
    def browse(self, query: Query, near_from_ms: int) -> Generator[None, None, Page]:
        """Pending messages in due order, one page (storage.browse): a generator to step, that
        yields while it walks a big slot and returns the Page. `near_from_ms` is the oldest slot
        whose units may still be in flight (the dispatcher's read time)."""
        if self._browser is None:
            self._browser = Browser(self.timers.wheel, self.timers.log, self.msgs, self.far, self.read_many,
                                    lambda: (self.load_time_ms, self.slot_counts),
                                    far_flag=FLAG_FAR, slot_flag=FLAG_SLOT)
        return self._browser.page(query, near_from_ms)

    # ---------------------------------------------------------------------------------- checkpoint
    def checkpoint(self, read_time_ms: int, groups: dict[str, Any]) -> None:
        """Flush every derived structure, then record how far each is complete."""
        cp, fds = self.prepare_checkpoint(read_time_ms, groups)
        self.finish_checkpoint(cp, fds)
        self.checkpoint_saved(cp)

    def prepare_checkpoint(self, read_time_ms: int, groups: dict[str, Any]) -> tuple[ckpt.Checkpoint, list[int]]:
        """Snapshot positions and counters (consistent: nothing runs in between) and collect
        the fds that must reach the disk before the snapshot may be written."""
        fds = self.commit.files.dirty_handles() + self.timers.log.files.dirty_handles()
        fds += self.msgs.dirty_handles()
        for q in self.ready.values():
            fds += q.files.dirty_handles()
        fds.append(self.timers.wheel.dup_fd())  # fsync of the file also writes its mmap'd pages
        self._key_ops = (self.keys.take_ops(), self.commit.end)
        self._far_ops = (self.far.take_ops(), self.indexed)
        cp = ckpt.Checkpoint(
            commit_indexed=self.indexed, commit_end=self.commit.end, timerlog_end=self.timers.log.end,
            read_time_ms=read_time_ms, next_seq=self.next_seq,
            ready_ends={t: q.end for t, q in self.ready.items()},
            counters={"totals": dict(self.totals), "topics": {t: dict(c) for t, c in self.topic_counts.items()}},
            schedule=zlib.compress(self.slot_counts.tobytes(), 1), far_schedule=dict(self.far_counts),
            groups=groups, created_ms=self.clock_ms(), indexed_at=dict(self.indexed_at))
        return cp, fds

    def finish_checkpoint(self, cp: ckpt.Checkpoint, fds: list[int]) -> None:
        """Write the queued key-index changes, fsync, then write the checkpoint. Touches no
        state the event loop uses: safe in a worker thread."""
        ops, pos = self._key_ops
        self.keys.apply(ops, pos)
        self.far.apply(*self._far_ops)
        fsync_all(fds)
        ckpt.save(self.dir / "checkpoint", cp)

    def checkpoint_failed(self) -> None:
        """The checkpoint was not written: what it was to make durable is fsynced next time
        (every file it collected is dirty again) and its key-index changes are requeued."""
        ops, _pos = self._key_ops
        self.keys.requeue(ops)
        self._key_ops = ([], 0)
        self.far.requeue(self._far_ops[0])
        self._far_ops = ([], 0)
        for files in (self.commit.files, self.timers.log.files, *(q.files for q in self.ready.values())):
            files.mark_all_dirty()
        self.msgs.mark_all_dirty()

    def drop_unreadable(self, unit: Unit) -> None:
        """A unit whose record no longer decodes (disk damage): that one message is lost. It
        leaves the schedule as cancelled, so counts stay true and a GET tells it is gone."""
        st = self.msgs.get(unit.seq)[0]
        if st == MessageState.SCHEDULED:
            self.msgs.set_state(unit.seq, MessageState.CANCELLED)
            topic = self.topic_names.get(unit.topic_hash)
            if topic is not None:
                self._count(topic, "scheduled", -1)
            self.totals["unreadable"] = self.totals.get("unreadable", 0) + 1

    def checkpoint_saved(self, cp: ckpt.Checkpoint) -> None:
        self.keys.applied()
        self.far.applied()
        self.read_time_ms = cp.read_time_ms
        self.durable_indexed = cp.commit_indexed
        for base in self.commit.files.bases:
            if base not in self.indexed_at and self.commit.files.segment_end(base) <= cp.commit_indexed \
                    and base != self.commit.files.bases[-1]:
                self.indexed_at[base] = cp.created_ms

    # ---------------------------------------------------------------------------------- retention
    def disk_bytes(self) -> int:
        total = self.commit.disk_bytes() + self.timers.log.files.disk_bytes() + self.msgs.disk_bytes()
        total += sum(q.disk_bytes() for q in self.ready.values())
        for name in ("timerwheel", "checkpoint"):
            p = self.dir / name
            if p.exists():
                total += p.stat().st_size
        return total

    def close(self) -> None:
        self.commit.close()
        if hasattr(self, "timers"):
            self.timers.close()
        self.msgs.close()
        self.keys.commit(self.commit.end)
        self.keys.close()
        self.far.commit(self.indexed)
        self.far.close()
        for q in self.ready.values():
            q.close()
        os.close(self._lock_fd)
