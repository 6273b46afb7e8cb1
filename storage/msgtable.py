"""The message table: one fixed-size entry per message sequence number.

It answers "where is message N now, and is it still pending?" without any per-message
Python object: entries live in segment files read and written with pread/pwrite, so memory
stays flat however many messages are scheduled. Entry `seq` is entry `seq % segment_entries`
of segment file `seq // segment_entries` (named by that number, 20 digits), at byte
`header_len + (seq % segment_entries) * ENTRY_SIZE`.

    offset size  field       type  meaning
    ------ ----  ----------  ----  --------------------------------------------------------
       0     1   state       u8    MessageState
       1     1   flags       u8    storage.schedule.Placed bits (where the message is counted in
                                   the schedule); 0 when written
       2     2   roll_count  u16   roll copy that is current
       4     4   size        u32   length of the current commit-log record
       8     8   offset      i64   current commit-log record (original or latest roll copy)

Segment header (format version 2; see storage.segments for the shared layout):

    offset size  field       type  meaning
    ------ ----  ----------  ----  --------------------------------------------------------
       0     8   magic       8s    b"DLMSGTB\\xff" (MSGTABLE_FORMAT.magic)
       8     2   version     u16   2
      10     2   header_len  u16   32
      12     4   unit_size   u32   ENTRY_SIZE (16)
      16     8   base        u64   the segment's number (its file name)
      24     4   reserved    u32   0
      28     4   crc         u32   crc32 of bytes [0, 28)

Hot paths (enqueue-put, dequeue) bracket their work in `begin_batch`/`end_batch`: the entries of
a batch are read with one pread per run of nearby seqs and written back with one pwrite, instead
of a syscall per message. A release batch goes in deliver_at order, so its seqs are scattered
over the table (a burst due in one second: a run per message); it asks for `mapped` runs: the
batch then works on a shared read-write mapping of the segment, no read and no write-back, its
pages made durable by the same fsync as the pwrites. Only entries the file already holds are
mapped, and a release stores only into entries that indexing wrote (their blocks are allocated:
a store through the mapping never needs disk space, which on a full disk would be a SIGBUS
rather than an error); runs past the file's end are read and written as before.

The table is derived data: recovery rebuilds what the checkpoint does not cover from the
commit log (MESSAGE/ROLL/CANCEL records) and the ready queues (deliveries).

Version history: 1 — original, segments without a header (still read: a version-1 segment
starts with an entry, whose state byte is at most 3); 2 — the 32-byte segment header.
"""

from __future__ import annotations

import bisect
import enum
import mmap
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from delayd.storage.bytetable import ByteTable
from delayd.storage.segments import (
    SEGMENT_HEADER_SIZE,
    SegmentFormat,
    list_segments,
    open_fd,
    read_header,
    segment_name,
)

ENTRY = ByteTable("<BBHIq")
ENTRY_SIZE = ENTRY.size
assert ENTRY_SIZE == 16
SEGMENT_ENTRIES = 1 << 20


class MessageState(enum.IntEnum):
    UNKNOWN = 0
    SCHEDULED = 1
    DELIVERED = 2
    CANCELLED = 3


MSGTABLE_VERSION = 2
MSGTABLE_FORMAT = SegmentFormat("message table", b"DLMSGTB\xff", MSGTABLE_VERSION, ENTRY_SIZE,
                                legacy=lambda first: first[0] <= max(MessageState))
_STATES = tuple(MessageState)  # state byte -> MessageState without the (slow) Enum call
_UNKNOWN_ENTRY = (MessageState.UNKNOWN, -1, 0, 0)
BATCH_GAP = 256  # seqs this close share one read in a batch
MAP_KEEP = 2  # segments kept mapped for begin_runs(mapped=True), least recently used dropped


class _Span:
    """Entries [first, first + len(buf) // 16) of one segment, held in memory by a batch; `base` is
    the seq of its first entry (the compiled batch core finds entries by it)."""
    __slots__ = ("seg", "first", "base", "buf", "valid", "lo", "hi", "mapped")

    def __init__(self, seg: int, first: int, base: int, buf: bytearray, valid: int, mapped: bool = False) -> None:
        self.seg, self.first, self.base, self.buf, self.valid = seg, first, base, buf, valid
        self.lo, self.hi = len(buf), 0  # changed bytes [lo, hi)
        self.mapped = mapped  # buf is a view of the segment's mapping: nothing to write back

    def touch(self, lo: int, hi: int) -> None:
        if lo < self.lo:
            self.lo = lo
        if hi > self.hi:
            self.hi = hi
            if hi > self.valid:
                self.valid = hi


def _span_base(span: _Span) -> int:
    return span.base


class MessageTable:
    """With `readonly`, nothing is created or written (inspection next to a live daemon)."""

    def __init__(self, directory: Path, segment_entries: int = SEGMENT_ENTRIES, *, readonly: bool = False) -> None:
        self.directory = Path(directory)
        self.readonly = readonly
        if not readonly:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_entries = segment_entries
        self._fds: dict[int, int] = {}
        self._hdr: dict[int, int] = {}  # segment -> bytes before entry 0 (0: a version-1 file)
        self._dirty: set[int] = set()
        self._batch = False  # between begin_batch and end_batch
        self._spans: list[_Span] = []  # the batch's copies, sorted by seq
        self._bases: list[int] = []  # their first seqs
        self._maps: dict[int, mmap.mmap] = {}  # segment -> shared mapping of the entries it held then
        self._used: set[int] = set()  # segments mapped for a batch since the last unmap_idle

    def _path(self, segment: int) -> Path:
        return self.directory / segment_name(segment)

    # -- batches: the same reads and writes, a few syscalls for many entries ------------------
    def begin_batch(self, seqs: Iterable[int], mapped: bool = False) -> None:
        """Read the entries of `seqs` with one pread per run of nearby seqs. Until `end_batch`,
        get/set/set_state/flags/set_flags of seqs the runs cover work on the copy in memory (others
        go to the file as usual); `end_batch` writes the changed bytes back, one pwrite per run."""
        ordered = sorted(set(seqs))
        per = self.segment_entries
        runs = []
        i = 0
        while i < len(ordered):
            seg = ordered[i] // per
            j = i + 1
            while j < len(ordered) and ordered[j] // per == seg and ordered[j] - ordered[j - 1] <= BATCH_GAP:
                j += 1
            runs.append((seg, ordered[i] % per, ordered[j - 1] % per))
            i = j
        self.begin_runs(runs, mapped)

    def begin_runs(self, runs: Iterable[tuple[int, int, int]], mapped: bool = False) -> None:
        """begin_batch for runs already cut — (segment, first index, last index), sorted, as the
        compiled batch core's `seq_runs` cuts a batch's seqs — and `spans` hands the copies to it.
        `mapped`: a segment whose runs the file holds wholly is one span over its mapping."""
        self.end_batch()
        per = self.segment_entries
        runs = list(runs)
        whole: dict[int, int] = {}  # segment -> the last entry a run of it needs
        if mapped and not self.readonly:
            for seg, _lo, hi in runs:
                whole[seg] = max(hi, whole.get(seg, hi))
            for seg, last in whole.items():
                span = self._mapped_span(seg, last)
                if span is not None:
                    self._spans.append(span)
            mapped_segs = {s.seg for s in self._spans}  # the others' runs are read below
            runs = [r for r in runs if r[0] not in mapped_segs]
        for seg, lo, hi in runs:
            fd = self._open(seg, create=False)
            if fd is None:
                continue
            raw = os.pread(fd, (hi - lo + 1) * ENTRY_SIZE, self._hdr[seg] + lo * ENTRY_SIZE)
            buf = bytearray(raw)
            buf.extend(bytes((hi - lo + 1) * ENTRY_SIZE - len(raw)))
            self._spans.append(_Span(seg, lo, seg * per + lo, buf, len(raw)))
        self._spans.sort(key=_span_base)
        self._bases = [s.base for s in self._spans]
        self._batch = True

    def _mapped_span(self, seg: int, last: int) -> _Span | None:
        """A span over the mapping of segment `seg`, when the file holds entry `last` (mapped
        again if it has grown since); None when it does not, or it cannot be mapped now."""
        mm = self._maps.pop(seg, None)
        hdr = self._hdr.get(seg, 0)
        if mm is None or len(mm) < hdr + (last + 1) * ENTRY_SIZE:
            fd = self._open(seg, create=False)
            if fd is None:
                return None
            hdr = self._hdr[seg]
            size = os.fstat(fd).st_size
            n = min((size - hdr) // ENTRY_SIZE, self.segment_entries)
            if n <= last:
                return None
            try:
                mm = mmap.mmap(fd, hdr + n * ENTRY_SIZE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except (OSError, ValueError):
                return None
            while len(self._maps) >= MAP_KEEP:
                del self._maps[next(iter(self._maps))]
        self._maps[seg] = mm
        self._used.add(seg)
        view = memoryview(mm)[hdr:]
        return _Span(seg, 0, seg * self.segment_entries, view, len(view), mapped=True)  # type: ignore[arg-type]

    def unmap_idle(self) -> None:
        """Unmap the segments no batch used since the last call (their pages leave the RSS)."""
        for seg in [s for s in self._maps if s not in self._used]:
            del self._maps[seg]
        self._used.clear()

    @property
    def spans(self) -> list[_Span]:
        """The batch's spans, sorted by seq (what the compiled batch functions take)."""
        return self._spans

    def _find(self, seq: int) -> tuple[_Span, int] | None:
        """The span (and byte offset in it) holding `seq`'s entry in the current batch."""
        i = bisect.bisect_right(self._bases, seq) - 1
        if i < 0:
            return None
        span = self._spans[i]
        at = (seq - span.base) * ENTRY_SIZE
        return (span, at) if at < len(span.buf) else None

    def end_batch(self) -> None:
        try:
            for span in self._spans:
                if span.lo < span.hi and span.mapped:
                    self._dirty.add(span.seg)  # stored through the mapping: the fsync covers it
                elif span.lo < span.hi:
                    os.pwrite(self._fd(span.seg), span.buf[span.lo:span.hi],
                              self._hdr[span.seg] + span.first * ENTRY_SIZE + span.lo)
                    self._dirty.add(span.seg)
        finally:
            self._spans = []
            self._bases = []
            self._batch = False

    def _open(self, segment: int, create: bool) -> int | None:
        """The segment's fd (cached), creating the file with its header when `create`; None
        when it does not exist and may not be created."""
        fd = self._fds.get(segment)
        if fd is not None:
            return fd
        path = self._path(segment)
        if self.readonly or not create:
            if not path.exists():
                return None
            hdr, _n = read_header(MSGTABLE_FORMAT, path, segment)
            fd = open_fd(path, os.O_RDONLY if self.readonly else os.O_RDWR)
        else:
            fd = open_fd(path, os.O_RDWR | os.O_CREAT)
            try:
                size = os.fstat(fd).st_size
                if size < SEGMENT_HEADER_SIZE and (size == 0 or os.pread(fd, 8, 0) == MSGTABLE_FORMAT.magic[:size]):
                    # New (or torn while its header was written): the header goes first.
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, MSGTABLE_FORMAT.pack(segment), 0)
                    hdr = SEGMENT_HEADER_SIZE
                else:
                    hdr, _n = read_header(MSGTABLE_FORMAT, path, segment)
            except BaseException:
                os.close(fd)
                raise
        self._fds[segment] = fd
        self._hdr[segment] = hdr
        return fd

    def prepare(self, first_seq: int, last_seq: int) -> None:
        """Open (creating) the segments that entries first_seq..last_seq go to: done before the
        commit-log append of a produce, so running out of descriptors stops it before anything
        is stored rather than after."""
        for seg in range(first_seq // self.segment_entries, last_seq // self.segment_entries + 1):
            self._fd(seg)

    def _fd(self, segment: int) -> int:
        fd = self._open(segment, create=True)
        assert fd is not None
        return fd

    def get(self, seq: int) -> tuple[MessageState, int, int, int]:
        """(state, offset, size, roll_count); UNKNOWN when never written or deleted."""
        if self._batch:
            hit = self._find(seq)
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
            fd = self._open(seg, create=False)
            if fd is None:
                return _UNKNOWN_ENTRY
        raw = os.pread(fd, ENTRY_SIZE, self._hdr[seg] + idx * ENTRY_SIZE)
        if len(raw) < ENTRY_SIZE:
            return _UNKNOWN_ENTRY
        state, _f, roll, size, offset = ENTRY.unpack(raw)
        if state >= len(_STATES):
            return _UNKNOWN_ENTRY
        return _STATES[state], offset, size, roll

    def has_entry(self, seq: int) -> bool:
        """Whether the segment file of `seq` exists and reaches its entry (written or not)."""
        seg, idx = divmod(seq, self.segment_entries)
        fd = self._open(seg, create=False)
        return fd is not None and os.fstat(fd).st_size >= self._hdr[seg] + (idx + 1) * ENTRY_SIZE

    def set(self, seq: int, state: MessageState, offset: int, size: int, roll_count: int = 0) -> None:
        hit = self._find(seq) if self._batch else None
        if hit is not None:
            span, at = hit
            ENTRY.pack_into(span.buf, at, state, 0, roll_count, size, offset)
            span.touch(at, at + ENTRY_SIZE)
            return
        seg, idx = divmod(seq, self.segment_entries)
        fd = self._fd(seg)
        os.pwrite(fd, ENTRY.pack(state, 0, roll_count, size, offset), self._hdr[seg] + idx * ENTRY_SIZE)
        self._dirty.add(seg)

    def set_state(self, seq: int, state: MessageState) -> None:
        hit = self._find(seq) if self._batch else None
        if hit is not None:
            span, at = hit
            span.buf[at] = state
            span.touch(at, at + 1)
            return
        seg, idx = divmod(seq, self.segment_entries)
        fd = self._fd(seg)
        os.pwrite(fd, bytes((state,)), self._hdr[seg] + idx * ENTRY_SIZE)
        self._dirty.add(seg)

    def flags(self, seq: int) -> int:
        """The entry's flags byte (storage.schedule.Placed bits), 0 when never written."""
        hit = self._find(seq) if self._batch else None
        if hit is not None:
            span, at = hit
            return span.buf[at + 1] if at + 2 <= span.valid else 0
        seg, idx = divmod(seq, self.segment_entries)
        fd = self._open(seg, create=False)
        if fd is None:
            return 0
        raw = os.pread(fd, 1, self._hdr[seg] + idx * ENTRY_SIZE + 1)
        return raw[0] if raw else 0

    def set_flags(self, seq: int, flags: int) -> None:
        hit = self._find(seq) if self._batch else None
        if hit is not None:
            span, at = hit
            span.buf[at + 1] = flags
            span.touch(at + 1, at + 2)
            return
        seg, idx = divmod(seq, self.segment_entries)
        fd = self._fd(seg)
        os.pwrite(fd, bytes((flags,)), self._hdr[seg] + idx * ENTRY_SIZE + 1)
        self._dirty.add(seg)

    def write_entries(self, first_seq: int, entries: bytes) -> None:
        """Write packed entries (16 bytes each) of consecutive seqs from `first_seq`: one pwrite
        per segment they span."""
        seq, i, n = first_seq, 0, len(entries) // ENTRY_SIZE
        while i < n:
            seg, idx = divmod(seq, self.segment_entries)
            k = min(n - i, self.segment_entries - idx)
            fd = self._fd(seg)
            os.pwrite(fd, entries[i * ENTRY_SIZE:(i + k) * ENTRY_SIZE], self._hdr[seg] + idx * ENTRY_SIZE)
            self._dirty.add(seg)
            seq, i = seq + k, i + k

    def set_run(self, first_seq: int, entries: list[tuple[MessageState, int, int, int]]) -> None:
        """Write consecutive entries from `first_seq` with as few syscalls as possible."""
        seq, i = first_seq, 0
        while i < len(entries):
            seg, idx = divmod(seq, self.segment_entries)
            n = min(len(entries) - i, self.segment_entries - idx)
            buf = b"".join(ENTRY.pack(st, 0, roll, size, off) for st, off, size, roll in entries[i:i + n])
            fd = self._fd(seg)
            os.pwrite(fd, buf, self._hdr[seg] + idx * ENTRY_SIZE)
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
        fds: list[int] = []
        try:
            for seg in self._dirty:
                if seg in self._fds:
                    fds.append(os.dup(self._fds[seg]))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        self._dirty.clear()
        return fds

    def segments(self) -> list[int]:
        return list_segments(self.directory)

    def entries(self, segment: int) -> Iterator[tuple[int, int, int, int, int, int]]:
        """(seq, state, flags, roll_count, size, offset) of every entry of one segment whose
        state byte is not 0, read in large chunks (retention, `delayd check`/`dump`)."""
        fd = self._open(segment, create=False)
        if fd is None:
            return
        first = segment * self.segment_entries
        pos, hdr = 0, self._hdr[segment]
        while pos < self.segment_entries * ENTRY_SIZE:
            buf = os.pread(fd, 1 << 20, hdr + pos)
            if len(buf) < ENTRY_SIZE:
                return
            for i, (state, flags, roll, size, off) in enumerate(ENTRY.iter_unpack(buf[:len(buf) - len(buf) % ENTRY_SIZE])):
                if state:
                    yield first + pos // ENTRY_SIZE + i, state, flags, roll, size, off
            pos += len(buf) - len(buf) % ENTRY_SIZE

    def blocker(self, segment: int, offset: int) -> tuple[str, int] | None:
        """Why `segment` cannot be dropped yet: ("pending", seq) for a scheduled message,
        ("record", seq) for a final message whose record is at or after `offset`; None
        when every entry is final and its record is gone."""
        for seq, state, _f, _r, _s, off in self.entries(segment):
            if state == MessageState.SCHEDULED:
                return "pending", seq
            if off >= offset:
                return "record", seq
        return None

    def delete_segment(self, segment: int) -> int:
        self._maps.pop(segment, None)
        fd = self._fds.pop(segment, None)
        if fd is not None:
            os.close(fd)
        self._hdr.pop(segment, None)
        self._dirty.discard(segment)
        path = self._path(segment)
        if path.exists():
            path.unlink()
            return 1
        return 0

    def delete_before(self, seq: int) -> int:
        """Drop whole segments of entries below `seq` (all final and past retention)."""
        return sum(self.delete_segment(seg) for seg in self.segments() if (seg + 1) * self.segment_entries <= seq)

    def reset(self) -> None:
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._hdr.clear()
        self._dirty.clear()
        for seg in self.segments():
            self._path(seg).unlink()

    def disk_bytes(self) -> int:
        return sum(self._path(seg).stat().st_size for seg in self.segments())

    def close(self) -> None:
        if not self.readonly:
            self.flush()
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
