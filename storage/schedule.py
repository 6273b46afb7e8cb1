"""The schedule: how many pending messages fall due when (GET /v1/schedule).

Two histograms: per wheel slot inside the wheel's span (exact to the slot), and per hour
beyond it (messages parked in ROLL units). Each message's message-table `flags` byte says where
it is counted (`Placed`), so a cancel or a roll takes it out of the right one. The counts
change only when a unit is durably written (enqueue-put applies them after its TimerLog
append succeeded: a retried batch counts once) and when dequeue-get loads a slot.
"""

from __future__ import annotations

import enum
import itertools
import zlib
from array import array
from collections.abc import Callable

from delayd.storage import batch

HOUR_MS = 3_600_000


class Placed(enum.IntFlag):
    """Where a message is counted in the schedule (the message table's flags byte)."""
    NOWHERE = 0
    SLOT = 1  # in the per-slot counts (a DEFAULT unit in the window)
    FAR = 2  # in the hourly far-future counts (parked in a ROLL unit)


class Schedule:
    def __init__(self, precision_ms: int, slot_count: int) -> None:
        self.precision_ms = precision_ms
        self.slot_count = slot_count
        self.slots = array("i", bytes(4 * slot_count))  # per slot index (changed only by the methods below)
        self.far: dict[int, int] = {}  # hour (deliver_at // HOUR_MS) -> count
        self.changes = 0  # changes of `slots` so far: `snapshot` packs them again only after one
        self._packed: tuple[int, bytes] | None = None  # (changes, the checkpoint's form of `slots` then)
        self._copy: bytearray | None = None  # `snapshot`'s buffer, while no pack holds it

    def slot_index(self, t: int) -> int:
        return t // self.precision_ms % self.slot_count

    def add_slot(self, t: int, n: int) -> None:
        i = t // self.precision_ms % self.slot_count
        v = self.slots[i] + n
        self.slots[i] = v if v > 0 else 0
        self.changes += 1

    def count(self, indexes: bytes) -> None:
        """One more message at each u32 slot index of `indexes` (index_rows' `counts`)."""
        if indexes:
            batch.ops.add_counts(self.slots, indexes)
            self.changes += 1

    def apply(self, added: list[int], removed: list[int]) -> None:
        """One more message at each slot index of `added`, one less at each of `removed`."""
        slots = self.slots
        for i in added:
            slots[i] += 1
        for i in removed:
            slots[i] = max(0, slots[i] - 1)
        self.changes += len(added) + len(removed)

    def add_far(self, deliver_at: int, n: int) -> None:
        h = deliver_at // HOUR_MS
        v = self.far.get(h, 0) + n
        if v > 0:
            self.far[h] = v
        else:
            self.far.pop(h, None)

    def take_slot(self, slot_time: int) -> None:
        """dequeue-get loaded the slot: its messages are in the pipeline, no longer pending here."""
        i = self.slot_index(slot_time)
        if self.slots[i]:  # (a slot loaded every precision_ms: most hold nothing)
            self.slots[i] = 0
            self.changes += 1

    def buckets(self, start: int, end: int, step: int, load_time_ms: int, span_ms: int) -> list[list[int]]:
        """Pending messages per [t, t+step) bucket: per slot inside the wheel (from the next slot
        to load, `load_time_ms`, for `span_ms`), per hour beyond it (far messages are counted by
        the hour of their due time). A slot or hour that straddles `start` counts in the first
        bucket: nothing pending in range is left out."""
        n = (end - start + step - 1) // step
        buckets = [[start + i * step, 0] for i in range(n)]
        p, count = self.precision_ms, self.slot_count
        lo = max(start, load_time_ms)
        lo -= lo % p
        hi = min(end, load_time_ms + span_ms)
        if hi > lo:
            first, slots = lo // p % count, (hi - lo + p - 1) // p
            counts = self.slots
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
        for h, c in self.far.items():
            t = max(h * HOUR_MS, start)
            if t < end and t < (h + 1) * HOUR_MS:
                buckets[(t - start) // step][1] += c
        return buckets

    # -- checkpoint -----------------------------------------------------------------------------
    def snapshot(self) -> tuple[Callable[[], bytes], dict[int, int]]:
        """The per-slot counts as they are now, as a function for the checkpoint's worker thread
        that gives them in the checkpoint's form (zlib'd i32s); and the hourly counts beyond the
        window. 4 bytes a slot is 69 MB at 10 ms precision: an idle daemon packed and the event
        loop copied that every second (86 ms of a core and a 37 ms stall of the loop, BENCHMARKS.md).
        Unchanged since the last pack, the function gives its bytes again; else the counts are
        copied here into a buffer kept for it (no allocation, no page faults: 8 ms at 10 ms
        precision, 0.1 ms at the default 1 s) and packed there."""
        changes, far = self.changes, dict(self.far)
        if self._packed is not None and self._packed[0] == changes:
            packed = self._packed[1]
            return (lambda: packed), far
        copy = self._copy if self._copy is not None else bytearray(4 * self.slot_count)
        self._copy = None  # (a snapshot taken before this one is packed gets a buffer of its own)
        memoryview(copy)[:] = memoryview(self.slots).cast("B")

        def pack() -> bytes:
            out = zlib.compress(copy, 1)
            self._packed, self._copy = (changes, out), copy
            return out
        return pack, far

    def restore(self, slots: bytes, far: dict[int, int]) -> None:
        if slots:
            raw = zlib.decompress(slots)
            if len(raw) == 4 * self.slot_count:  # else a geometry change: the rescan recounts
                self.slots = array("i", raw)
                self.changes += 1
        self.far = dict(far)
