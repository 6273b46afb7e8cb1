"""A directory of append-only segment files addressed by one global byte offset.

Each segment is named by the 20-digit global offset of its first data byte, so a directory
listing is the index: ``00000000000000000000``, ``00000000000067108864``, ...
A write never spans two segments: when the next chunk does not fit, the current segment is
closed and a new one starts at the current end offset. There is no filler; a segment simply ends
where its last chunk ends. The closed segment is fsynced then (the commit log), or, for files
durable at checkpoints (TimerLog, ready queues: `sync_on_roll=False`), by the next checkpoint.

Segments of fixed-size units (TimerLog, ready queues, message table) start with a header that
is *not* part of the global offset space: data offset `o` of the segment at `base` lives at file
position `header_len + (o - base)`. Header, format version 2 (version 1 had none):

    offset size  field       type  meaning
    ------ ----  ----------  ----  --------------------------------------------------------
       0     8   magic       8s    SegmentFormat.magic of the structure; its byte 7 has the top
                                   bit set, which no version-1 file can start with (see below)
       8     2   version     u16   the structure's format version (2)
      10     2   header_len  u16   bytes before the first unit (32; a later version may grow it)
      12     4   unit_size   u32   bytes per unit: a file of another geometry is refused
      16     8   base        u64   the segment's global base offset (its name), for sanity
      24     4   reserved    u32   0
      28     4   crc         u32   crc32 of bytes [0, 28)

Version 1 (header-less) files still open: a file that does not start with the magic is read as
version 1 when its first bytes are what a version-1 unit has there (`SegmentFormat.legacy`),
else it is damage (BadMagic). Nothing is rewritten: old segments stay version 1 until retention
deletes them, and every segment created from now on is version 2.
"""

from __future__ import annotations

import bisect
import errno
import logging
import mmap
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from delayd.storage.bytetable import ByteTable
from delayd.storage.errors import (
    BadMagic,
    ChecksumMismatch,
    DiskFull,
    Insane,
    OffsetOutOfRange,
    OutOfDescriptors,
    UnsupportedVersion,
)

log = logging.getLogger("delayd.storage")

NAME_DIGITS = 20
SEGMENT_HEADER = ByteTable("<8sHHIQII")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size
assert SEGMENT_HEADER_SIZE == 32
_CRC_SPAN = 28  # the header's crc covers the bytes before it
NO_HEADER_VERSION = 1  # a segment without a header is version 1
MAP_KEEP = 4  # segments a SegmentedFile keeps mapped for view()
DESCRIPTOR_ERRNOS = (errno.EMFILE, errno.ENFILE)


def segment_name(base: int) -> str:
    return f"{base:0{NAME_DIGITS}d}"


def list_segments(directory: Path) -> list[int]:
    """Bases of the segment files in `directory`, in order (other files are ignored); [] when
    the directory does not exist. The one place segment files are listed."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as e:
        if e.errno in DESCRIPTOR_ERRNOS:
            raise OutOfDescriptors(f"cannot list {directory}: {e.strerror}") from e
        raise
    return sorted(int(n) for n in names if len(n) == NAME_DIGITS and n.isdigit())


def fsync_dir(path: Path) -> None:
    fd = open_fd(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes, keep_previous: Path | None = None) -> None:
    """Write a small file atomically: a temp file beside it, fsync, rename over `path` (moving the
    old one to `keep_previous` first, when given), fsync of the directory. A crash leaves the old
    file or the new one, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if keep_previous is not None and path.exists():
        os.replace(path, keep_previous)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def open_fd(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """os.open that reports running out of descriptors as OutOfDescriptors (the daemon answers
    503 and carries on, instead of failing on a bare OSError)."""
    try:
        return os.open(path, flags, mode)
    except OSError as e:
        if e.errno in DESCRIPTOR_ERRNOS:
            raise OutOfDescriptors(f"cannot open {path}: {e.strerror}") from e
        raise


# ------------------------------------------------------------------------------ headers

@dataclass(frozen=True, slots=True)
class SegmentFormat:
    """The header one structure's segments carry (see the module's byte table)."""
    name: str  # for messages: "TimerLog", "ready queue", "message table"
    magic: bytes  # 8 bytes, byte 7 >= 0x80
    version: int  # the version this build writes, and the newest it reads
    unit_size: int
    legacy: Callable[[bytes], bool]  # may a version-1 (header-less) file start with these 8 bytes?

    def pack(self, base: int) -> bytes:
        head = SEGMENT_HEADER.pack(self.magic, self.version, SEGMENT_HEADER_SIZE, self.unit_size, base, 0, 0)
        return head[:_CRC_SPAN] + struct.pack("<I", zlib.crc32(head[:_CRC_SPAN]))


def parse_header(fmt: SegmentFormat, head: bytes, base: int, where: str) -> int:
    """Bytes before the first unit of a segment whose file starts with `head` (at least 8 bytes
    of it, or all of a shorter file): 0 for a version-1 file. Validated magic → version → CRC
    → sanity, each with its own exception."""
    if head[:8] != fmt.magic:
        if fmt.legacy(head[:8]):
            return 0
        raise BadMagic(f"{where}: not a {fmt.name} segment (starts {head[:8].hex()})")
    if len(head) < SEGMENT_HEADER_SIZE:
        raise Insane(f"{where}: header cut at {len(head)} bytes")
    _magic, version, header_len, unit_size, hbase, _r, crc = SEGMENT_HEADER.unpack_from(head)
    if version > fmt.version:
        raise UnsupportedVersion(where, version, fmt.version)
    if version <= NO_HEADER_VERSION:
        raise Insane(f"{where}: header says version {version}, which has no header")
    if zlib.crc32(head[:_CRC_SPAN]) != crc:
        raise ChecksumMismatch(f"{where}: header crc")
    if unit_size != fmt.unit_size or hbase != base or not SEGMENT_HEADER_SIZE <= header_len <= len(head):
        raise Insane(f"{where}: header says unit {unit_size} at base {hbase} with {header_len} header bytes; "
                     f"expected unit {fmt.unit_size} at base {base}")
    return header_len


def read_header(fmt: SegmentFormat, path: Path, base: int) -> tuple[int, int]:
    """(header length, data bytes) of one segment file, read-only. An empty file, or one cut
    inside a header it was getting, counts as an empty segment of the current version."""
    fd = open_fd(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
    finally:
        os.close(fd)
    if size == 0:
        return 0, 0
    if len(head) < 8 or (head[:8] == fmt.magic and size < SEGMENT_HEADER_SIZE):
        # Torn at creation: the header was being written. Nothing of it is data.
        return size, 0
    n = parse_header(fmt, head, base, str(path))
    return n, size - n


# ------------------------------------------------------------------------------ fault injection

class Faults:
    """Fault injection for the reliability tests, off unless `DELAYD_FAULT_FILE` names a file.

    While that file contains `enospc`, every append fails as a full disk does: half the data
    is written, then ENOSPC (the worst case: `append` must cut the torn half off again);
    `enospc@NAME` does the same only for segment directories named NAME (`enospc@timerlog`: the
    commit log takes produces while indexing cannot write, as when files compete for the last
    space). While it contains `fsync-eio`, fsync fails with EIO. The file is read on each call, so
    a test turns faults on and off in a running daemon by rewriting it; with no file set this
    costs one attribute check.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path

    def _active(self, *faults: str) -> bool:
        if not self.path:
            return False
        try:
            with open(self.path) as f:
                return not set(faults).isdisjoint(f.read().split())
        except OSError:
            return False

    def clip(self, data: bytes | bytearray | memoryview, where: str = "") -> bytes | bytearray | memoryview:
        """What a write of `data` (into directory `where`) manages to store: all of it, or half
        while 'enospc' (or 'enospc@where')."""
        return data[:len(data) // 2] if self._active("enospc", f"enospc@{where}") else data

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


# ------------------------------------------------------------------------------ the segmented file

class SegmentedFile:
    """Append-only bytes over many files. Not thread-safe; one writer owns it.

    With `readonly`, nothing is created, written or cut (the read-only decoder and `delayd
    check` use it next to a live daemon): appends are refused and the end is what the files
    hold now.
    """

    def __init__(self, directory: Path, segment_bytes: int, *, unit: int = 1, fmt: SegmentFormat | None = None,
                 readonly: bool = False, checkpoint_taker: bool = False, sync_on_roll: bool = True) -> None:
        if segment_bytes % unit:
            raise ValueError(f"segment_bytes {segment_bytes} is not a multiple of the unit size {unit}")
        self.directory = Path(directory)
        self._name = self.directory.name  # for fault injection (Faults.clip)
        self.readonly = readonly
        if not readonly:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.unit = unit
        self.fmt = fmt
        self._bases: list[int] = list_segments(self.directory)
        self._hdr: dict[int, int] = {}  # base -> header bytes before its data (0: version 1)
        self._sizes: dict[int, int] = {}  # data bytes of closed segments
        self._read_fds: dict[int, int] = {}
        self._maps: dict[int, mmap.mmap] = {}  # segment base -> read-only mapping, least recently used first
        self._viewed: set[int] = set()  # segments viewed since the last unmap_idle
        # Segments written and not yet handed out for an fsync, per taker: `dirty_handles` (the
        # group commit's, `flush`) and, with `checkpoint_taker`, `checkpoint_handles` (a
        # checkpoint's fsync, in another thread). Each takes only its own: a checkpoint that took
        # a segment must not leave the group commit with nothing to fsync for an append it has to
        # make durable before answering.
        self._dirty: set[int] = set()
        self._dirty_cp: set[int] | None = set() if checkpoint_taker else None
        # A roll fsyncs the segment it closes (the commit log: recovery trusts a closed
        # segment). Without `sync_on_roll` (derived files, durable at checkpoints) the closed
        # segment stays dirty for the next taker, and the roll costs the writer no fsync of it.
        self.sync_on_roll = sync_on_roll
        for b in self._bases:
            if fmt is None:
                self._hdr[b], self._sizes[b] = 0, os.path.getsize(self._path(b))
            else:
                self._hdr[b], self._sizes[b] = read_header(fmt, self._path(b), b)
        if readonly:
            self._write_fd = -1
            self._write_base = self._bases[-1] if self._bases else 0
            self._write_size = self._sizes.get(self._write_base, 0)
            return
        if not self._bases:
            self._bases = [0]
            self._create(0)
        last = self._bases[-1]
        self._write_fd = open_fd(self._path(last), os.O_RDWR | os.O_CREAT)
        self._write_base = last
        self._write_size = self._sizes.pop(last, 0)
        if fmt is not None and self._write_size == 0 and os.fstat(self._write_fd).st_size != self._hdr[last]:
            # An empty segment (or one torn while its header was written): give it a header now.
            os.ftruncate(self._write_fd, 0)
            self._write_header(self._write_fd, last)

    # -- geometry -------------------------------------------------------------------------------
    def _path(self, base: int) -> Path:
        return self.directory / segment_name(base)

    def _write_header(self, fd: int, base: int) -> None:
        if self.fmt is None:
            self._hdr[base] = 0
            return
        os.pwrite(fd, self.fmt.pack(base), 0)
        self._hdr[base] = SEGMENT_HEADER_SIZE

    def _create(self, base: int) -> None:
        fd = open_fd(self._path(base), os.O_RDWR | os.O_CREAT)
        try:
            self._write_header(fd, base)
            if self.fmt is not None:
                os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.directory)

    @property
    def start(self) -> int:
        """Offset of the first retained byte."""
        return self._bases[0] if self._bases else 0

    @property
    def end(self) -> int:
        """Offset one past the last written byte: where the next append lands."""
        return self._write_base + self._write_size

    @property
    def bases(self) -> list[int]:
        return list(self._bases)

    def header_len(self, base: int) -> int:
        """Bytes of the segment file at `base` before its first data byte (0: version 1)."""
        return self._hdr[base]

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
        return base + self._sizes[base]

    def disk_bytes(self) -> int:
        return sum(self.segment_end(b) - b + self._hdr[b] for b in self._bases)

    # -- writing --------------------------------------------------------------------------------
    def _writable(self) -> None:
        if self.readonly:
            raise PermissionError(f"{self.directory} is open read-only")

    def roll(self) -> None:
        """Close the current segment (fsynced, with `sync_on_roll`; else left to the next
        `dirty_handles`) and start a new one at the current end (its header fsynced)."""
        self._writable()
        if self._write_size == 0:
            return
        base = self.end
        self._create(base)  # first: if it fails (no descriptors, no space), nothing changed
        if self.sync_on_roll:
            os.fsync(self._write_fd)
            self._synced(self._write_base)
        os.close(self._write_fd)
        self._sizes[self._write_base] = self._write_size
        self._bases.append(base)
        self._write_fd = open_fd(self._path(base), os.O_RDWR | os.O_CREAT)
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
        at = self._hdr[self._write_base] + self._write_size
        try:
            written = os.pwrite(self._write_fd, FAULTS.clip(data, self._name), at)
            if written != n:
                raise OSError(errno.ENOSPC, "short write")
        except OSError as e:
            os.ftruncate(self._write_fd, at)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(str(e)) from e
            raise
        self._write_size += n
        self._written(self._write_base)
        return offset

    def write_at(self, offset: int, data: bytes) -> None:
        """Overwrite bytes already written (used only for in-place flags, never to grow)."""
        self._writable()
        base = self.segment_of(offset)
        at = offset - base + self._hdr[base]
        if base == self._write_base:
            os.pwrite(self._write_fd, data, at)
        else:
            # Cached readers are O_RDONLY; fsync through them still flushes this write.
            fd = open_fd(self._path(base), os.O_WRONLY)
            try:
                os.pwrite(fd, data, at)
            finally:
                os.close(fd)
        self._written(base)

    def _written(self, base: int) -> None:
        self._dirty.add(base)
        if self._dirty_cp is not None:
            self._dirty_cp.add(base)

    def _synced(self, base: int) -> None:
        self._dirty.discard(base)
        if self._dirty_cp is not None:
            self._dirty_cp.discard(base)

    def mark_dirty(self) -> None:
        """After a failed fsync of `dirty_handles()`: the next call returns the segment being
        written again, so a later fsync covers what the failed one did not."""
        self._dirty.add(self._write_base)

    def mark_all_dirty(self) -> None:
        """Every segment counts as written: the next fsync of each taker covers them all."""
        self._dirty.update(self._bases)
        if self._dirty_cp is not None:
            self._dirty_cp.update(self._bases)

    def flush(self) -> None:
        """fsync every segment written since the last flush (and since the last checkpoint's
        take: after a flush, neither taker has anything left to fsync)."""
        if self._dirty_cp is not None:
            self._dirty |= self._dirty_cp
            self._dirty_cp.clear()
        fsync_all(self.dirty_handles())

    def sync_in_place(self) -> None:
        """fsync every segment written since the last flush through the descriptors already
        open (no dup: for when the process has no descriptor to spare). Blocks the caller."""
        FAULTS.check_fsync()
        for base in sorted(self._dirty):
            if base == self._write_base:
                os.fsync(self._write_fd)
            elif base in self._read_fds:
                os.fsync(self._read_fds[base])
            else:
                continue  # not open: it stays dirty for the next flush
            self._dirty.discard(base)

    def has_dirty(self) -> bool:
        return bool(self._dirty)

    def dirty_paths(self) -> list[Path]:
        """Files of the segments written since the last `dirty_handles`/`flush`."""
        return [self._path(b) for b in sorted(self._dirty) if b in self._bases]

    def dirty_handles(self) -> list[int]:
        """Duplicated fds of the segments written since the last call, for `fsync_all` in
        another thread: a segment rolled meanwhile cannot close them under the fsync."""
        return self._take(self._dirty)

    def checkpoint_handles(self) -> list[int]:
        """`dirty_handles` of a checkpoint: the segments written since the checkpoint's last take,
        leaving the group commit's own (`dirty_handles`) as they are. Without `checkpoint_taker`,
        the one taker's."""
        return self._take(self._dirty if self._dirty_cp is None else self._dirty_cp)

    def _take(self, dirty: set[int]) -> list[int]:
        fds: list[int] = []
        try:
            for base in sorted(dirty):
                if base == self._write_base:
                    fds.append(os.dup(self._write_fd))
                elif base in self._bases:
                    fds.append(os.dup(self._reader(base)))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        dirty.clear()
        return fds

    def truncate(self, offset: int, why: str = "") -> int:
        """Drop every byte at or after `offset`; returns how many bytes were cut. Every cut is
        logged at WARNING with what went (offsets, bytes, files)."""
        self._writable()
        if offset >= self.end:
            return 0
        cut = self.end - offset
        base = self.segment_of(offset)
        removed = [b for b in self._bases if b > base]
        log.warning("%s: cut %d bytes [%d, %d) at file %s offset %d%s%s", self.directory, cut, offset, self.end,
                    segment_name(base), offset - base + self._hdr[base],
                    f", removed {len(removed)} later segment(s) {[segment_name(b) for b in removed]}" if removed else "",
                    f" ({why})" if why else "")
        for b in removed:
            self._close_reader(b)
            if b == self._write_base:
                os.close(self._write_fd)
            self._path(b).unlink()
            self._bases.remove(b)
            self._sizes.pop(b, None)
        if self._write_base != base:
            self._write_base = base
            self._sizes.pop(base, None)
            self._close_reader(base)
            self._write_fd = open_fd(self._path(base), os.O_RDWR)
        self._maps.pop(base, None)  # it maps bytes that are gone now
        os.ftruncate(self._write_fd, self._hdr[base] + offset - base)
        os.fsync(self._write_fd)
        self._write_size = offset - base
        return cut

    def reset(self, offset: int) -> None:
        """Delete everything and continue at `offset` (offsets stay monotonic for the directory)."""
        self._writable()
        for b in list(self._bases):
            self._close_reader(b)
            self._path(b).unlink(missing_ok=True)
        os.close(self._write_fd)
        offset -= offset % self.unit
        self._create(offset)
        self._bases = [offset]
        self._sizes = {}
        self._hdr = {offset: self._hdr[offset]}
        self._write_base = offset
        self._write_fd = open_fd(self._path(offset), os.O_RDWR)
        self._write_size = 0

    def delete_before(self, offset: int) -> list[int]:
        """Delete whole segments that end at or before `offset`; never the one being written."""
        self._writable()
        gone = []
        while len(self._bases) > 1 and self.segment_end(self._bases[0]) <= offset \
                and self._bases[1] <= offset:
            b = self._bases.pop(0)
            self._close_reader(b)
            self._path(b).unlink(missing_ok=True)
            self._sizes.pop(b, None)
            self._hdr.pop(b, None)
            self._synced(b)
            gone.append(b)
        return gone

    # -- reading --------------------------------------------------------------------------------
    def _reader(self, base: int) -> int:
        fd = self._read_fds.get(base)
        if fd is None:
            fd = open_fd(self._path(base), os.O_RDONLY)
            self._read_fds[base] = fd
        return fd

    def _close_reader(self, base: int) -> None:
        self._maps.pop(base, None)  # unmapped once no view of it is left
        fd = self._read_fds.pop(base, None)
        if fd is not None:
            os.close(fd)

    def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes at `offset`, never crossing the end of that segment."""
        base = self.segment_of(offset)
        if base == self._write_base and self._write_fd >= 0:
            return os.pread(self._write_fd, min(size, self.end - offset), offset - base + self._hdr[base])
        return os.pread(self._reader(base), min(size, self.segment_end(base) - offset),
                        offset - base + self._hdr[base])

    def view(self, offset: int, end: int) -> memoryview | None:
        """The bytes [offset, end) of one segment without a copy: a read-only view of the segment
        mapped into memory, or None when it cannot be mapped now (no descriptor or address space
        left, or the file is shorter than written): read() them then. Raises OffsetOutOfRange
        outside the log or across a segment's end, as read() does.

        A mapping covers the file as long as it was when mapped; a view past that (the segment
        being written has grown) maps it again. At most MAP_KEEP segments stay mapped (CPython's
        mmap holds a duplicate descriptor of each); a segment that is deleted, cut or closed is
        unmapped as soon as no view of it is left, and `unmap_idle` unmaps the segments no view
        needed for a while. Views are for the length of one batch call: a view kept longer
        keeps a deleted segment's disk space."""
        if self.readonly:
            return None  # a live daemon next to it may cut what a mapping would cover
        base = self.segment_of(offset)
        if not offset <= end <= self.segment_end(base):
            raise OffsetOutOfRange(f"[{offset}, {end}) crosses the end of segment {base}")
        hdr = self._hdr[base]
        mm = self._maps.pop(base, None)
        if mm is None or len(mm) < end - base + hdr:
            length = self.segment_end(base) - base + hdr
            try:
                fd = self._write_fd if base == self._write_base and self._write_fd >= 0 else self._reader(base)
                mm = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            except (OSError, ValueError, OutOfDescriptors):
                return None
            while len(self._maps) >= MAP_KEEP:
                del self._maps[next(iter(self._maps))]
        self._maps[base] = mm
        self._viewed.add(base)
        return memoryview(mm)[offset - base + hdr:end - base + hdr]

    def unmap_idle(self) -> None:
        """Unmap the segments not viewed since the last call (their pages leave the RSS)."""
        for base in [b for b in self._maps if b not in self._viewed]:
            del self._maps[base]
        self._viewed.clear()

    def close_readers(self) -> None:
        """Close the cached read descriptors (they are reopened on demand)."""
        self._maps.clear()
        for b in list(self._read_fds):
            self._close_reader(b)

    def close(self, sync: bool = True) -> None:
        """Close every descriptor; with `sync` (and writable) fsync what was written first."""
        if sync and not self.readonly:
            self.flush()
        self.close_readers()
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1
