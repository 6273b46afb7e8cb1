"""Browse pending messages in due order (deliver_at, then seq), a page at a time.

Two sources, merged by (deliver_at, seq):

* inside the roll window, the TimerWheel and its TimerLog chains: slot by slot from the
  timer's read position, skipping empty slots with the store's per-slot counts;
* beyond it, the far-future index (storage.farindex), a B-tree in due order.

Nothing here scans the commit log: a page reads the units and rows it lists (or skips) plus
one commit-log record per listed message, which the caller reads. Every candidate is checked
against the message table, so a page lists only messages pending when it was built, whatever
the units and rows still say (a cancelled or delivered message's unit stays in its chain).

The order of one slot. A chain runs newest-first through `prev_pos`, in indexing order, not
due order; a slot is 1 s wide by default. So a page that starts inside a slot must see the
whole chain of that slot once to sort it. A slot of at most CACHE_MIN_UNITS units is simply
walked and sorted on each page (a few hundred microseconds); a bigger one (a burst: a million
messages due in the same second) is walked once into a `SlotView` — sorted runs of packed
keys, 12 bytes per unit — kept in a small LRU (CACHE_MAX_UNITS units in all; the slot being
browsed is always kept, however big), and extended by the units added since. The first page
that reaches a 1M-unit slot therefore walks 1M units (about a second, in steps between which
the caller yields to the event loop); every later page through it costs O(page + log n).

Messages due before their own slot. A message indexed when its slot had already been loaded
(due now, or overdue after a restart) gets a unit in the next slot to load, `load_time`, with
that slot's start as its fire time (see Store._entry_for). Such units only ever sit in slots
at or before `load_time`: those "near" slots (from the oldest slot still in flight up to
`load_time`) are merged as one group, and their units that fire exactly at the slot start are
checked against the message table (its flags tell a late unit from one due at that very ms)
and, when late, their record read for the real due time.

Bounded work per request. A page stops after examining `Query.budget` candidates even if it
has fewer than `limit` messages, and its cursor (`Page.next`) resumes after the last one
examined. This bounds a page filtered to a rare topic in a big backlog (the unit's topic hash
skips the others without reading records, but they are still walked) and a run of stale far
rows; the caller pages on until `next` is None.

Cursors are positions, not snapshots: keys are immutable and strictly increasing from page to
page, so no message is listed twice, and one pending throughout is listed exactly once.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
from array import array
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

from delayd.storage.commitlog import Record
from delayd.storage.errors import StorageError
from delayd.storage.farindex import FarIndex
from delayd.storage.msgtable import MessageState, MessageTable
from delayd.storage.timerlog import NO_POS, UNIT, UNIT_SIZE, TimerLog, UnitMagic
from delayd.storage.timerwheel import HEADER as WHEEL_HEADER
from delayd.storage.timerwheel import SLOT, SLOT_SIZE, Slot, TimerWheel

log = logging.getLogger("delayd.storage")

SEQ_BITS = 53  # packed key = (deliver_at - slot start) << SEQ_BITS | seq; slot width <= 1000 ms < 2**10
SEQ_MASK = (1 << SEQ_BITS) - 1
TOPIC_BITS = 32  # while sorting, the topic hash rides below the key
TOPIC_MASK = (1 << TOPIC_BITS) - 1
CACHE_MIN_UNITS = 4096  # slots with fewer units are walked and sorted on every page
CACHE_MAX_UNITS = 2_000_000  # units held by cached views in all (12 bytes each)
RUN_UNITS = 65_536  # a view's sorted run: the unit of sorting (bounded transient memory)
STEP_UNITS = 16_384  # units walked or checked between two yields of a cooperative build
MIN_READ, MAX_READ = 8192, 1 << 20  # bytes of TimerLog read at once while walking a chain backwards
VALIDATE_CHUNK = 256  # candidates checked against the message table per batch
FAR_CHUNK = 512  # far-index rows fetched per query
DEFAULT_BUDGET = 20_000  # candidates examined per page at most
MAX_RETRIES = 4  # page attempts that may stop to build a big slot's view cooperatively
FAR, WHEEL = 1, 0  # candidate sources
_DEFAULT = int(UnitMagic.DEFAULT)
_SCHEDULED = MessageState.SCHEDULED
END_OF_TIME = (1 << 62) - 1
WHEEL_HEADER_SIZE = WHEEL_HEADER.size


@dataclass(frozen=True, slots=True)
class Position:
    """A place in due order: everything after (deliver_at, seq)."""
    deliver_at: int
    seq: int


@dataclass(frozen=True, slots=True)
class Query:
    start_ms: int = 0  # deliver_at >= start_ms
    end_ms: int = END_OF_TIME  # deliver_at <= end_ms
    limit: int = 100
    after: Position | None = None  # the cursor
    topic_hash: int | None = None  # one topic (crc32 of its name), or all
    budget: int = DEFAULT_BUDGET


@dataclass(frozen=True, slots=True)
class Listed:
    seq: int
    deliver_at: int
    topic_hash: int
    commit_offset: int  # the message's current record (from the message table)
    commit_size: int


@dataclass(slots=True)
class Page:
    items: list[Listed]
    next: Position | None  # None: nothing pending in range after the last item
    examined: int = 0  # candidates looked at (listed, filtered out, or no longer pending)
    walked_units: int = 0  # TimerLog units walked to build slot views for this page


@dataclass(slots=True)
class _Run:
    keys: array  # 'q', sorted packed keys
    topics: array  # 'I', topic hash of each key


@dataclass(slots=True)
class SlotView:
    """One slot's pending-capable units in due order, as of its chain ending at `last_pos`."""
    time: int
    first_pos: int
    last_pos: int
    num: int  # the wheel's unit count when built (DELETE and ROLL units included)
    runs: list[_Run] = field(default_factory=list)
    late: list[tuple[int, int, int]] = field(default_factory=list)  # sorted (deliver_at, seq, topic_hash)

    @property
    def units(self) -> int:
        return sum(len(r.keys) for r in self.runs) + len(self.late)


class _NeedBuild(Exception):
    """A page reached a big slot without a current view: build it cooperatively, then retry."""

    def __init__(self, slot_time: int, near: bool) -> None:
        super().__init__(slot_time)
        self.slot_time, self.near = slot_time, near


class _Damaged(Exception):
    """A chain does not hold together; the dispatcher repairs the wheel when it gets there."""


Candidate = tuple[int, int, int, int]  # (deliver_at, seq, topic_hash, source)


class Browser:
    """Pages of pending messages over the timer's structures. `schedule` returns the store's
    current (load_time_ms, per-slot counts); `read_many` reads commit-log records by (offset,
    size). `far_flag` / `slot_flag` are the message-table flag bits the store sets for a
    message parked far / counted in a slot."""

    def __init__(self, wheel: TimerWheel, timerlog: TimerLog, msgs: MessageTable, far: FarIndex,
                 read_many: Callable[[list[tuple[int, int]]], list[Record | StorageError]],
                 schedule: Callable[[], tuple[int, array]], *, far_flag: int, slot_flag: int,
                 cache_max_units: int = CACHE_MAX_UNITS) -> None:
        self.wheel, self.log, self.msgs, self.far = wheel, timerlog, msgs, far
        self.read_many, self.schedule = read_many, schedule
        self.far_flag, self.slot_flag = far_flag, slot_flag
        self.cache_max_units = cache_max_units
        self.precision = wheel.precision_ms
        self._cache: OrderedDict[int, SlotView] = OrderedDict()
        self._walked = 0

    # ---------------------------------------------------------------------------------- pages
    def page(self, q: Query, near_from_ms: int) -> Generator[None, None, Page]:
        """One page, as a generator: it yields between steps of building a big slot's view (the
        caller lets other work run there) and returns the Page. The page itself is built in one
        step, so it is consistent with one moment of the message table."""
        self._walked = 0
        for attempt in range(MAX_RETRIES + 1):
            try:
                page = self._page(q, near_from_ms, sync=attempt == MAX_RETRIES)
                page.walked_units = self._walked
                return page
            except _NeedBuild as nb:
                slot = self.wheel.get(nb.slot_time)
                base = self._cache.get(nb.slot_time)
                if base is not None and (base.first_pos != slot.first_pos or base.last_pos > slot.last_pos):
                    base = None
                try:
                    view = yield from self._build(slot, base, nb.near)
                except _Damaged:
                    continue  # _page skips the slot the same way
                self._keep(view)
        raise AssertionError("unreachable: the last attempt builds synchronously")

    def _page(self, q: Query, near_from_ms: int, sync: bool) -> Page:
        low = (q.start_ms, 0)
        if q.after is not None and (q.after.deliver_at, q.after.seq) > low:
            low = (q.after.deliver_at, q.after.seq)
        merged = heapq.merge(self._wheel(low, q.end_ms, near_from_ms, sync),
                             self._far(low, q.end_ms, q.topic_hash))
        out: list[Listed] = []
        chunk: list[Candidate] = []
        examined = 0
        prev: tuple[int, int] | None = None
        exhausted = True
        for cand in merged:
            d, s, th, _src = cand
            if d > q.end_ms:
                break
            if (d, s) == prev:  # the same message from both sources, or a unit written twice
                continue
            prev = (d, s)
            examined += 1
            if q.topic_hash is None or th == q.topic_hash:
                chunk.append(cand)
                if len(chunk) >= VALIDATE_CHUNK:
                    if self._validate(chunk, out, q.limit):
                        return Page(out, Position(out[-1].deliver_at, out[-1].seq), examined)
                    chunk = []
            if examined >= q.budget:
                exhausted = False
                break
        if chunk and self._validate(chunk, out, q.limit):
            return Page(out, Position(out[-1].deliver_at, out[-1].seq), examined)
        if exhausted or prev is None:
            return Page(out, None, examined)
        return Page(out, Position(*prev), examined)

    def _validate(self, chunk: list[Candidate], out: list[Listed], limit: int) -> bool:
        """Append the candidates still pending to `out` (in order) until it holds `limit`; prune
        far rows of messages no longer parked far. True once `out` is full."""
        msgs = self.msgs
        stale: list[tuple[int, int]] = []
        msgs.begin_batch(c[1] for c in chunk)
        try:
            for d, s, th, src in chunk:
                st, off, size, _roll = msgs.get(s)
                if src == FAR and (st != _SCHEDULED or not msgs.flags(s) & self.far_flag):
                    # Cancelled or delivered, or rolled inside the window since: the row has done
                    # its job. (A message that moved is still listed: its key did not change.)
                    stale.append((d, s))
                if st == _SCHEDULED:
                    out.append(Listed(s, d, th, off, size))
                    if len(out) >= limit:
                        return True
            return False
        finally:
            msgs.end_batch()
            if stale:
                self.far.prune(stale)

    # ---------------------------------------------------------------------------------- sources
    def _far(self, low: tuple[int, int], end_ms: int, topic_hash: int | None) -> Iterator[Candidate]:
        d, s = low
        while True:
            rows = self.far.after(d, s, end_ms, topic_hash, FAR_CHUNK)
            if not rows:
                return
            for rd, rs, rt in rows:
                yield rd, rs, rt, FAR
            d, s = rows[-1][0], rows[-1][1]

    def _wheel(self, low: tuple[int, int], end_ms: int, near_from_ms: int, sync: bool) -> Iterator[Candidate]:
        load, counts = self.schedule()
        p, wheel = self.precision, self.wheel
        if low[0] < load + p:
            # Slots at or before load_time may hold late units (due before the slot): merge them.
            views = []
            t = wheel.slot_time(min(near_from_ms, load))
            while t <= load:
                slot = wheel.get(t)
                if not slot.empty:
                    view = self._view(slot, True, sync)
                    if view is not None:
                        views.append(self._stream(view, low))
                t += p
            for d, s, th in heapq.merge(*views):
                yield d, s, th, WHEEL
        # Beyond load_time every unit fires at its own due ms, in its own slot: slot after slot.
        # (DEFAULT units never reach a wheel span ahead, so the counts do not alias another lap.)
        last = min(end_ms, load + wheel.span_ms - p)
        mm, nslots, cache = wheel.buffer, wheel.slot_count, self._cache
        for t in self._counted_slots(max(load + p, wheel.slot_time(low[0])), last, counts):
            st, first, last_pos, num, magic = SLOT.unpack_from(mm, WHEEL_HEADER_SIZE + t // p % nslots * SLOT_SIZE)
            if st != t or num <= 0:
                continue
            if num < CACHE_MIN_UNITS and t not in cache:
                # The common case, a slot of a few units: walked and sorted right here.
                for d, s, th in self._small(t, last_pos):
                    if d > low[0] or (d == low[0] and s > low[1]):
                        yield d, s, th, WHEEL
                continue
            view = self._view(Slot(st, first, last_pos, num, magic), False, sync)
            if view is not None:
                for d, s, th in self._stream(view, low):
                    yield d, s, th, WHEEL

    def _counted_slots(self, first: int, last: int, counts: array) -> Iterator[int]:
        """Slot times in [first, last] whose pending count is not zero, found in C a chunk of
        slots at a time (the array may wrap around)."""
        p, n = self.precision, len(counts)
        t = first
        while t <= last:
            i = t // p % n
            k = min(4096, n - i, (last - t) // p + 1)
            part = counts[i:i + k]
            for j in itertools.compress(range(k), part):
                yield t + j * p
            t += k * p

    # ---------------------------------------------------------------------------------- slot views
    def _stream(self, view: SlotView, low: tuple[int, int]) -> Iterator[tuple[int, int, int]]:
        t, p = view.time, self.precision
        its: list[Iterator[tuple[int, int, int]]] = []
        if view.late and low[0] < t:
            i = bisect.bisect_right(view.late, (low[0], low[1], 1 << 33))
            its.append(iter(view.late[i:]))
        if low[0] < t + p:
            at = 0 if low[0] < t else (low[0] - t) << SEQ_BITS | low[1]
            for run in view.runs:
                i = 0 if at == 0 else bisect.bisect_right(run.keys, at)
                if i < len(run.keys):
                    its.append(_run_items(run, i, t))
        if len(its) == 1:
            return its[0]
        return heapq.merge(*its)

    def _view(self, slot: Slot, near: bool, sync: bool) -> SlotView | None:
        """The current view of a slot; raises _NeedBuild when that means walking many units and
        the page may not do it in one step. None for a damaged chain (skipped)."""
        cached = self._cache.get(slot.time)
        base = cached if cached is not None and cached.first_pos == slot.first_pos \
            and cached.last_pos <= slot.last_pos else None
        if base is not None and base.last_pos == slot.last_pos:
            self._cache.move_to_end(slot.time)
            return base
        todo = slot.num - (base.num if base is not None else 0)
        if todo >= CACHE_MIN_UNITS and not sync:
            raise _NeedBuild(slot.time, near)
        try:
            view = _finish(self._build(slot, base, near))
        except _Damaged:
            return None
        if base is not None or view.num >= CACHE_MIN_UNITS:
            self._keep(view)
        return view

    def _keep(self, view: SlotView) -> None:
        self._cache[view.time] = view
        self._cache.move_to_end(view.time)
        total = sum(v.units for v in self._cache.values())
        while total > self.cache_max_units and len(self._cache) > 1:
            _t, old = self._cache.popitem(last=False)
            total -= old.units

    def _build(self, slot: Slot, base: SlotView | None, near: bool) -> Generator[None, None, SlotView]:
        """Walk the chain of `slot` from its newest unit back to `base.last_pos` (or its start),
        adding the DEFAULT units as sorted runs to a copy of `base`. Yields every STEP_UNITS."""
        t = slot.time
        view = SlotView(t, slot.first_pos, slot.last_pos, slot.num,
                        list(base.runs) if base else [], list(base.late) if base else [])
        stop = base.last_pos if base is not None else NO_POS
        keys: list[int] = []
        maybe_late: list[tuple[int, int]] = []  # (seq, topic_hash) of near units firing at the slot start
        n = 0
        for magic, fire, th, seq in self._chain(t, slot.last_pos, stop):
            n += 1
            if n % STEP_UNITS == 0:
                yield
            if magic != _DEFAULT:
                continue  # ROLL units are listed from the far index; DELETE markers: the state says it
            if near and fire == t:
                maybe_late.append((seq, th))
                continue
            keys.append(((fire - t) << SEQ_BITS | seq) << TOPIC_BITS | th)
            if len(keys) >= RUN_UNITS:
                view.runs.append(_make_run(keys))
                keys = []
        if keys:
            view.runs.append(_make_run(keys))
        if maybe_late:
            late = yield from self._resolve_late(maybe_late, t, view)
            if late:
                view.late = sorted(view.late + late)
        self._walked += n
        _merge_small_runs(view)
        return view

    def _resolve_late(self, units: list[tuple[int, int]], t: int, view: SlotView
                      ) -> Generator[None, None, list[tuple[int, int, int]]]:
        """Units of a near slot that fire at its start: due at that ms (the store counted them in
        the slot), or late (their record says when they were due), or no longer pending."""
        keys: list[int] = []
        late: list[tuple[int, int, int]] = []
        msgs = self.msgs
        for at in range(0, len(units), STEP_UNITS):
            part = units[at:at + STEP_UNITS]
            locations: list[tuple[int, int, int, int]] = []
            msgs.begin_batch(s for s, _th in part)
            try:
                for seq, th in part:
                    st, off, size, _roll = msgs.get(seq)
                    if st != _SCHEDULED:
                        continue  # final: it will never be listed again
                    if msgs.flags(seq) & self.slot_flag:
                        keys.append(seq << TOPIC_BITS | th)
                    else:
                        locations.append((seq, th, off, size))
            finally:
                msgs.end_batch()
            for (seq, th, _off, _size), rec in zip(locations, self.read_many([(o, z) for _s, _t, o, z in locations]),
                                                   strict=True):
                late.append((rec.deliver_at if isinstance(rec, Record) else t, seq, th))
            yield
        if keys:
            view.runs.append(_make_run(keys))
        return late

    def _small(self, slot_time: int, last_pos: int) -> list[tuple[int, int, int]]:
        """(deliver_at, seq, topic_hash) of the DEFAULT units of a small slot beyond load_time,
        sorted: `_chain` without the generator, for the slot after slot of an ordinary page."""
        files, p = self.log.files, self.precision
        start, end = files.start, files.end
        out: list[tuple[int, int, int]] = []
        pos, lo, hi, walked = last_pos, 0, 0, 0
        buf = b""
        unpack = UNIT.unpack_from
        try:
            while pos != NO_POS:
                if not lo <= pos < hi:
                    if pos < start or pos + UNIT_SIZE > end or pos % UNIT_SIZE:
                        self._damaged(slot_time, f"unit position {pos} out of range")
                    lo = max(files.segment_of(pos), pos + UNIT_SIZE - MIN_READ)
                    buf = files.read(lo, pos + UNIT_SIZE - lo)
                    hi = lo + len(buf)
                size, prev, magic, enq, delay, _off, _csize, th, seq = unpack(buf, pos - lo)
                fire = enq + delay
                if size != UNIT_SIZE or prev >= pos or fire - fire % p != slot_time:
                    self._damaged(slot_time, f"unit at {pos} does not belong to the chain")
                if magic == _DEFAULT:
                    out.append((fire, seq, th))
                pos = prev
                walked += 1
        except StorageError as e:
            self._skip(slot_time, f"{type(e).__name__}: {e}")
            return []
        except _Damaged:
            return []
        finally:
            self._walked += walked
        out.sort()
        return out

    def _chain(self, slot_time: int, last_pos: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
        """(magic, fire_time, topic_hash, seq) of the units from `last_pos` back to `stop`
        (exclusive), newest first. A burst's units sit together, so the read window doubles
        while the chain keeps landing just below it, and drops back when it jumps far."""
        files, p = self.log.files, self.precision
        pos, lo, hi, window = last_pos, 0, 0, MIN_READ
        buf = b""
        unpack = UNIT.unpack_from
        try:
            while pos != stop and pos != NO_POS:
                if not lo <= pos < hi:
                    if pos < stop or pos < files.start or pos + UNIT_SIZE > files.end or pos % UNIT_SIZE:
                        self._damaged(slot_time, f"unit position {pos} out of range")
                    window = min(MAX_READ, window * 2) if lo - window <= pos < lo else MIN_READ
                    lo = max(files.segment_of(pos), pos + UNIT_SIZE - window)
                    buf = files.read(lo, pos + UNIT_SIZE - lo)
                    hi = lo + len(buf)
                size, prev, magic, enq, delay, _off, _csize, th, seq = unpack(buf, pos - lo)
                fire = enq + delay
                if size != UNIT_SIZE or prev >= pos or fire - fire % p != slot_time:
                    self._damaged(slot_time, f"unit at {pos} does not belong to the chain")
                yield magic, fire, th, seq
                pos = prev
        except StorageError as e:
            self._damaged(slot_time, f"{type(e).__name__}: {e}")
        if pos != stop:
            self._damaged(slot_time, f"chain ended before {stop}")

    def _damaged(self, slot_time: int, why: str) -> None:
        self._skip(slot_time, why)
        raise _Damaged(why)

    def _skip(self, slot_time: int, why: str) -> None:
        self._cache.pop(slot_time, None)
        log.warning("listing skips TimerWheel slot %d: %s (the timer repairs it when the slot is due)",
                    slot_time, why)


def _make_run(packed: list[int]) -> _Run:
    packed.sort()
    return _Run(array("q", [k >> TOPIC_BITS for k in packed]), array("I", [k & TOPIC_MASK for k in packed]))


def _merge_small_runs(view: SlotView) -> None:
    """Extensions add small runs; fold the small ones together so a view never fragments."""
    small = [r for r in view.runs if len(r.keys) < CACHE_MIN_UNITS]
    if len(small) < 2:
        return
    big = [r for r in view.runs if len(r.keys) >= CACHE_MIN_UNITS]
    packed = [k << TOPIC_BITS | th for r in small for k, th in zip(r.keys, r.topics, strict=True)]
    view.runs = big + [_make_run(packed)]


def _run_items(run: _Run, i: int, t: int) -> Iterator[tuple[int, int, int]]:
    for k, th in zip(itertools.islice(run.keys, i, None), itertools.islice(run.topics, i, None), strict=True):
        yield t + (k >> SEQ_BITS), k & SEQ_MASK, th


def _finish(gen: Generator[None, None, SlotView]) -> SlotView:
    """Run a cooperative build to its end in one step."""
    while True:
        try:
            next(gen)
        except StopIteration as e:
            return e.value

