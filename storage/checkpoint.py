"""The checkpoint: how far every derived structure is known to be complete.

Written atomically (temp file, fsync, rename, fsync of the directory; the one before is kept
as ``checkpoint.prev``) after the structures it
describes were flushed. Loaded as a hint: validated in order magic → version → CRC → sanity,
each failure its own exception, and on damage recovery falls back to the previous checkpoint,
then to a full rescan. A newer version is not damage: it stops recovery (the daemon refuses to
start) instead of being set aside.

    offset size  field     type  meaning
    ------ ----  --------  ----  --------------------------------------------------
       0     4   magic     u32   CHECKPOINT_MAGIC ("DLCP")
       4     2   version   u16   CHECKPOINT_VERSION
       6     2   reserved  u16   0
       8     4   body_len  u32   length of the msgpack body
      12     4   crc       u32   crc32 of the body
      16     …   body      msgpack map, the fields of `Checkpoint` below

Version history: 1 — original.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from delayd.storage.bytetable import ByteTable
from delayd.storage.errors import BadMagic, ChecksumMismatch, Insane, UnsupportedVersion
from delayd.storage.segments import fsync_dir

CHECKPOINT_MAGIC = 0x50434C44  # "DLCP" little-endian
CHECKPOINT_VERSION = 1
HEADER = ByteTable("<IHHII")


@dataclass(slots=True)
class Checkpoint:
    commit_indexed: int = 0  # every commit-log record before this offset is indexed
    commit_end: int = 0  # commit-log end when taken (sanity: the log must reach it)
    timerlog_end: int = 0  # TimerLog end when taken; units after it are redone from the log
    read_time_ms: int = 0  # every wheel slot before this time was fully dispatched
    next_seq: int = 1  # next message sequence number to hand out
    ready_ends: dict[str, int] = field(default_factory=dict)  # topic -> ready-queue units written
    counters: dict[str, Any] = field(default_factory=dict)  # stats totals, per topic
    schedule: bytes = b""  # zlib'd per-slot pending counts (see broker's schedule index)
    far_schedule: dict[int, int] = field(default_factory=dict)  # hour -> pending beyond the window
    groups: dict[str, Any] = field(default_factory=dict)  # "topic/group" -> group state snapshot
    indexed_at: dict[int, int] = field(default_factory=dict)  # commit segment base -> when fully indexed
    created_ms: int = 0


def save(path: Path, cp: Checkpoint) -> None:
    body = msgpack.packb(asdict(cp), use_bin_type=True)
    data = HEADER.pack(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, 0, len(body), zlib.crc32(body)) + body
    # The previous checkpoint stays as a fallback: it is an older but still valid hint.
    write_atomic(path, data, keep_previous=True)


def write_atomic(path: Path, data: bytes, *, keep_previous: bool = False) -> None:
    """Replace `path` with `data` so that a crash leaves the old file or the new one, whole:
    temp file, fsync, rename (the old one to `previous(path)` first, with `keep_previous`),
    fsync of the directory. (storage.epochs writes its file so too.)"""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if keep_previous and path.exists():
        os.replace(path, previous(path))
    os.replace(tmp, path)
    fsync_dir(path.parent)


def previous(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def load(path: Path) -> Checkpoint:
    """Read and validate; raises FileNotFoundError, UnsupportedVersion (a newer build wrote it:
    never a reason to fall back) or a CorruptData subclass."""
    data = path.read_bytes()
    if len(data) < HEADER.size:
        raise BadMagic(f"{path}: {len(data)} bytes, too short for a header")
    magic, version, _r, body_len, crc = HEADER.unpack_from(data)
    if magic != CHECKPOINT_MAGIC:
        raise BadMagic(f"{path}: magic {magic:#x}")
    if version > CHECKPOINT_VERSION:
        raise UnsupportedVersion(str(path), version, CHECKPOINT_VERSION)
    if version != CHECKPOINT_VERSION:
        raise BadMagic(f"{path}: version {version}")
    body = data[HEADER.size:HEADER.size + body_len]
    if len(body) != body_len or zlib.crc32(body) != crc:
        raise ChecksumMismatch(f"{path}: body crc")
    try:
        fields = msgpack.unpackb(body, raw=False, strict_map_key=False)
        cp = Checkpoint(**fields)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise Insane(f"{path}: {e}") from e
    if min(cp.commit_indexed, cp.commit_end, cp.timerlog_end, cp.next_seq) < 0 \
            or cp.commit_indexed > cp.commit_end:
        raise Insane(f"{path}: offsets out of order")
    return cp
