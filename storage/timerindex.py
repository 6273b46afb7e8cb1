"""TimerLog + TimerWheel working together: the RIP-43 index of what fires when.

`add` appends units and links each into its slot's chain; `due` walks one slot and applies
the slot's DELETE markers; `strip_after` and `rebuild` are the two recovery moves:
strip undoes every unit past a position (the TimerLog tail that is redone from the commit
log), rebuild recreates a lost or damaged wheel from the TimerLog alone.
"""

from __future__ import annotations

import itertools
import logging
import sys
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from delayd.storage import native
from delayd.storage.errors import Insane
from delayd.storage.timerlog import DAMAGED, NO_POS, UNIT, UNIT_SIZE, TimerLog, Unit, UnitMagic
from delayd.storage.timerwheel import HEADER as WHEEL_HEADER
from delayd.storage.timerwheel import SLOT, SLOT_SIZE, TimerWheel, columns

WHEEL_HEADER_SIZE = WHEEL_HEADER.size
log = logging.getLogger("delayd.storage")


class Entry(NamedTuple):
    """What enqueue-put asks to index: a unit that fires at `fire_time`. (A NamedTuple, not a
    dataclass: one is made per message on the hot path and unpacked like a tuple.)"""
    fire_time: int
    magic: int  # UnitMagic bits
    commit_offset: int
    commit_size: int
    topic_hash: int
    seq: int


def strip_slots(wheel: Any, header_size: int, pos: int, tail: Any) -> tuple[int, tuple[int, int] | None]:
    """TimerIndex.strip_after's walk (compiled: storage/batch_recovery.c; this is its reference),
    on the wheel's bytes (`wheel`, its header `header_size` bytes). Every slot whose num is not 0
    and whose last_pos is at least `pos`, in file order, is walked back through `tail` (i64s, the
    prev_pos of the unit at pos + i * UNIT_SIZE; DAMAGED: none there) while the walk is at or
    after `pos`, and rewritten in place with what is left: cleared when nothing is (or num says
    so), else its last_pos and num cut. (units unlinked, None), or, for the first slot whose walk
    lands on no sound unit (or does not go back), (the units unlinked before it, (its slot_time,
    that position)): the slots before it are rewritten, it and those after it are not."""
    raw = bytes(tail)
    if not 0 <= header_size <= len(wheel) or (len(wheel) - header_size) % SLOT_SIZE or pos < 0 or pos % UNIT_SIZE or len(raw) % 8:
        raise ValueError("strip_slots: wheel, header_size, pos or tail")
    prevs = array("q", raw)
    removed = 0
    # (a slot is read from its chunk's columns and written only when it is visited)
    for first_slot, (times, firsts, lasts, nums, magics) in columns(memoryview(wheel)[header_size:]):
        for k in itertools.compress(range(len(nums)), nums):
            t, first, last, num, magic = times[k], firsts[k], lasts[k], nums[k], magics[k]
            if last < pos:
                continue
            n = 0
            while last != NO_POS and last >= pos:
                i, off = divmod(last - pos, UNIT_SIZE)
                if off or i >= len(prevs) or prevs[i] == DAMAGED or prevs[i] >= last:
                    return removed, (t, last)
                last = prevs[i]
                n += 1
            removed += n
            at = header_size + (first_slot + k) * SLOT_SIZE
            if last == NO_POS or num - n <= 0:
                SLOT.pack_into(wheel, at, 0, NO_POS, NO_POS, 0, 0)
            else:
                SLOT.pack_into(wheel, at, t, first, last, num - n, magic)
    return removed, None


def bad_slots(wheel: Any, header_size: int, precision: int, start: int, end: int) -> int:
    """TimerIndex.check_slots's count (compiled: storage/batch_recovery.c; this is its reference)
    over the wheel's bytes: the slots whose num is not 0 and whose fields cannot be right — num
    negative, slot_time off the `precision` grid, last_pos not a unit's or outside the TimerLog
    [start, end), first_pos outside [start, last_pos]."""
    if not 0 <= header_size <= len(wheel) or (len(wheel) - header_size) % SLOT_SIZE or precision <= 0:
        raise ValueError("bad_slots: wheel, header_size or precision")
    bad = 0
    for _first_slot, (times, firsts, lasts, nums, _magics) in columns(memoryview(wheel)[header_size:]):
        for k in itertools.compress(range(len(nums)), nums):
            last = lasts[k]
            if nums[k] < 0 or times[k] % precision or last % UNIT_SIZE or not start <= last < end or not start <= firsts[k] <= last:
                bad += 1
    return bad


class TimerIndex:
    def __init__(self, timerlog: TimerLog, wheel: TimerWheel) -> None:
        self.log = timerlog
        self.wheel = wheel

    @classmethod
    def open(cls, directory: Path, precision_ms: int, slot_count: int,
             segment_units: int = 1 << 20) -> TimerIndex:
        return cls(TimerLog(directory / "timerlog", segment_units),
                   TimerWheel(directory / "timerwheel", precision_ms, slot_count))

    def add(self, entries: list[Entry], now_ms: int) -> None:
        """Append units for `entries` and update their slots. Batches never cross a segment."""
        i = 0
        while i < len(entries):
            room = self.log.room_units()
            chunk = entries[i:i + room]
            self._add_chunk(chunk, now_ms)
            i += len(chunk)

    def _add_chunk(self, entries: list[Entry], now_ms: int) -> None:
        wheel = self.wheel
        # Locals and TimerWheel.load() inlined: this loop runs once per message.
        precision, nslots, mm, pack, unpack_slot = wheel.precision_ms, wheel.slot_count, wheel.buffer, UNIT.pack, \
            SLOT.unpack_from
        slots: dict[int, list[int]] = {}  # slot_time -> [first, last, num, magic]
        parts = []
        pos = self.log.end
        for fire, magic, offset, size, topic_hash, seq in entries:
            st = fire - fire % precision
            s = slots.get(st)
            if s is None:
                t, first, last, num, smagic = unpack_slot(mm, WHEEL_HEADER_SIZE + st // precision % nslots * SLOT_SIZE)
                s = slots[st] = [first, last, num, smagic] if t == st and num > 0 else [-1, -1, 0, 0]
            # pack_unit(), inlined: this runs once per message.
            parts.append(pack(UNIT_SIZE, s[1], magic, now_ms, fire - now_ms, offset, size, topic_hash, seq))
            if s[2] == 0:
                s[0] = pos
            s[1] = pos
            s[2] += 1
            s[3] |= magic
            pos += UNIT_SIZE
        # The units go to disk before the slots point at them: a crash in between leaves
        # unreferenced units (harmless), never a slot pointing at nothing.
        self.log.append(b"".join(parts))
        wheel.put_many(slots)

    def due(self, slot_time: int) -> list[Unit]:
        """The live units of one slot: DELETE markers applied, oldest first."""
        live = list(self.walk(slot_time))
        live.reverse()
        return live

    def walk(self, slot_time: int) -> Iterator[Unit]:
        """The live units of one slot, newest first, lazily. A DELETE marker is always newer
        than the unit it cancels, so walking newest-first sees the marker before its target."""
        slot = self.wheel.get(slot_time)
        if slot.empty:
            return
        deleted: set[int] = set()
        for u in self.chain(slot_time, slot.last_pos):
            if u.magic & UnitMagic.DELETE:
                deleted.add(u.seq)
            elif u.seq not in deleted:
                yield u

    def chain(self, slot_time: int, last_pos: int) -> Iterator[Unit]:
        """Walk a chain, checking every unit belongs to this slot (damage shows up here)."""
        for unit in self.log.chain(last_pos):
            if self.wheel.slot_time(unit.fire_time) != slot_time:
                raise Insane(f"unit at {unit.pos} fires at {unit.fire_time}, not in slot {slot_time}")
            yield unit

    def safe_to_write(self, fire_time: int, read_time_ms: int) -> bool:
        """A slot may take a new lap only after the previous lap was dispatched (RIP-43's
        'a wheel longer than its window loses messages' bug is a lap overwritten unread)."""
        return fire_time - self.wheel.span_ms < read_time_ms

    # -- recovery -------------------------------------------------------------------------------
    def check_slots(self) -> int:
        """Count slots whose fields cannot be right (the wheel then has to be rebuilt)."""
        return int(ops.bad_slots(self.wheel.buffer, WHEEL_HEADER_SIZE, self.wheel.precision_ms, self.log.start,
                                 self.log.end))

    def strip_after(self, pos: int) -> int:
        """Unlink every unit at or after `pos` from its slot; returns the units unlinked.

        Used before truncating the TimerLog to the checkpoint: those units are redone from
        the commit log, so the wheel must not keep pointing at them. The units from `pos` on are
        read once, in log order (`TimerLog.prev_positions`), and the chains walked through them
        (`strip_slots`): they are a second's produce, interleaved across slots, and a read a
        unit took 3 µs. A walk into a unit that is not there or does not check out raises Insane.
        """
        if pos % UNIT_SIZE:
            raise Insane(f"TimerLog position {pos} is not a unit's")
        removed, bad = ops.strip_slots(self.wheel.buffer, WHEEL_HEADER_SIZE, pos, self.log.prev_positions(pos))
        if bad is not None:
            raise Insane(f"slot {bad[0]} walks to TimerLog position {bad[1]}, not a sound unit after {pos}")
        return removed

    def rebuild(self, units: Iterable[Unit], read_time_ms: int) -> int:
        """Recreate the wheel from TimerLog units (in log order) that fire at or after
        `read_time_ms`; returns how many units were linked.

        Every readable unit of a slot is linked, in log order: the units are the truth, not
        their pointers. Where a unit's prev_pos does not name the unit before it in its slot
        (the one in between is damaged and was skipped, or a pointer was flipped) it is
        rewritten in place, so the chain walks around the damage instead of into it.
        """
        self.wheel.reset()
        slots: dict[int, list[int]] = {}
        n = 0
        floor = self.wheel.slot_time(read_time_ms)
        for u in units:
            st = self.wheel.slot_time(u.fire_time)
            if st < floor:
                continue
            s = slots.get(st)
            head = NO_POS if s is None else s[1]
            if u.prev_pos != head:
                self.log.relink(u.pos, head)
            if s is None:
                s = slots[st] = [u.pos, u.pos, 0, 0]
            s[1] = u.pos
            s[2] += 1
            s[3] |= u.magic
            n += 1
        for st, (first, last, num, magic) in slots.items():
            self.wheel.put(st, first, last, num, magic)
        return n

    def rebuild_from_log(self, read_time_ms: int, timerlog_end: int | None = None) -> list[int]:
        """`rebuild` from every readable unit of the TimerLog (up to `timerlog_end`); returns
        the positions of damaged units skipped (their messages are lost to the timer: the unit
        held which message it was)."""
        damaged: list[int] = []
        self.rebuild(self.log.scan(self.log.start, timerlog_end, damaged), read_time_ms)
        if damaged:
            log.error("TimerLog: %d damaged units skipped while rebuilding the wheel (first at %d)",
                      len(damaged), damaged[0])
        return damaged

    def flush(self) -> None:
        self.log.flush()
        self.wheel.flush()

    def close(self) -> None:
        self.log.close()
        self.wheel.close()


_compiled = native.compiled()
ops: Any = _compiled if _compiled is not None else sys.modules[__name__]
