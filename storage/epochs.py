"""The epoch file of a replicated shard: at which commit-log offset each primary's term began
(RocketMQ's epoch file, Kafka's leader-epoch checkpoint).

A member appends (epoch, start offset) when it is elected (start = its log end then: every byte
from there on is the new primary's), and a follower keeps the primary's entries that its own log
reaches. On rejoin a member asks the primary where its own last epoch ends in the primary's
history (`end_of`) and cuts its log back to there: what lies beyond was never the shard's.

`epochs`, written atomically like the checkpoint (storage.segments.replace_file):

    offset size  field     type  meaning
    ------ ----  --------  ----  --------------------------------------------------
       0     4   magic     u32   EPOCHS_MAGIC ("DLEP")
       4     2   version   u16   EPOCHS_VERSION
       6     2   count     u16   number of entries
       8     4   crc       u32   crc32 of the entries
      12  16·n   entries         epoch(8) u64, start_offset(8) i64 — epochs increasing, starts
                                   non-decreasing

Version history: 1 — original (data-directory format 3).
"""

from __future__ import annotations

import zlib
from pathlib import Path

from delayd.storage.bytetable import ByteTable
from delayd.storage.errors import BadMagic, ChecksumMismatch, Insane, UnsupportedVersion
from delayd.storage.segments import replace_file

EPOCHS_MAGIC = 0x5045_4C44  # "DLEP" little-endian
EPOCHS_VERSION = 1
HEADER = ByteTable("<IHHI")
ENTRY = ByteTable("<Qq")
MAX_ENTRIES = 0xFFFF


class EpochFile:
    """The (epoch, start offset) list of one data directory, in memory and on disk."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries: list[tuple[int, int]] = load(self.path)

    @property
    def last(self) -> tuple[int, int] | None:
        return self.entries[-1] if self.entries else None

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, start: int) -> None:
        """Epoch `epoch` starts at `start` (a new primary: its log end). Durable on return."""
        if self.entries and (epoch <= self.entries[-1][0] or start < self.entries[-1][1]):
            raise ValueError(f"epoch {epoch} at {start} after {self.entries[-1]}")
        self.entries.append((epoch, start))
        del self.entries[:-MAX_ENTRIES]
        save(self.path, self.entries)

    def adopt(self, primary: list[tuple[int, int]], log_end: int) -> bool:
        """A follower takes the primary's entries its log reaches (start <= log_end); its own
        older ones stay. True when the file changed."""
        keep = [e for e in primary if e[1] <= log_end]
        if not keep:
            return False
        first = keep[0][0]
        merged = [e for e in self.entries if e[0] < first and e[1] <= keep[0][1]] + keep
        if merged == self.entries:
            return False
        self.entries = merged[-MAX_ENTRIES:]
        save(self.path, self.entries)
        return True

    def end_of(self, epoch: int, log_end: int) -> int:
        """Where epoch `epoch` (or the last one at or below it that this member knows) ends in
        this member's history: the start of the first later epoch, else the log end."""
        for e, start in self.entries:
            if e > epoch:
                return start
        return log_end

    def cut(self, offset: int) -> None:
        """The log was cut back to `offset`: drop epochs that start beyond it."""
        keep = [e for e in self.entries if e[1] <= offset]
        if keep != self.entries:
            self.entries = keep
            save(self.path, self.entries)


def save(path: Path, entries: list[tuple[int, int]]) -> None:
    body = b"".join(ENTRY.pack(e, s) for e, s in entries)
    replace_file(path, HEADER.pack(EPOCHS_MAGIC, EPOCHS_VERSION, len(entries), zlib.crc32(body)) + body)


def load(path: Path) -> list[tuple[int, int]]:
    """The entries ([] when there is no file), validated magic → version → CRC → sanity."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    if len(data) < HEADER.size:
        raise BadMagic(f"{path}: {len(data)} bytes, too short for a header")
    magic, version, count, crc = HEADER.unpack_from(data)
    if magic != EPOCHS_MAGIC:
        raise BadMagic(f"{path}: magic {magic:#x}")
    if version > EPOCHS_VERSION:
        raise UnsupportedVersion(str(path), version, EPOCHS_VERSION)
    if version != EPOCHS_VERSION:
        raise BadMagic(f"{path}: version {version}")
    body = data[HEADER.size:]
    if len(body) != count * ENTRY.size or zlib.crc32(body) != crc:
        raise ChecksumMismatch(f"{path}: entries crc")
    entries = [(e, s) for e, s in ENTRY.iter_unpack(body)]
    for (e0, s0), (e1, s1) in zip(entries, entries[1:], strict=False):
        if e1 <= e0 or s1 < s0:
            raise Insane(f"{path}: epoch {e1} at {s1} after epoch {e0} at {s0}")
    return entries
