"""A directory of append-only segment files addressed by one global byte offset.

Each segment is named by the 20-digit global offset of its first byte, so a directory
listing is the index: ``00000000000000000000``, ``00000000000067108864``, ...
A write never spans two segments: when the next chunk does not fit, the current segment is
fsynced and closed and a new one starts at the current end offset. There is no filler; a
segment simply ends where its last chunk ends.
"""

from __future__ import annotations

import bisect
import errno
import os
from pathlib import Path

from delayd.storage.errors import DiskFull, OffsetOutOfRange

NAME_DIGITS = 20


def segment_name(base: int) -> str:
    return f"{base:0{NAME_DIGITS}d}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Faults:
    """Fault injection for the reliability tests, off unless `DELAYD_FAULT_FILE` names a file.

    While that file contains `enospc`, every append fails as a full disk does: half the data
    is written, then ENOSPC (the worst case: `append` must cut the torn half off again). While
    it contains `fsync-eio`, fsync fails with EIO. The file is read on each call, so a test
    turns faults on and off in a running daemon by rewriting it; with no file set this costs
    one attribute check.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path

    def _active(self, fault: str) -> bool:
        if not self.path:
            return False
        try:
            with open(self.path) as f:
                return fault in f.read().split()
        except OSError:
            return False

    def clip(self, data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
        """What a write of `data` manages to store: all of it, or half while 'enospc'."""
        return data[:len(data) // 2] if self._active("enospc") else data

    def check_fsync(self) -> None:
        if self._active("fsync-eio"):
            raise OSError(errno.EIO, "Input/output error (injected fsync failure)")


FAULTS = Faults(os.environ.get("DELAYD_FAULT_FILE"))


def fsync_all(fds: list[int]) -> None:
    """fsync and close duplicated fds (safe to call from a worker thread)."""
    try:
        if fds:
            FAULTS.check_fsync()
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)


class SegmentedFile:
    """Append-only bytes over many files. Not thread-safe; one writer owns it."""

    def __init__(self, directory: Path, segment_bytes: int, *, unit: int = 1) -> None:
        if segment_bytes % unit:
            raise ValueError(f"segment_bytes {segment_bytes} is not a multiple of the unit size {unit}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.unit = unit
        self._bases: list[int] = sorted(
            int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and len(p.name) == NAME_DIGITS
        )
        self._read_fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        if not self._bases:
            self._bases = [0]
            self._create(0)
        last = self._bases[-1]
        self._write_fd = os.open(self._path(last), os.O_RDWR | os.O_CREAT, 0o644)
        self._write_base = last
        self._write_size = os.fstat(self._write_fd).st_size

    # -- geometry -------------------------------------------------------------------------------
    def _path(self, base: int) -> Path:
        return self.directory / segment_name(base)

    def _create(self, base: int) -> None:
        fd = os.open(self._path(base), os.O_RDWR | os.O_CREAT, 0o644)
        os.close(fd)
        fsync_dir(self.directory)

    @property
    def start(self) -> int:
        """Offset of the first retained byte."""
        return self._bases[0]

    @property
    def end(self) -> int:
        """Offset one past the last written byte: where the next append lands."""
        return self._write_base + self._write_size

    @property
    def bases(self) -> list[int]:
        return list(self._bases)

    def remaining(self) -> int:
        """Bytes that still fit in the current segment."""
        return self.segment_bytes - self._write_size

    def segment_of(self, offset: int) -> int:
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or offset > self.end:
            raise OffsetOutOfRange(f"offset {offset} outside [{self.start}, {self.end}]")
        return self._bases[i]

    def segment_end(self, base: int) -> int:
        """End offset of the data stored in the segment starting at `base`."""
        if base == self._write_base:
            return self.end
        return base + os.path.getsize(self._path(base))

    def disk_bytes(self) -> int:
        return sum(self.segment_end(b) - b for b in self._bases)

    # -- writing --------------------------------------------------------------------------------
    def roll(self) -> None:
        """Close the current segment (fsynced) and start a new one at the current end."""
        if self._write_size == 0:
            return
        os.fsync(self._write_fd)
        self._dirty.discard(self._write_base)
        os.close(self._write_fd)
        base = self.end
        self._create(base)
        self._bases.append(base)
        self._write_fd = os.open(self._path(base), os.O_RDWR | os.O_CREAT, 0o644)
        self._write_base = base
        self._write_size = 0

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write `data` wholly into one segment and return its global offset.

        Rolls first when it does not fit. On ENOSPC the partial write is cut off again, so
        the file never keeps half a chunk, and DiskFull is raised.
        """
        n = len(data)
        if n > self.remaining():
            self.roll()
        offset = self.end
        try:
            written = os.pwrite(self._write_fd, FAULTS.clip(data), self._write_size)
            if written != n:
                raise OSError(errno.ENOSPC, "short write")
        except OSError as e:
            os.ftruncate(self._write_fd, self._write_size)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(str(e)) from e
            raise
        self._write_size += n
        self._dirty.add(self._write_base)
        return offset

    def write_at(self, offset: int, data: bytes) -> None:
        """Overwrite bytes already written (used only for in-place flags, never to grow)."""
        base = self.segment_of(offset)
        if base == self._write_base:
            os.pwrite(self._write_fd, data, offset - base)
        else:
            # Cached readers are O_RDONLY; fsync through them still flushes this write.
            fd = os.open(self._path(base), os.O_WRONLY)
            try:
                os.pwrite(fd, data, offset - base)
            finally:
                os.close(fd)
        self._dirty.add(base)

    def mark_dirty(self) -> None:
        """After a failed fsync of `dirty_handles()`: the next call returns the segment being
        written again, so a later fsync covers what the failed one did not."""
        self._dirty.add(self._write_base)

    def mark_all_dirty(self) -> None:
        """Every segment counts as written: the next fsync covers them all."""
        self._dirty.update(self._bases)

    def flush(self) -> None:
        """fsync every segment written since the last flush."""
        fsync_all(self.dirty_handles())

    def dirty_handles(self) -> list[int]:
        """Duplicated fds of the segments written since the last call, for `fsync_all` in
        another thread: a segment rolled meanwhile cannot close them under the fsync."""
        fds = []
        for base in sorted(self._dirty):
            if base == self._write_base:
                fds.append(os.dup(self._write_fd))
            elif base in self._bases:
                fds.append(os.dup(self._reader(base)))
        self._dirty.clear()
        return fds

    def truncate(self, offset: int) -> int:
        """Drop every byte at or after `offset`; returns how many bytes were cut."""
        if offset >= self.end:
            return 0
        cut = self.end - offset
        base = self.segment_of(offset)
        for b in [b for b in self._bases if b > base]:
            self._close_reader(b)
            if b == self._write_base:
                os.close(self._write_fd)
            self._path(b).unlink()
            self._bases.remove(b)
        if self._write_base != base:
            self._write_base = base
            self._close_reader(base)
            self._write_fd = os.open(self._path(base), os.O_RDWR)
        os.ftruncate(self._write_fd, offset - base)
        os.fsync(self._write_fd)
        self._write_size = offset - base
        return cut

    def reset(self, offset: int) -> None:
        """Delete everything and continue at `offset` (offsets stay monotonic for the directory)."""
        for b in list(self._bases):
            self._close_reader(b)
            self._path(b).unlink(missing_ok=True)
        os.close(self._write_fd)
        offset -= offset % self.unit
        self._create(offset)
        self._bases = [offset]
        self._write_base = offset
        self._write_fd = os.open(self._path(offset), os.O_RDWR)
        self._write_size = 0

    def delete_before(self, offset: int) -> list[int]:
        """Delete whole segments that end at or before `offset`; never the one being written."""
        gone = []
        while len(self._bases) > 1 and self.segment_end(self._bases[0]) <= offset \
                and self._bases[1] <= offset:
            b = self._bases.pop(0)
            self._close_reader(b)
            self._path(b).unlink(missing_ok=True)
            gone.append(b)
        return gone

    # -- reading --------------------------------------------------------------------------------
    def _reader(self, base: int) -> int:
        fd = self._read_fds.get(base)
        if fd is None:
            fd = os.open(self._path(base), os.O_RDONLY)
            self._read_fds[base] = fd
        return fd

    def _close_reader(self, base: int) -> None:
        fd = self._read_fds.pop(base, None)
        if fd is not None:
            os.close(fd)

    def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes at `offset`, never crossing the end of that segment."""
        base = self.segment_of(offset)
        fd = self._write_fd if base == self._write_base else self._reader(base)
        return os.pread(fd, size, offset - base)

    def close(self) -> None:
        self.flush()
        for b in list(self._read_fds):
            self._close_reader(b)
        os.close(self._write_fd)
