"""Every error the storage engine raises, in one place.

Validation follows bbolt's order — magic, then version, then checksum, then sanity —
and each failure has its own class so callers (and tests) can tell them apart.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every storage failure."""


class CorruptData(StorageError):
    """Bytes on disk do not form a valid structure."""


class BadMagic(CorruptData):
    """A file or record does not start with the expected magic number."""


class UnsupportedVersion(CorruptData):
    """A file or record carries a format version this build cannot read."""


class ChecksumMismatch(CorruptData):
    """The stored CRC does not match the bytes."""


class Insane(CorruptData):
    """Fields decode and checksum fine but contradict each other or the other files."""


class TornRecord(CorruptData):
    """A record runs past the end of its file: the tail of an interrupted write."""


class GeometryMismatch(StorageError):
    """A TimerWheel file was created with another precision or slot count."""


class RecordTooLarge(StorageError):
    """A record field is longer than its length field can hold, or the record is longer than
    MAX_RECORD: refused before anything is written (the API edge should have refused it first)."""


class DiskFull(StorageError):
    """A write failed for lack of space (ENOSPC/EDQUOT); nothing partial was kept."""


class OffsetOutOfRange(StorageError):
    """An offset points before the oldest retained segment or past the end."""
