"""The commit log: segmented, append-only, CRC-checked records. The source of truth.

Record layout, format version 1 (little-endian; every record starts on a record boundary
and never spans two segments):

    offset size  field        type  meaning
    ------ ----  -----------  ----  ------------------------------------------------------
       0     4   length       u32   whole record in bytes, this field included
       4     4   crc          u32   zlib.crc32 of bytes [8, length)
       8     1   version      u8    RECORD_VERSION
       9     1   type         u8    RecordType
      10     2   flags        u16   RecordFlag bits (CONTINUED: the next record belongs to
                                      the same atomic batch)
      12     8   seq          u64   message sequence number (the message id's number)
      20     8   deliver_at   i64   due time, epoch ms (0 for non-message records)
      28     8   produced_at  i64   when the broker accepted the message, epoch ms
      36     2   roll_count   u16   how many times the message rolled forward (RIP-43 roll)
      38     1   topic_len    u8
      39     1   tag_len      u8
      40     2   key_len      u16
      42     2   headers_len  u16   msgpack map str->str
      44     4   body_len     u32
      48     …   topic, tag, key, headers, body (in that order)

Version history: 1 — original.

The length fields bound what a record can carry: topic and tag at most 255 UTF-8 bytes (u8), key
and packed headers at most 65,535 (u16), and the whole record at most MAX_RECORD. The API edge
(broker.codec) refuses longer input with a 400; encode() refuses it too (RecordTooLarge), so a
gap there is an error, never a struct.error or a record that recovery would later reject.

Recovery scans from a hint offset, checks every CRC, skips a damaged record whose neighbours
are intact (counted), and truncates a torn or corrupt tail (counted).
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgpack
from delayd.storage.errors import (
    ChecksumMismatch,
    CorruptData,
    RecordTooLarge,
    TornRecord,
    UnsupportedVersion,
)
from delayd.storage.segments import SegmentedFile

RECORD_VERSION = 1
HEADER = struct.Struct("<IIBBHQqqHBBHHI")
HEADER_SIZE = HEADER.size  # 48
assert HEADER_SIZE == 48
_LEN_CRC = struct.Struct("<II")
_REST = struct.Struct("<BBHQqqHBBHHI")  # HEADER without length and crc
MAX_RECORD = 64 * 1024 * 1024
SCAN_CHUNK = 1 << 20
# What the length fields can say (u8 and u16 above).
MAX_TOPIC_BYTES = 0xFF
MAX_TAG_BYTES = 0xFF
MAX_KEY_BYTES = 0xFFFF
MAX_HEADERS_BYTES = 0xFFFF  # the msgpack-packed map


class RecordFlag(enum.IntFlag):
    NONE = 0
    CONTINUED = 1  # not the last record of an atomic batch: a tail that ends here is torn


class RecordType(enum.IntEnum):
    MESSAGE = 1  # a produced message
    CANCEL = 2  # cancels message `seq`; body empty
    ROLL = 3  # a roll copy: the message again, roll_count + 1, same seq
    GROUP = 4  # consumer-group event: key = group, body = msgpack {op, idx}


@dataclass(slots=True)
class Record:
    type: RecordType
    seq: int
    topic: str
    body: bytes = b""
    deliver_at: int = 0
    produced_at: int = 0
    roll_count: int = 0
    tag: str | None = None
    key: str | None = None
    headers: dict[str, str] | None = field(default=None)
    offset: int = -1
    size: int = 0
    flags: int = 0


def _too_large(seq: int, topic: bytes, tag: bytes, key: bytes, hdrs: bytes, body: bytes) -> RecordTooLarge:
    """Which field does not fit (for the error message); called only when one does not."""
    for name, value, limit in (("topic", topic, MAX_TOPIC_BYTES), ("tag", tag, MAX_TAG_BYTES),
                               ("key", key, MAX_KEY_BYTES), ("headers", hdrs, MAX_HEADERS_BYTES)):
        if len(value) > limit:
            return RecordTooLarge(f"message {seq}: {name} is {len(value)} bytes, a record holds at most {limit}")
    size = HEADER_SIZE + len(topic) + len(tag) + len(key) + len(hdrs) + len(body)
    return RecordTooLarge(f"message {seq}: the record would be {size} bytes, at most {MAX_RECORD}")


def encode(rec: Record, flags: int = 0) -> bytes:
    topic = rec.topic.encode()
    tag = rec.tag.encode() if rec.tag else b""
    key = rec.key.encode() if rec.key else b""
    hdrs = msgpack.packb(rec.headers) if rec.headers else b""
    try:
        rest = _REST.pack(RECORD_VERSION, rec.type, flags, rec.seq, rec.deliver_at, rec.produced_at,
                          rec.roll_count, len(topic), len(tag), len(key), len(hdrs), len(rec.body))
    except struct.error:
        raise _too_large(rec.seq, topic, tag, key, hdrs, rec.body) from None
    if HEADER_SIZE + len(topic) + len(tag) + len(key) + len(hdrs) + len(rec.body) > MAX_RECORD:
        raise _too_large(rec.seq, topic, tag, key, hdrs, rec.body)
    rest += topic + tag + key + hdrs + rec.body
    return _LEN_CRC.pack(len(rest) + 8, zlib.crc32(rest)) + rest


class _Message(Protocol):
    topic: str
    body: bytes
    deliver_at: int
    tag: str | None
    key: str | None
    headers: dict[str, str] | None


def encode_messages(msgs: Sequence[_Message], first_seq: int, produced_at: int, last_flags: int = 0) -> list[bytes]:
    """encode() of one produce batch: MESSAGE records with seq first_seq, first_seq + 1, ...,
    each CONTINUED but the last (which gets `last_flags`). The same bytes, about 3x faster.
    Raises RecordTooLarge (nothing of the batch is encoded) if a field does not fit."""
    out: list[bytes] = []
    topics: dict[str, bytes] = {}
    pack, crc32, len_crc = _REST.pack, zlib.crc32, _LEN_CRC.pack
    mtype, cont, last = int(RecordType.MESSAGE), int(RecordFlag.CONTINUED), len(msgs) - 1
    for i, m in enumerate(msgs):
        topic = topics.get(m.topic)
        if topic is None:
            topic = topics[m.topic] = m.topic.encode()
        body = m.body
        flags = cont if i < last else last_flags
        tag = key = hdrs = b""
        try:
            if m.tag or m.key or m.headers:
                tag = m.tag.encode() if m.tag else b""
                key = m.key.encode() if m.key else b""
                hdrs = msgpack.packb(m.headers) if m.headers else b""
                rest = pack(RECORD_VERSION, mtype, flags, first_seq + i, m.deliver_at, produced_at, 0, len(topic),
                            len(tag), len(key), len(hdrs), len(body)) + topic + tag + key + hdrs + body
            else:
                rest = pack(RECORD_VERSION, mtype, flags, first_seq + i, m.deliver_at, produced_at, 0, len(topic),
                            0, 0, 0, len(body)) + topic + body
        except struct.error:
            raise _too_large(first_seq + i, topic, tag, key, hdrs, body) from None
        if len(rest) + 8 > MAX_RECORD:
            raise _too_large(first_seq + i, topic, tag, key, hdrs, body)
        out.append(len_crc(len(rest) + 8, crc32(rest)) + rest)
    return out


_TYPES = {int(t): t for t in RecordType}
_unpack_header = HEADER.unpack_from


def decode(buf: bytes | bytearray | memoryview, pos: int = 0, offset: int = -1, *, verify: bool = True) -> Record:
    """Decode the record at `buf[pos:]`. Raises TornRecord, ChecksumMismatch or UnsupportedVersion."""
    n = len(buf)
    if n - pos < HEADER_SIZE:
        raise TornRecord(f"header cut at {offset}")
    (length, crc, version, rtype, flags, seq, deliver_at, produced_at, roll,
     tl, gl, kl, hl, bl) = _unpack_header(buf, pos)
    if length < HEADER_SIZE or length > MAX_RECORD or length != HEADER_SIZE + tl + gl + kl + hl + bl:
        raise ChecksumMismatch(f"impossible length {length} at {offset}")
    if n - pos < length:
        raise TornRecord(f"record of {length} bytes cut at {offset}")
    if verify and zlib.crc32(memoryview(buf)[pos + 8:pos + length]) != crc:
        raise ChecksumMismatch(f"crc mismatch at {offset}")
    if version != RECORD_VERSION:
        raise UnsupportedVersion(f"record version {version} at {offset}")
    rt = _TYPES.get(rtype)
    if rt is None:
        raise CorruptData(f"unknown record type {rtype} at {offset}")
    if type(buf) is not bytes:  # slices of bytes are bytes, and need no second copy
        buf, pos = bytes(buf[pos:pos + length]), 0
    p = pos + HEADER_SIZE + tl
    topic = buf[pos + HEADER_SIZE:p].decode()
    tag = key = headers = None
    if gl:
        tag = buf[p:p + gl].decode()
        p += gl
    if kl:
        key = buf[p:p + kl].decode()
        p += kl
    if hl:
        headers = msgpack.unpackb(buf[p:p + hl])
        p += hl
    return Record(rt, seq, topic, buf[p:p + bl], deliver_at, produced_at, roll, tag, key, headers, offset, length,
                  flags)


@dataclass(slots=True)
class ScanReport:
    records: int = 0
    skipped_records: int = 0  # damaged records stepped over (intact data after them)
    skipped_bytes: int = 0
    truncated_bytes: int = 0  # torn or corrupt tail cut off


class CommitLog:
    """Segmented append-only record log. Offsets are global byte offsets."""

    def __init__(self, directory: Path, segment_bytes: int = 64 * 1024 * 1024) -> None:
        self.files = SegmentedFile(Path(directory), segment_bytes)

    @property
    def start(self) -> int:
        return self.files.start

    @property
    def end(self) -> int:
        return self.files.end

    def append(self, encoded: list[bytes]) -> list[int]:
        """Append encoded records as few writes as possible; returns each record's offset.

        Not durable until `flush()`; the broker group-commits by calling flush once per batch
        of concurrent requests.
        """
        offsets: list[int] = []
        batch: list[bytes] = []
        size = 0
        total = sum(len(d) for d in encoded)
        if self.files.remaining() < total <= self.files.segment_bytes:
            # Keep a batch in one write (and one segment): a crash leaves all of it or none.
            self.files.roll()
        room = self.files.remaining()
        for data in encoded:
            if size + len(data) > room and (batch or self.files.end > self.files.bases[-1]):
                if batch:
                    self._write(batch, offsets)
                    batch, size = [], 0
                self.files.roll()
                room = self.files.remaining()
            batch.append(data)
            size += len(data)
        if batch:
            self._write(batch, offsets)
        return offsets

    def _write(self, batch: list[bytes], offsets: list[int]) -> None:
        pos = self.files.append(b"".join(batch))
        for data in batch:
            offsets.append(pos)
            pos += len(data)

    def flush(self) -> None:
        self.files.flush()

    def read(self, offset: int, size: int = 0) -> Record:
        """The record at `offset`. `size`, when known, saves a second read."""
        buf = self.files.read(offset, size or 4096)
        if len(buf) >= 4:
            (length,) = struct.unpack_from("<I", buf)
            if HEADER_SIZE <= length <= MAX_RECORD and len(buf) < length:
                buf = self.files.read(offset, length)
        return decode(buf, 0, offset)

    def scan(self, start: int, end: int | None = None, report: ScanReport | None = None,
             *, verify: bool = True) -> Iterator[Record]:
        """Yield valid records from `start` up to `end` (default: the log end).

        A damaged record followed by intact data is skipped and counted; the scan resumes at
        the next position where a record with a valid CRC starts.
        """
        report = report if report is not None else ScanReport()
        stop = self.files.end if end is None else end
        pos = max(start, self.files.start)
        while pos < stop:
            base = self.files.segment_of(pos)
            seg_end = self.files.segment_end(base)
            if pos >= seg_end:
                later = [b for b in self.files.bases if b > base]
                if not later:
                    return
                pos = later[0]
                continue
            buf = self.files.read(pos, min(SCAN_CHUNK, seg_end - pos))
            i = 0
            while i < len(buf) and pos + i < stop:
                try:
                    rec = decode(buf, i, pos + i, verify=verify)
                except TornRecord:
                    need = self._declared_length(buf, i)
                    if pos + i + need <= seg_end:
                        if i == 0:  # one record larger than the chunk
                            buf = self.files.read(pos, need)
                            continue
                        break  # crosses the chunk boundary: read again from it
                    i = self._resync(pos + i, seg_end, report) - pos
                    break
                except CorruptData:
                    i = self._resync(pos + i, seg_end, report) - pos
                    break
                report.records += 1
                yield rec
                i += rec.size
            pos += i

    @staticmethod
    def _declared_length(buf: bytes | memoryview, i: int) -> int:
        if len(buf) - i < 4:
            return HEADER_SIZE
        (length,) = struct.unpack_from("<I", buf, i)
        return length if HEADER_SIZE <= length <= MAX_RECORD else HEADER_SIZE

    def _resync(self, bad: int, seg_end: int, report: ScanReport) -> int:
        """Find the next intact record after a damaged one, within the same segment."""
        data = self.files.read(bad, seg_end - bad)
        version = bytes((RECORD_VERSION,))
        j = 1
        while j <= len(data) - HEADER_SIZE:
            # Only where the version byte (at +8) is right can a record start: find() those.
            k = data.find(version, j + 8)
            if k < 0:
                break
            j = k - 8
            if j > len(data) - HEADER_SIZE:
                break
            try:
                decode(data, j, bad + j)
            except CorruptData:
                j += 1
                continue
            report.skipped_records += 1
            report.skipped_bytes += j
            return bad + j
        report.skipped_bytes += seg_end - bad
        return seg_end

    def recover(self, start: int) -> ScanReport:
        """Check every record from `start` to the end; cut a torn or corrupt tail.

        The tail is what lies after the last intact record of the last segment: an interrupted
        write leaves it, and no produce was acknowledged for it.
        """
        report = ScanReport()
        last_good = max(start, self.files.start)
        batch_start = last_good
        for rec in self.scan(start, report=report):
            last_good = rec.offset + rec.size
            if not rec.flags & RecordFlag.CONTINUED:
                batch_start = last_good
        if batch_start < last_good:
            # The tail ends inside an atomic batch (a torn multi-record write): drop all of it.
            last_good = batch_start
        if last_good < self.files.end:
            # Anything after the last intact record is a tail that never completed.
            if last_good >= self.files.bases[-1]:
                report.skipped_bytes -= min(report.skipped_bytes, self.files.end - last_good)
                report.truncated_bytes = self.files.truncate(last_good)
        return report

    def delete_before(self, offset: int) -> list[int]:
        return self.files.delete_before(offset)

    def disk_bytes(self) -> int:
        return self.files.disk_bytes()

    def close(self) -> None:
        self.files.close()
