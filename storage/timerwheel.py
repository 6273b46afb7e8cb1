"""The TimerWheel (RIP-43): a memory-mapped array of 32-byte slots over the TimerLog.

File layout: one 32-byte header, then `slot_count` slots.

Header (version 1):

    offset size  field         type  meaning
    ------ ----  ------------  ----  -------------------------------------------------
       0     4   magic         u32   WHEEL_MAGIC ("DLWH")
       4     2   version       u16   WHEEL_VERSION
       6     2   reserved      u16   0
       8     4   precision_ms  u32   slot width
      12     4   slot_count    u32   number of slots
      16     8   created_ms    i64   creation time, for humans
      24     4   crc           u32   crc32 of bytes [0, 24)
      28     4   reserved      u32   0

Slot:

    offset size  field      type  meaning
    ------ ----  ---------  ----  ----------------------------------------------------------
       0     8   slot_time  i64   start of the slot (ms); a slot whose time differs from the one
                                  asked for belongs to another lap and reads as empty
       8     8   first_pos  i64   first TimerLog unit of this slot lap
      16     8   last_pos   i64   newest unit; the chain runs back from it via prev_pos
      24     4   num        i32   units in the chain
      28     4   magic      u32   union of the chain's UnitMagic bits

Slot index = slot_time // precision_ms % slot_count. The wheel must span at least twice the
roll window so that a lap is read before the next one is written (see `safe_to_write`).
Version history: 1 — original.
"""

from __future__ import annotations

import mmap
import os
import sys
import time
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delayd.storage.bytetable import ByteTable
from delayd.storage.errors import BadMagic, ChecksumMismatch, GeometryMismatch, UnsupportedVersion

WHEEL_MAGIC = 0x484C5744  # "DLWH" little-endian
WHEEL_VERSION = 1
HEADER = ByteTable("<IHHIIqII")
SLOT = ByteTable("<qqqiI")
SLOT_SIZE = SLOT.size
COLUMN_SLOTS = 65_536  # slots per chunk of `columns` (2 MiB)
assert HEADER.size == 32 and SLOT_SIZE == 32


@dataclass(slots=True, frozen=True)
class Slot:
    time: int
    first_pos: int
    last_pos: int
    num: int
    magic: int

    @property
    def empty(self) -> bool:
        return self.num == 0


def empty_slot(t: int) -> Slot:
    return Slot(t, -1, -1, 0, 0)


Columns = tuple[array, array, array, array, array]


def columns(body: Any) -> Iterator[tuple[int, Columns]]:
    """The slots of `body` (a wheel's bytes after its header, a whole number of slots) as
    (slot_time, first_pos, last_pos, num, magic) columns, `COLUMN_SLOTS` at a time, in file order,
    each with the index of its chunk's first slot; a chunk of empty slots only (num all 0) is left
    out. Recovery checks every slot (172,800 at the default 1 s precision, 17 million at 10 ms):
    columns make no object per slot (the references of the batch core's `bad_slots` and
    `strip_slots`, storage/timerindex.py, read the wheel so)."""
    body = memoryview(body).cast("B")
    swap = sys.byteorder != "little"
    for at in range(0, len(body), COLUMN_SLOTS * SLOT_SIZE):
        part = body[at:at + COLUMN_SLOTS * SLOT_SIZE]
        words, wide, magics = array("i"), array("q"), array("I")
        words.frombytes(part)
        if swap:
            words.byteswap()
        nums = words[6::8]
        if not nums.tobytes().strip(b"\0"):
            continue
        wide.frombytes(part)
        if swap:
            wide.byteswap()
        magics.frombytes(words[7::8].tobytes())
        yield at // SLOT_SIZE, (wide[0::4], wide[1::4], wide[2::4], nums, magics)


def read_header(path: Path) -> tuple[int, int, int]:
    """(precision_ms, slot_count, created_ms) of a wheel file, validated magic → version → CRC."""
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise BadMagic(f"{path}: header cut short")
    magic, version, _r, precision, count, created, crc, _r2 = HEADER.unpack(head)
    if magic != WHEEL_MAGIC:
        raise BadMagic(f"{path}: magic {magic:#x}")
    if version > WHEEL_VERSION:
        raise UnsupportedVersion(str(path), version, WHEEL_VERSION)
    if version != WHEEL_VERSION:
        raise BadMagic(f"{path}: version {version}")
    if zlib.crc32(head[:24]) != crc:
        raise ChecksumMismatch(f"{path}: header crc")
    return precision, count, created


def validate(path: Path, precision_ms: int, slot_count: int) -> None:
    """Check a wheel file against the configured geometry, reading only: raises a CorruptData
    subclass (header), UnsupportedVersion, or GeometryMismatch."""
    precision, count, _created = read_header(path)
    if (precision, count) != (precision_ms, slot_count):
        raise GeometryMismatch(f"{path}: built for precision {precision} ms x {count} slots, "
                               f"configured {precision_ms} ms x {slot_count}")
    size = HEADER.size + slot_count * SLOT_SIZE
    if path.stat().st_size != size:
        raise GeometryMismatch(f"{path}: size {path.stat().st_size}, expected {size}")


class TimerWheel:
    def __init__(self, path: Path, precision_ms: int, slot_count: int) -> None:
        self.path = Path(path)
        self.precision_ms = precision_ms
        self.slot_count = slot_count
        size = HEADER.size + slot_count * SLOT_SIZE
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if fresh:
            with open(self.path, "wb") as f:
                f.truncate(size)
                created_ms = int(time.time() * 1000)  # once: the CRC must cover the value written
                head = HEADER.pack(WHEEL_MAGIC, WHEEL_VERSION, 0, precision_ms, slot_count, created_ms, 0, 0)
                f.write(HEADER.pack(WHEEL_MAGIC, WHEEL_VERSION, 0, precision_ms, slot_count, created_ms,
                                    zlib.crc32(head[:24]), 0))
                f.flush()
                os.fsync(f.fileno())
        else:
            validate(self.path, precision_ms, slot_count)
        self._fd = os.open(self.path, os.O_RDWR)
        self._mm = mmap.mmap(self._fd, size)
        self.created = fresh

    # -- addressing -----------------------------------------------------------------------------
    def slot_time(self, t: int) -> int:
        return t - t % self.precision_ms

    def _at(self, t: int) -> int:
        return HEADER.size + (t // self.precision_ms % self.slot_count) * SLOT_SIZE

    @property
    def span_ms(self) -> int:
        return self.precision_ms * self.slot_count

    # -- slots ----------------------------------------------------------------------------------
    def get(self, t: int) -> Slot:
        """The slot for time `t`; a slot holding another lap reads as empty."""
        st = self.slot_time(t)
        raw = SLOT.unpack_from(self._mm, self._at(st))
        if raw[0] != st or raw[3] <= 0:
            return empty_slot(st)
        return Slot(*raw)

    @property
    def buffer(self) -> mmap.mmap:
        """The mapped file, header included (for TimerIndex's per-message loop)."""
        return self._mm

    def load(self, st: int) -> list[int]:
        """[first_pos, last_pos, num, magic] of slot time `st` (a slot start), as a list to
        update in place; another lap reads as empty ([-1, -1, 0, 0]), as in `get`."""
        t, first, last, num, magic = SLOT.unpack_from(self._mm, HEADER.size + (st // self.precision_ms
                                                                              % self.slot_count) * SLOT_SIZE)
        if t != st or num <= 0:
            return [-1, -1, 0, 0]
        return [first, last, num, magic]

    def put_many(self, slots: dict[int, list[int]]) -> None:
        """put() of every {slot_time: [first_pos, last_pos, num, magic]} (slot starts)."""
        mm, p, n, pack = self._mm, self.precision_ms, self.slot_count, SLOT.pack_into
        for st, (first, last, num, magic) in slots.items():
            pack(mm, HEADER.size + st // p % n * SLOT_SIZE, st, first, last, num, magic)

    def raw(self, t: int) -> Slot:
        """The slot bytes as stored, whatever lap they belong to."""
        return Slot(*SLOT.unpack_from(self._mm, self._at(self.slot_time(t))))

    def put(self, t: int, first_pos: int, last_pos: int, num: int, magic: int) -> None:
        st = self.slot_time(t)
        SLOT.pack_into(self._mm, self._at(st), st, first_pos, last_pos, num, magic)

    def counts(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """(slot_time, num) for every non-empty slot in [start, end) that belongs to this lap."""
        t = self.slot_time(start)
        while t < end:
            s = self.get(t)
            if s.num:
                yield t, s.num
            t += self.precision_ms

    def reset(self) -> None:
        self._mm[HEADER.size:] = bytes(len(self._mm) - HEADER.size)

    def flush(self) -> None:
        self._mm.flush()

    def dup_fd(self) -> int:
        """A duplicated fd of the wheel file: fsync(2) on it also writes the dirty mmap'd pages."""
        return os.dup(self._fd)

    def close(self) -> None:
        self._mm.flush()
        self._mm.close()
        os.close(self._fd)
