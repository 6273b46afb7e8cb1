"""The message table: one fixed-size entry per message sequence number.

It answers "where is message N now, and is it still pending?" without any per-message
Python object: entries live in segment files read and written with pread/pwrite, so memory
stays flat however many messages are scheduled. Entry `seq` lives at byte
`(seq % SEGMENT_ENTRIES) * ENTRY_SIZE` of segment `seq // SEGMENT_ENTRIES`.

    offset size  field       type  meaning
    ------ ----  ----------  ----  --------------------------------------------------------
       0     1   state       u8    MessageState
       1     1   flags       u8    the store's bookkeeping bits (store.FLAG_SLOT, FLAG_FAR: where
                                   the message is counted in the schedule); 0 when written
       2     2   roll_count  u16   roll copy that is current
       4     4   size        u32   length of the current commit-log record
       8     8   offset      i64   current commit-log record (original or latest roll copy)

Hot paths (enqueue-put, dequeue) bracket their work in `begin_batch`/`end_batch`: the entries of
a batch are read with one pread per run of nearby seqs and written back with one pwrite, instead
of a syscall per message.

The table is derived data: recovery rebuilds what the checkpoint does not cover from the
commit log (MESSAGE/ROLL/CANCEL records) and the ready queues (deliveries).
Version history: 1 — original.
"""

from __future__ import annotations

import enum
import os
import struct
from collections.abc import Iterable
from pathlib import Path

ENTRY = struct.Struct("<BBHIq")
ENTRY_SIZE = ENTRY.size
assert ENTRY_SIZE == 16
SEGMENT_ENTRIES = 1 << 20


class MessageState(enum.IntEnum):
    UNKNOWN = 0
    SCHEDULED = 1
    DELIVERED = 2
    CANCELLED = 3


_STATES = tuple(MessageState)  # state byte -> MessageState without the (slow) Enum call
_UNKNOWN_ENTRY = (MessageState.UNKNOWN, -1, 0, 0)
BATCH_GAP = 256  # seqs this close share one read in a batch


class _Span:
    """Entries [first, first + len(buf) // 16) of one segment, held in memory by a batch."""
    __slots__ = ("seg", "first", "buf", "valid", "lo", "hi")

    def __init__(self, seg: int, first: int, buf: bytearray, valid: int) -> None:
        self.seg, self.first, self.buf, self.valid = seg, first, buf, valid
        self.lo, self.hi = len(buf), 0  # changed bytes [lo, hi)

    def touch(self, lo: int, hi: int) -> None:
        if lo < self.lo:
            self.lo = lo
        if hi > self.hi:
            self.hi = hi
            if hi > self.valid:
                self.valid = hi


class MessageTable:
    def __init__(self, directory: Path, segment_entries: int = SEGMENT_ENTRIES) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_entries = segment_entries
        self._fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._batch: dict[int, tuple[_Span, int]] | None = None  # seq -> (span, byte offset in it)
        self._spans: list[_Span] = []

    # -- batches: the same reads and writes, a few syscalls for many entries ------------------
    def begin_batch(self, seqs: Iterable[int]) -> None:
        """Read the entries of `seqs` with one pread per run of nearby seqs. Until `end_batch`,
        get/set/set_state/flags/set_flags of those seqs work on the copy in memory (others go
        to the file as usual); `end_batch` writes the changed bytes back, one pwrite per run."""
        self.end_batch()
        index: dict[int, tuple[_Span, int]] = {}
        ordered = sorted(set(seqs))
        per = self.segment_entries
        i = 0
        while i < len(ordered):
            seg, lo = divmod(ordered[i], per)
            j = i + 1
            while j < len(ordered) and ordered[j] // per == seg and ordered[j] - ordered[j - 1] <= BATCH_GAP:
                j += 1
            fd = self._fds.get(seg)
            if fd is None and (self.directory / f"{seg:020d}").exists():
                fd = self._fd(seg)
            if fd is not None:
                hi = ordered[j - 1] % per
                raw = os.pread(fd, (hi - lo + 1) * ENTRY_SIZE, lo * ENTRY_SIZE)
                buf = bytearray(raw)
                buf.extend(bytes((hi - lo + 1) * ENTRY_SIZE - len(raw)))
                span = _Span(seg, lo, buf, len(raw))
                self._spans.append(span)
                base = seg * per + lo
                for seq in ordered[i:j]:
                    index[seq] = (span, (seq - base) * ENTRY_SIZE)
            i = j
        self._batch = index

    def end_batch(self) -> None:
        for span in self._spans:
            if span.lo < span.hi:
                os.pwrite(self._fd(span.seg), span.buf[span.lo:span.hi], span.first * ENTRY_SIZE + span.lo)
                self._dirty.add(span.seg)
        self._spans = []
        self._batch = None

    def _fd(self, segment: int) -> int:
        fd = self._fds.get(segment)
        if fd is None:
            fd = os.open(self.directory / f"{segment:020d}", os.O_RDWR | os.O_CREAT, 0o644)
            self._fds[segment] = fd
        return fd

    def get(self, seq: int) -> tuple[MessageState, int, int, int]:
        """(state, offset, size, roll_count); UNKNOWN when never written or deleted."""
        if self._batch is not None:
            hit = self._batch.get(seq)
            if hit is not None:
                span, at = hit
                if at + ENTRY_SIZE > span.valid:
                    return _UNKNOWN_ENTRY
                state, _f, roll, size, offset = ENTRY.unpack_from(span.buf, at)
                if state >= len(_STATES):
                    return _UNKNOWN_ENTRY
                return _STATES[state], offset, size, roll
        seg, idx = divmod(seq, self.segment_entries)
        fd = self._fds.get(seg)
        if fd is None:
            if not (self.directory / f"{seg:020d}").exists():
                return MessageState.UNKNOWN, -1, 0, 0
            fd = self._fd(seg)
        raw = os.pread(fd, ENTRY_SIZE, idx * ENTRY_SIZE)
        if len(raw) < ENTRY_SIZE:
            return MessageState.UNKNOWN, -1, 0, 0
        state, _f, roll, size, offset = ENTRY.unpack(raw)
        try:
            return MessageState(state), offset, size, roll
        except ValueError:
            return MessageState.UNKNOWN, -1, 0, 0

    def has_entry(self, seq: int) -> bool:
        """Whether the segment file of `seq` exists and reaches its entry (written or not)."""
        seg, idx = divmod(seq, self.segment_entries)
        path = self.directory / f"{seg:020d}"
        return path.exists() and path.stat().st_size >= (idx + 1) * ENTRY_SIZE

    def set(self, seq: int, state: MessageState, offset: int, size: int, roll_count: int = 0) -> None:
        if self._batch is not None and seq in self._batch:
            span, at = self._batch[seq]
            ENTRY.pack_into(span.buf, at, state, 0, roll_count, size, offset)
            span.touch(at, at + ENTRY_SIZE)
            return
        seg, idx = divmod(seq, self.segment_entries)
        os.pwrite(self._fd(seg), ENTRY.pack(state, 0, roll_count, size, offset), idx * ENTRY_SIZE)
        self._dirty.add(seg)

    def set_state(self, seq: int, state: MessageState) -> None:
        if self._batch is not None and seq in self._batch:
            span, at = self._batch[seq]
            span.buf[at] = state
            span.touch(at, at + 1)
            return
        seg, idx = divmod(seq, self.segment_entries)
        os.pwrite(self._fd(seg), bytes((state,)), idx * ENTRY_SIZE)
        self._dirty.add(seg)

    def flags(self, seq: int) -> int:
        """The entry's flags byte (the store's bookkeeping bits), 0 when never written."""
        if self._batch is not None and seq in self._batch:
            span, at = self._batch[seq]
            return span.buf[at + 1] if at + 2 <= span.valid else 0
        seg, idx = divmod(seq, self.segment_entries)
        raw = os.pread(self._fd(seg), 1, idx * ENTRY_SIZE + 1)
        return raw[0] if raw else 0

    def set_flags(self, seq: int, flags: int) -> None:
        if self._batch is not None and seq in self._batch:
            span, at = self._batch[seq]
            span.buf[at + 1] = flags
            span.touch(at + 1, at + 2)
            return
        seg, idx = divmod(seq, self.segment_entries)
        os.pwrite(self._fd(seg), bytes((flags,)), idx * ENTRY_SIZE + 1)
        self._dirty.add(seg)

    def set_run(self, first_seq: int, entries: list[tuple[MessageState, int, int, int]]) -> None:
        """Write consecutive entries from `first_seq` with as few syscalls as possible."""
        seq, i = first_seq, 0
        while i < len(entries):
            seg, idx = divmod(seq, self.segment_entries)
            n = min(len(entries) - i, self.segment_entries - idx)
            buf = b"".join(ENTRY.pack(st, 0, roll, size, off) for st, off, size, roll in entries[i:i + n])
            os.pwrite(self._fd(seg), buf, idx * ENTRY_SIZE)
            self._dirty.add(seg)
            seq, i = seq + n, i + n

    def flush(self) -> None:
        for fd in self.dirty_handles():
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def mark_all_dirty(self) -> None:
        self._dirty.update(self._fds)

    def dirty_handles(self) -> list[int]:
        """Duplicated fds of segments written since the last call (fsync them anywhere)."""
        fds = [os.dup(self._fds[seg]) for seg in self._dirty if seg in self._fds]
        self._dirty.clear()
        return fds

    def delete_before(self, seq: int) -> int:
        """Drop whole segments of entries below `seq` (all final and past retention)."""
        n = 0
        for path in sorted(self.directory.iterdir()):
            if path.name.isdigit() and (int(path.name) + 1) * self.segment_entries <= seq:
                fd = self._fds.pop(int(path.name), None)
                if fd is not None:
                    os.close(fd)
                path.unlink()
                n += 1
        return n

    def segments(self) -> list[int]:
        return [int(p.name) for p in self.directory.iterdir() if p.name.isdigit()]

    def blocker(self, segment: int, offset: int) -> tuple[str, int] | None:
        """Why `segment` cannot be dropped yet: ("pending", seq) for a scheduled message,
        ("record", seq) for a final message whose record is at or after `offset`; None
        when every entry is final and its record is gone."""
        fd = self._fd(segment)
        pos, size = 0, self.segment_entries * ENTRY_SIZE
        first = segment * self.segment_entries
        while pos < size:
            buf = os.pread(fd, 1 << 20, pos)
            if not buf:
                break
            for i, (state, _f, _r, _s, off) in enumerate(ENTRY.iter_unpack(buf[:len(buf) - len(buf) % ENTRY_SIZE])):
                if state == MessageState.SCHEDULED:
                    return "pending", first + (pos // ENTRY_SIZE) + i
                if state and off >= offset:
                    return "record", first + (pos // ENTRY_SIZE) + i
            pos += len(buf)
        return None

    def delete_segment(self, segment: int) -> int:
        fd = self._fds.pop(segment, None)
        if fd is not None:
            os.close(fd)
        self._dirty.discard(segment)
        path = self.directory / f"{segment:020d}"
        if path.exists():
            path.unlink()
            return 1
        return 0

    def reset(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for path in self.directory.iterdir():
            path.unlink()

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.directory.iterdir())

    def close(self) -> None:
        self.flush()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
