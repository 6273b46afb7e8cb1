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
        self.slots = array("i", bytes(4 * slot_count))  # per slot index
        self.far: dict[int, int] = {}  # hour (deliver_at // HOUR_MS) -> count

    def slot_index(self, t: int) -> int:
        return t // self.precision_ms % self.slot_count

    def add_slot(self, t: int, n: int) -> None:
        i = t // self.precision_ms % self.slot_count
        v = self.slots[i] + n
        self.slots[i] = v if v > 0 else 0

    def add_far(self, deliver_at: int, n: int) -> None:
        h = deliver_at // HOUR_MS
        v = self.far.get(h, 0) + n
        if v > 0:
            self.far[h] = v
        else:
            self.far.pop(h, None)

    def take_slot(self, slot_time: int) -> None:
        """dequeue-get loaded the slot: its messages are in the pipeline, no longer pending here."""
        self.slots[self.slot_index(slot_time)] = 0

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
    def snapshot(self) -> tuple[bytes, dict[int, int]]:
        """The per-slot counts as raw bytes (a copy; `packed` makes them the checkpoint's zlib'd
        form in the worker thread: 4 bytes a slot, 69 MB at 10 ms precision, is no work for the
        event loop) and the hourly counts beyond the window."""
        return self.slots.tobytes(), dict(self.far)

    @staticmethod
    def packed(raw: bytes) -> bytes:
        return zlib.compress(raw, 1)

    def restore(self, slots: bytes, far: dict[int, int]) -> None:
        if slots:
            raw = zlib.decompress(slots)
            if len(raw) == 4 * self.slot_count:  # else a geometry change: the rescan recounts
                self.slots = array("i", raw)
        self.far = dict(far)
