"""What the batch core's Python reference (storage/batch.py, storage/batch_pull.py) shares: the
check of one commit-log record and the argument checks.

`check_record` answers, for the record at an offset of a buffer, one of the SCAN outcomes below
with the record's length, in the order commitlog.decode checks a record (the byte table is in
storage/commitlog.py). A reference reads records only through it.
"""

from __future__ import annotations

import bisect
import zlib
from typing import Any

from delayd.storage.commitlog import HEADER as RECORD
from delayd.storage.commitlog import MAX_RECORD, RECORD_VERSION, RecordType

SCAN_OK, SCAN_TORN, SCAN_CORRUPT, SCAN_VERSION = 0, 1, 2, 3
_MESSAGE, _LAST = int(RecordType.MESSAGE), max(map(int, RecordType))


def require(ok: bool, what: str) -> None:
    """A batch function's argument check: ValueError(what) unless `ok`."""
    if not ok:
        raise ValueError(what)


def utf8_or_none(s: str) -> bytes | None:
    """`s` as UTF-8; None when it has no UTF-8 form (a lone surrogate)."""
    try:
        return s.encode()
    except UnicodeEncodeError:
        return None


def read_record(reads: list[tuple[int, bytes]], starts: list[int], off: int,
                size: int) -> tuple[int, int, Any, int] | None:
    """The record at commit-log offset `off` (`size` bytes) in `reads` ((offset, bytes) sorted by
    offset; `starts` their offsets): (check_record's outcome and length, the buffer, the record's
    place in it), or None when no read holds it whole."""
    j = bisect.bisect_right(starts, off) - 1
    if j < 0 or off < reads[j][0] or off + max(size, RECORD.size) > reads[j][0] + len(reads[j][1]):
        return None
    buf, at = reads[j][1], off - reads[j][0]
    return (*check_record(buf, at, True), buf, at)


def check_record(buf: bytes | memoryview, i: int, verify: bool) -> tuple[int, int]:
    """(outcome, length) of the record at buf[i:], in commitlog.decode's order of checks; the
    CRC only when `verify`."""
    if len(buf) - i < RECORD.size:
        return SCAN_TORN, 0
    (length, crc, version, rtype, _f, _s, _d, _p, _r, tl, gl, kl, hl, bl) = RECORD.unpack_from(buf, i)
    if length < RECORD.size or length > MAX_RECORD or length != RECORD.size + tl + gl + kl + hl + bl:
        return SCAN_CORRUPT, 0
    if len(buf) - i < length:
        return SCAN_TORN, 0
    if verify and zlib.crc32(memoryview(buf)[i + 8:i + length]) != crc:
        return SCAN_CORRUPT, 0
    if version != RECORD_VERSION:
        return SCAN_VERSION, 0
    if not _MESSAGE <= rtype <= _LAST:
        return SCAN_CORRUPT, 0
    return SCAN_OK, length
