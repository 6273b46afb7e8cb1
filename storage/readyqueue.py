"""Ready queue per topic (RocketMQ's consume queue): messages that are due, in release order.

Fixed-size units pointing at commit-log records, so delivery never copies a body again.
A unit's index (0, 1, 2, …) is its queue offset; consumer groups keep cursors into it.

    offset size  field          type  meaning
    ------ ----  -------------  ----  ---------------------------------------------
       0     8   commit_offset  i64   the message's current commit-log record
       8     4   commit_size    u32   its length
      12     4   tag_hash       u32   crc32 of the tag (0: no tag), for filtering
      16     8   deliver_at     i64   due time, epoch ms
      24     8   released_at    i64   when the broker made it visible, epoch ms
      32     8   seq            u64   message sequence number

Segment header (format version 2; see storage.segments for the shared layout):

    offset size  field       type  meaning
    ------ ----  ----------  ----  ------------------------------------------------------
       0     8   magic       8s    b"DLREADY\\xff" (READY_FORMAT.magic)
       8     2   version     u16   2
      10     2   header_len  u16   32
      12     4   unit_size   u32   UNIT_SIZE (40)
      16     8   base        u64   the segment's base (bytes over the units; its file name)
      24     4   reserved    u32   0
      28     4   crc         u32   crc32 of bytes [0, 28)

Unit indexes count units only: the header is not part of them.

Version history: 1 — original, segments without a header (still read: a version-1 segment
starts with a unit, whose commit_offset is never negative, so its byte 7 is below 0x80 — the
magic's byte 7 is 0xff); 2 — the 32-byte segment header.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from delayd.storage import native
from delayd.storage.bytetable import ByteTable
from delayd.storage.errors import DiskFull
from delayd.storage.segments import SegmentedFile, SegmentFormat

UNIT = ByteTable("<qIIqqQ")
UNIT_SIZE = UNIT.size
assert UNIT_SIZE == 40
UNIT_DELIVER_AT = 16  # the offset of deliver_at in a unit (batch functions read it in place)
READY_VERSION = 2
SIGN_BIT = 0x80  # of byte 7 of a little-endian i64: set only for a negative commit_offset
READY_FORMAT = SegmentFormat("ready queue", b"DLREADY\xff", READY_VERSION, UNIT_SIZE,
                             legacy=lambda first: len(first) == 8 and first[7] < SIGN_BIT)


def unit_bounds(units: bytes | memoryview) -> tuple[int, int]:
    """(lowest commit offset, latest release time) of packed units: the compiled core's
    `unit_bounds` when it is built, else `bounds_py`, its reference."""
    c = native.compiled()
    return c.unit_bounds(units) if c is not None else bounds_py(units)


def bounds_py(units: bytes | memoryview) -> tuple[int, int]:
    lo, hi = 1 << 62, 0
    for off, _size, _th, _due, released, _seq in UNIT.iter_unpack(units):
        lo, hi = min(lo, off), max(hi, released)
    return lo, hi


def tag_hash(tag: str | None) -> int:
    return zlib.crc32(tag.encode()) or 1 if tag else 0


@dataclass(slots=True, frozen=True)
class ReadyUnit:
    index: int
    commit_offset: int
    commit_size: int
    tag_hash: int
    deliver_at: int
    released_at: int
    seq: int


class ReadyQueue:
    """One topic's queue. Opening creates the directory and its first segment (so only a
    release opens a queue that does not exist yet) and cuts a torn unit off the end; with
    `readonly` it does neither."""

    def __init__(self, directory: Path, segment_units: int = 1 << 18, *, readonly: bool = False) -> None:
        self.files = SegmentedFile(Path(directory), segment_units * UNIT_SIZE, unit=UNIT_SIZE, fmt=READY_FORMAT,
                                   readonly=readonly, sync_on_roll=False)  # durable at checkpoints
        tail = self.files.end % UNIT_SIZE
        if tail and not readonly:
            self.files.truncate(self.files.end - tail, "ready queue: torn unit")

    @property
    def end(self) -> int:
        """Number of units ever written (the next unit's index)."""
        return self.files.end // UNIT_SIZE

    @property
    def start(self) -> int:
        return self.files.start // UNIT_SIZE

    def append(self, units: list[tuple[int, int, int, int, int, int]]) -> int:
        """Append (commit_offset, size, tag_hash, deliver_at, released_at, seq) units; first index."""
        return self.append_packed(b"".join(UNIT.pack(*u) for u in units))

    def append_packed(self, data: bytes) -> int:
        """Append packed units (UNIT_SIZE bytes each); the first one's index. All or nothing:
        on a full disk the part written is cut off again (the caller retries the whole batch,
        which must not queue a message twice)."""
        first = self.end
        i, n = 0, len(data)
        try:
            while i < n:
                room = max(1, self.files.remaining() // UNIT_SIZE) * UNIT_SIZE
                chunk = data[i:i + room]
                self.files.append(chunk)
                i += len(chunk)
        except DiskFull:
            self.files.truncate(first * UNIT_SIZE, "ready queue: undo a write that hit a full disk")
            raise
        return first

    def read(self, first: int, count: int) -> list[ReadyUnit]:
        """Up to `count` units from index `first` (fewer at a segment or queue end)."""
        first = max(first, self.start)
        if first >= self.end or count <= 0:
            return []
        buf = self.files.read(first * UNIT_SIZE, min(count, self.end - first) * UNIT_SIZE)
        return [ReadyUnit(first + i, *UNIT.unpack_from(buf, i * UNIT_SIZE))
                for i in range(len(buf) // UNIT_SIZE)]

    def read_packed(self, first: int, count: int) -> tuple[int, bytes]:
        """Up to `count` units from index `first` as stored (UNIT, packed), and the index of the
        first one: `first`, or the queue's start when retention deleted what was before it."""
        first = max(first, self.start)
        if first >= self.end or count <= 0:
            return first, b""
        buf = self.files.read(first * UNIT_SIZE, min(count, self.end - first) * UNIT_SIZE)
        return first, bytes(buf[:len(buf) - len(buf) % UNIT_SIZE])

    def scan(self, first: int) -> Iterator[ReadyUnit]:
        idx = max(first, self.start)
        while idx < self.end:
            batch = self.read(idx, 8192)
            if not batch:
                return
            yield from batch
            idx = batch[-1].index + 1

    def truncate(self, units: int) -> int:
        return self.files.truncate(units * UNIT_SIZE, "ready queue") // UNIT_SIZE

    def flush(self) -> None:
        self.files.flush()

    def delete_before(self, index: int) -> list[int]:
        return self.files.delete_before(index * UNIT_SIZE)

    def disk_bytes(self) -> int:
        return self.files.disk_bytes()

    def close(self) -> None:
        self.files.close()
