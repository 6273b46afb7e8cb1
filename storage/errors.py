"""Every error the storage engine raises, in one place.

Validation follows bbolt's order — magic, then version, then checksum, then sanity — and each
outcome has its own class so callers (and tests) can tell them apart. A newer format version is
not damage: `UnsupportedVersion` is deliberately *not* a `CorruptData`, so no code path that
skips, cuts or rebuilds damaged data ever catches it. Data written by a newer build is refused,
never "repaired".
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every storage failure."""


class CorruptData(StorageError):
    """Bytes on disk do not form a valid structure."""


class BadMagic(CorruptData):
    """A file or record does not start with the expected magic number."""


class ChecksumMismatch(CorruptData):
    """The stored CRC does not match the bytes."""


class Insane(CorruptData):
    """Fields decode and checksum fine but contradict each other or the other files."""


class TornRecord(CorruptData):
    """A record runs past the end of its file: the tail of an interrupted write."""


class UnsupportedVersion(StorageError):
    """Intact data in a format version this build cannot read: a newer build wrote it.

    `what` names the file (and offset) it was found in, `found` the version there, `supported`
    the newest version this build reads.
    """

    def __init__(self, what: str, found: int, supported: int) -> None:
        self.what, self.found, self.supported = what, found, supported
        super().__init__(f"{what}: format version {found}, but this build reads versions up to {supported}; "
                         f"a newer delayd wrote it: run that version (or a newer one) on this data directory")


class GeometryMismatch(StorageError):
    """A TimerWheel file was created with another precision or slot count."""


class RecordTooLarge(StorageError):
    """A record field is longer than its length field can hold, or the record is longer than
    MAX_RECORD: refused before anything is written (the API edge should have refused it first)."""


class DiskFull(StorageError):
    """A write failed for lack of space (ENOSPC/EDQUOT); nothing partial was kept."""


class NotDurable(StorageError):
    """An fsync failed: whether the write survives a crash is unknown (as after a timeout)."""


class OutOfDescriptors(StorageError):
    """A file could not be opened: the process or the system is out of file descriptors
    (EMFILE/ENFILE). Nothing was changed; the same call may succeed once descriptors free up."""


class OffsetOutOfRange(StorageError):
    """An offset points before the oldest retained segment or past the end."""


class DataDirInUse(StorageError):
    """Another process holds the data directory's LOCK."""


class NodeIdMismatch(StorageError):
    """The configured node id differs from the one the data directory recorded: the ids it
    issued would stop resolving."""
