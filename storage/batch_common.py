"""What the batch core's Python reference (storage/batch.py, storage/batch_pull.py,
storage/batch_recovery.py) shares: the check of one commit-log record, the argument checks, the
MessageRow's struct (its byte table is in storage/batch.py) and the message-table spans.

`check_record` answers, for the record at an offset of a buffer, one of the SCAN outcomes below
with the record's length, in the order commitlog.decode checks a record (the byte table is in
storage/commitlog.py). A reference reads records only through it.
"""

from __future__ import annotations

import bisect
import struct
import zlib
from collections.abc import Sequence
from typing import Any, Protocol

from delayd.storage.commitlog import HEADER as RECORD
from delayd.storage.commitlog import MAX_RECORD, RECORD_VERSION, RecordType
from delayd.storage.msgtable import ENTRY

SCAN_OK, SCAN_TORN, SCAN_CORRUPT, SCAN_VERSION = 0, 1, 2, 3
_MESSAGE, _LAST = int(RecordType.MESSAGE), max(map(int, RecordType))
MROW_FMT = struct.Struct("<QqqIIIHBB")  # MessageRow (storage/batch.py's byte table)


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


class SpanLike(Protocol):
    """A message-table batch span (storage.msgtable._Span): entries of seqs base.. in `buf`."""
    base: int
    buf: bytearray
    valid: int
    lo: int
    hi: int


def span_entry(spans: Sequence[SpanLike], seq: int) -> tuple[SpanLike, int, bool] | None:
    """The span holding `seq`'s entry, its byte offset there, and whether it was read (the
    compiled core's span_entry)."""
    lo, hi = 0, len(spans)
    while lo < hi:
        mid = (lo + hi) // 2
        if spans[mid].base <= seq:
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return None
    s = spans[lo - 1]
    k = seq - s.base
    if k >= len(s.buf) // ENTRY.size:
        return None
    at = k * ENTRY.size
    return s, at, at + ENTRY.size <= s.valid


def touch(s: SpanLike, lo: int, hi: int) -> None:
    """Bytes [lo, hi) of the span changed (storage.msgtable._Span.touch)."""
    s.lo = min(s.lo, lo)
    s.hi = max(s.hi, hi)
    if s.hi > s.valid:
        s.valid = s.hi
