"""The data directory: its lock, its layout, its identity, and the format check that runs
before anything is written.

    LOCK                   flock: one daemon per data directory
    meta                   this module: the directory's format version and node id
    commitlog/<20 digits>  the commit log (storage.commitlog) — the source of truth
    timerlog/<20 digits>   TimerLog units (storage.timerlog)
    timerwheel             the TimerWheel (storage.timerwheel)
    msgtable/<20 digits>   per-message state (storage.msgtable)
    ready/<topic>/<20 d.>  ready queues (storage.readyqueue)
    keys.sqlite            the key index (storage.keyindex)
    checkpoint(.prev)      storage.checkpoint

`meta`, format version 2 (written atomically: temp file, fsync, rename, fsync of the directory):

    offset size  field     type  meaning
    ------ ----  --------  ----  --------------------------------------------------
       0     4   magic     u32   META_MAGIC ("DLMD")
       4     2   version   u16   META_VERSION: the data directory's format version
       6     2   reserved  u16   0
       8     4   body_len  u32   length of the msgpack body
      12     4   crc       u32   crc32 of the body
      16     …   body      msgpack map: node_id (str), created_ms (int)

Version history (of the whole directory): 1 — no `meta` file; TimerLog, ready-queue and
message-table segments without a header. 2 — `meta`, and a header on every new segment of
those three (version-1 segments are still read). 3 — RELEASE records in the commit log
(storage.commitlog), from which the ready queues are derived, and the `epochs` file of a
replicated shard (storage.epochs); a version-2 directory is upgraded on open by rewriting `meta`
(its log simply has no RELEASE records yet: the queues it has are kept as they are), while a
version-2 build refuses a version-3 directory instead of reading RELEASE records as damage. A build that changes any file format bumps
META_VERSION first, so an older build refuses the directory before reading anything else.

Opening (`DataDir.open`) takes the LOCK, then checks the version of every file an older build
could misread (`check_formats`: meta, checkpoints, wheel, key index, every segment header) —
reading only: data of a newer version is refused (UnsupportedVersion) with nothing on disk
changed. Only then is `meta` written (first start, or a version-1 directory).

Node id: message ids are `{node_id}-{seq}`, so the node id must not change under the ids a
directory issued. It is recorded in `meta` at the first start: the configured one, else a
generated one (`n` + 6 hex digits), except that a version-1 directory that holds data keeps
`d`, the old default, so its issued ids stay valid. A configured node id that differs from the
recorded one is refused (NodeIdMismatch).
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgpack
from delayd.storage import checkpoint as ckpt
from delayd.storage import epochs
from delayd.storage.bytetable import ByteTable
from delayd.storage.errors import (
    BadMagic,
    ChecksumMismatch,
    CorruptData,
    DataDirInUse,
    Insane,
    NodeIdMismatch,
    UnsupportedVersion,
)
from delayd.storage.farindex import FARINDEX_VERSION
from delayd.storage.keyindex import KEYINDEX_VERSION, stored_version
from delayd.storage.msgtable import MSGTABLE_FORMAT
from delayd.storage.readyqueue import READY_FORMAT
from delayd.storage.segments import SegmentFormat, list_segments, read_header, replace_file, segment_name
from delayd.storage.timerlog import TIMERLOG_FORMAT
from delayd.storage.timerwheel import read_header as read_wheel_header

log = logging.getLogger("delayd.storage")

META_MAGIC = 0x444D4C44  # "DLMD" little-endian
META_VERSION = 3
META_UPGRADABLE = (2,)  # older meta versions this build reads and upgrades on open
META_HEADER = ByteTable("<IHHII")
LEGACY_NODE_ID = "d"  # the node id every daemon had before ids were recorded


@dataclass(frozen=True, slots=True)
class Meta:
    node_id: str
    created_ms: int
    version: int = META_VERSION


class Layout:
    """Where each structure lives under one data directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock = self.path / "LOCK"
        self.meta = self.path / "meta"
        self.commitlog = self.path / "commitlog"
        self.timerlog = self.path / "timerlog"
        self.timerwheel = self.path / "timerwheel"
        self.msgtable = self.path / "msgtable"
        self.ready = self.path / "ready"
        self.keys = self.path / "keys.sqlite"
        self.far = self.path / "far.sqlite"
        self.checkpoint = self.path / "checkpoint"
        self.epochs = self.path / "epochs"


# ------------------------------------------------------------------------------ meta

def read_meta(path: Path) -> Meta | None:
    """The meta file, validated magic → version → CRC → sanity; None when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < META_HEADER.size:
        raise BadMagic(f"{path}: {len(data)} bytes, too short for a header")
    magic, version, _r, body_len, crc = META_HEADER.unpack_from(data)
    if magic != META_MAGIC:
        raise BadMagic(f"{path}: magic {magic:#x}")
    if version > META_VERSION:
        raise UnsupportedVersion(str(path), version, META_VERSION)
    if version != META_VERSION and version not in META_UPGRADABLE:
        raise BadMagic(f"{path}: version {version}")
    body = data[META_HEADER.size:META_HEADER.size + body_len]
    if len(body) != body_len or zlib.crc32(body) != crc:
        raise ChecksumMismatch(f"{path}: body crc")
    try:
        fields = msgpack.unpackb(body, raw=False)
        meta = Meta(str(fields["node_id"]), int(fields["created_ms"]), version)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
        raise Insane(f"{path}: {e}") from e
    if not meta.node_id.isalnum():
        raise Insane(f"{path}: node id {meta.node_id!r} is not alphanumeric")
    return meta


def write_meta(path: Path, meta: Meta) -> None:
    body = msgpack.packb({"node_id": meta.node_id, "created_ms": meta.created_ms}, use_bin_type=True)
    replace_file(path, META_HEADER.pack(META_MAGIC, META_VERSION, 0, len(body), zlib.crc32(body)) + body)


# ------------------------------------------------------------------------------ the format check

def _segments_of(directory: Path, fmt: SegmentFormat) -> None:
    for base in list_segments(directory):
        try:
            read_header(fmt, directory / segment_name(base), base)
        except CorruptData:
            pass  # damage is recovery's business; only a newer version stops us here


def check_formats(path: Path) -> Meta | None:
    """Raise UnsupportedVersion if any file of the data directory at `path` was written in a
    format version newer than this build reads. Reads only (file headers, one at a time);
    damage is not its business (recovery and `delayd check` deal with that). Returns the
    directory's meta (None for a version-1 directory)."""
    layout = Layout(path)
    meta = read_meta(layout.meta)
    for cp in (layout.checkpoint, ckpt.previous(layout.checkpoint)):
        try:
            ckpt.load(cp)
        except (FileNotFoundError, CorruptData):
            pass
    try:
        epochs.load(layout.epochs)
    except CorruptData:
        pass
    try:
        read_wheel_header(layout.timerwheel)
    except (FileNotFoundError, CorruptData):
        pass
    for db, supported in ((layout.keys, KEYINDEX_VERSION), (layout.far, FARINDEX_VERSION)):
        # From the SQLite file header: opening a connection would leave -wal/-shm files behind.
        version = stored_version(db)
        if version is not None and version > supported:
            raise UnsupportedVersion(str(db), version, supported)
    _segments_of(layout.timerlog, TIMERLOG_FORMAT)
    _segments_of(layout.msgtable, MSGTABLE_FORMAT)
    try:
        topics = sorted(os.listdir(layout.ready))
    except FileNotFoundError:
        topics = []
    for topic in topics:
        _segments_of(layout.ready / topic, READY_FORMAT)
    return meta


def _has_data(layout: Layout) -> bool:
    """Whether a directory without `meta` holds anything a version-1 daemon wrote."""
    if layout.checkpoint.exists() or ckpt.previous(layout.checkpoint).exists():
        return True
    return any((layout.commitlog / segment_name(b)).stat().st_size for b in list_segments(layout.commitlog))


# ------------------------------------------------------------------------------ the directory

class DataDir:
    """An open data directory: the LOCK held, the formats checked, the node id settled.

    `open` is cheap (no recovery): the daemon calls it before it binds its port, so a second
    daemon on the same directory, or a directory from a newer build, fails at once with a
    clear error instead of after "listening".
    """

    def __init__(self, layout: Layout, lock_fd: int, meta: Meta) -> None:
        self.layout = layout
        self.path = layout.path
        self._lock_fd = lock_fd
        self.meta = meta

    @property
    def node_id(self) -> str:
        return self.meta.node_id

    @classmethod
    def open(cls, path: Path, node_id: str | None = None, *, clock_ms: int | None = None) -> DataDir:
        """Lock `path` (created if missing), check every file's format version, and settle the
        node id (`node_id`: the configured one, None when not configured)."""
        layout = Layout(path)
        layout.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            raise DataDirInUse(f"{layout.path} is in use by another process (its LOCK is held)") from e
        try:
            meta = check_formats(layout.path)
            if meta is not None:
                if node_id and node_id != meta.node_id:
                    raise NodeIdMismatch(
                        f"{layout.path} belongs to node {meta.node_id!r} (recorded in {layout.meta.name}), but node "
                        f"id {node_id!r} is configured: the ids it issued would stop resolving. Configure "
                        f"{meta.node_id!r}, or leave the node id unset")
                if meta.version < META_VERSION:
                    log.info("%s: data-directory format %d upgraded to %d", layout.path, meta.version, META_VERSION)
                    meta = Meta(meta.node_id, meta.created_ms)
                    write_meta(layout.meta, meta)
            else:
                if node_id:
                    chosen = node_id
                elif _has_data(layout):
                    chosen = LEGACY_NODE_ID  # its issued ids are d-…: keep them valid
                else:
                    chosen = "n" + secrets.token_hex(3)
                meta = Meta(chosen, clock_ms if clock_ms is not None else int(time.time() * 1000))
                write_meta(layout.meta, meta)
        except BaseException:
            os.close(fd)
            raise
        return cls(layout, fd, meta)

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1
