"""The TimerLog (RIP-43): append-only 52-byte units, one per scheduled (or cancelled) entry.

Units of one wheel slot form a chain through `prev_pos`, newest first, starting at the
slot's `last_pos`. Segments hold a whole number of units, so no unit ever spans two files
and no blank filler is needed at a segment end.

    offset size  field          type  meaning
    ------ ----  -------------  ----  ------------------------------------------------------
       0     4   size           u32   UNIT_SIZE (52); anything else means damage
       4     8   prev_pos       i64   previous unit of the same slot lap, -1 for the first
      12     4   magic          u32   UnitMagic bits (DEFAULT, ROLL, DELETE)
      16     8   enqueue_time   i64   epoch ms when this unit was written
      24     4   delay          i32   fire time − enqueue_time, ms (fire time picks the slot)
      28     8   commit_offset  i64   commit-log record this unit indexes
      36     4   commit_size    u32   that record's length
      40     4   topic_hash     u32   crc32 of the topic, for per-topic counts
      44     8   seq            u64   message sequence (RIP-43's reserved field): cancels and
                                      duplicate checks need no commit-log read

Segment header (format version 2; see storage.segments for the shared layout):

    offset size  field       type  meaning
    ------ ----  ----------  ----  ------------------------------------------------------
       0     8   magic       8s    b"DLTLOG\\x00\\xff" (TIMERLOG_FORMAT.magic)
       8     2   version     u16   2
      10     2   header_len  u16   32
      12     4   unit_size   u32   UNIT_SIZE (52)
      16     8   base        u64   the segment's base position (its file name)
      24     4   reserved    u32   0
      28     4   crc         u32   crc32 of bytes [0, 28)

Positions are global offsets over the units only: the header is not part of them.

Version history: 1 — original, segments without a header (still read: a version-1 segment
starts with a unit, whose `size` field is 52); 2 — the 32-byte segment header.
"""

from __future__ import annotations

import enum
import struct
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

from delayd.storage import native
from delayd.storage.bytetable import ByteTable
from delayd.storage.errors import Insane
from delayd.storage.segments import SegmentedFile, SegmentFormat

UNIT = ByteTable("<IqIqiqIIQ")
UNIT_SIZE = UNIT.size  # 52
assert UNIT_SIZE == 52
NO_POS = -1
DAMAGED = -2  # prev_positions: no sound unit at that position
CHAIN_WINDOW = 64 * UNIT_SIZE * 16  # bytes read at once when walking a chain backwards
TIMERLOG_VERSION = 2
_V1_FIRST = struct.pack("<I", UNIT_SIZE)  # a version-1 segment starts with a unit's size field
TIMERLOG_FORMAT = SegmentFormat("TimerLog", b"DLTLOG\x00\xff", TIMERLOG_VERSION, UNIT_SIZE,
                                legacy=lambda first: first[:4] == _V1_FIRST)


class UnitMagic(enum.IntFlag):
    DEFAULT = 1  # deliver the message when the unit fires
    ROLL = 2  # the message is due beyond the window: re-append it when the unit fires
    DELETE = 4  # a cancel marker: the unit with the same seq in this slot is dropped


@dataclass(slots=True, frozen=True)
class Unit:
    pos: int
    prev_pos: int
    magic: UnitMagic
    enqueue_time: int
    delay: int
    commit_offset: int
    commit_size: int
    topic_hash: int
    seq: int

    @property
    def fire_time(self) -> int:
        return self.enqueue_time + self.delay


def pack_unit(prev_pos: int, magic: int, enqueue_time: int, fire_time: int, commit_offset: int,
              commit_size: int, topic_hash: int, seq: int) -> bytes:
    return UNIT.pack(UNIT_SIZE, prev_pos, magic, enqueue_time, fire_time - enqueue_time, commit_offset,
                     commit_size, topic_hash, seq)


def sound(size: int, prev: int, magic: int, off: int, pos: int) -> bool:
    """Whether the fields of the unit at `pos` can be right (else it is damage)."""
    return size == UNIT_SIZE and NO_POS <= prev < pos and 0 < magic < 8 and off >= 0


def unit_prevs(buf: bytes | memoryview, pos: int) -> bytes:
    """The prev_pos of each unit in `buf` (whole units, the first at position `pos`) as i64s,
    DAMAGED for a unit that is not `sound`: TimerLog.prev_positions's per-unit step (compiled:
    storage/batch_recovery.c; this is its reference)."""
    if len(buf) % UNIT_SIZE or pos < 0:
        raise ValueError(f"unit_prevs: {len(buf)} bytes at {pos} are not whole units")
    return array("q", [prev if sound(size, prev, magic, off, pos + i * UNIT_SIZE) else DAMAGED
                       for i, (size, prev, magic, _e, _d, off, _c, _t, _s) in enumerate(UNIT.iter_unpack(buf))]).tobytes()


def unpack_unit(buf: bytes | memoryview, at: int, pos: int) -> Unit:
    size, prev, magic, enq, delay, off, csize, th, seq = UNIT.unpack_from(buf, at)
    if not sound(size, prev, magic, off, pos):
        raise Insane(f"damaged TimerLog unit at {pos}")
    return Unit(pos, prev, UnitMagic(magic), enq, delay, off, csize, th, seq)


class TimerLog:
    """Segmented append-only array of units; a position is a global byte offset."""

    def __init__(self, directory: Path, segment_units: int = 1 << 20, *, readonly: bool = False) -> None:
        self.files = SegmentedFile(Path(directory), segment_units * UNIT_SIZE, unit=UNIT_SIZE, fmt=TIMERLOG_FORMAT,
                                   readonly=readonly, sync_on_roll=False)  # durable at checkpoints

    def cut_torn_tail(self) -> int:
        """Cut a torn unit (an interrupted write) off the end; returns the bytes cut. Recovery
        calls it once the rest of the directory checked out (opening changes nothing)."""
        tail = self.files.end % UNIT_SIZE
        return self.files.truncate(self.files.end - tail, "TimerLog: torn unit") if tail else 0

    @property
    def end(self) -> int:
        return self.files.end

    @property
    def start(self) -> int:
        return self.files.start

    def append(self, units: bytes) -> int:
        """Append packed units (a multiple of UNIT_SIZE) and return the first one's position.

        Callers chain `prev_pos` themselves, so a batch must not cross a segment: use
        `room_units()` to size batches.
        """
        return self.files.append(units)

    def room_units(self) -> int:
        room = self.files.remaining() // UNIT_SIZE
        if room == 0:
            self.files.roll()
            room = self.files.remaining() // UNIT_SIZE
        return room

    def read(self, pos: int) -> Unit:
        if pos < self.files.start or pos + UNIT_SIZE > self.files.end or pos % UNIT_SIZE:
            raise Insane(f"TimerLog position {pos} outside [{self.files.start}, {self.files.end})")
        return unpack_unit(self.files.read(pos, UNIT_SIZE), 0, pos)

    def window(self, pos: int) -> tuple[int, bytes]:
        """(start, bytes) of a stretch of the TimerLog that ends with the unit at `pos`: a chain is
        walked backwards, and its units are mostly written in runs, so one read serves several.
        Raises Insane for a position that cannot be a unit."""
        if pos < self.files.start or pos + UNIT_SIZE > self.files.end or pos % UNIT_SIZE:
            raise Insane(f"TimerLog position {pos} outside [{self.files.start}, {self.files.end})")
        lo = max(self.files.segment_of(pos), pos + UNIT_SIZE - CHAIN_WINDOW)
        return lo, self.files.read(lo, pos + UNIT_SIZE - lo)

    def chain(self, last_pos: int) -> Iterator[Unit]:
        """Walk a slot's chain from its newest unit back to the first.

        Units of one slot are mostly written in runs, so the walk reads a window ending at
        the unit it needs and serves the next few from it instead of one pread per unit.
        """
        pos = last_pos
        lo = hi = 0
        buf = b""
        while pos != NO_POS:
            if not lo <= pos < hi:
                lo, buf = self.window(pos)
                hi = lo + len(buf)
            unit = unpack_unit(buf, pos - lo, pos)
            yield unit
            pos = unit.prev_pos

    def scan(self, start: int, end: int | None = None, damaged: list[int] | None = None) -> Iterator[Unit]:
        """Units from `start` in log order. A damaged unit raises Insane, or, when a `damaged`
        list is given, is skipped and its position appended to the list."""
        for pos, buf in self._stretches(start, end):
            for i in range(0, len(buf) - UNIT_SIZE + 1, UNIT_SIZE):
                try:
                    unit = unpack_unit(buf, i, pos + i)
                except Insane:
                    if damaged is None:
                        raise
                    damaged.append(pos + i)
                    continue
                yield unit

    def prev_positions(self, start: int) -> array:
        """The prev_pos of every unit from `start` (a unit's position) to the end, in log order
        (an array of i64, entry i for the unit at start + i * UNIT_SIZE); DAMAGED for a unit
        that is not `sound`, and for any gap. Recovery walks the chains past a checkpoint
        through it (TimerIndex.strip_after): no Unit a unit."""
        out = array("q")
        for pos, buf in self._stretches(start, None):
            out.extend(repeat(DAMAGED, (pos - start) // UNIT_SIZE - len(out)))
            out.frombytes(ops.unit_prevs(buf, pos))
        return out

    def _stretches(self, start: int, end: int | None) -> Iterator[tuple[int, bytes]]:
        """(position, bytes) of whole units from `start` up to `end` (default: the end), a read
        of up to 8,192 units at a time, none across a segment's end."""
        stop = self.files.end if end is None else end
        pos = max(start, self.files.start)
        pos -= pos % UNIT_SIZE
        while pos < stop:
            base = self.files.segment_of(pos)
            n = min(stop, self.files.segment_end(base), pos + 8192 * UNIT_SIZE) - pos
            if n < UNIT_SIZE:  # this segment's end (a torn unit there is no unit)
                later = [b for b in self.files.bases if b > base]
                if not later:
                    return
                pos = later[0]
                continue
            buf = self.files.read(pos, n)
            buf = buf[:len(buf) - len(buf) % UNIT_SIZE]
            if not buf:
                return
            yield pos, buf
            pos += len(buf)

    def relink(self, pos: int, prev_pos: int) -> None:
        """Rewrite one unit's prev_pos in place (wheel rebuild, around a damaged unit)."""
        self.files.write_at(pos + 4, struct.pack("<q", prev_pos))

    def truncate(self, pos: int, why: str = "") -> int:
        return self.files.truncate(pos, why)

    def flush(self) -> None:
        self.files.flush()

    def delete_before(self, pos: int) -> list[int]:
        return self.files.delete_before(pos)

    def close(self) -> None:
        self.files.close()


_compiled = native.compiled()
ops: Any = _compiled if _compiled is not None else sys.modules[__name__]
