"""The commit log: segmented, append-only, CRC-checked records. The source of truth — and the one
decoder of its records (the daemon, `delayd check`/`dump` and the Spark reader all read through it).

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

Record types (`RecordType`): 1 MESSAGE, 2 CANCEL (`seq` names the message; body empty), 3 ROLL (a
roll copy: the message again, roll_count + 1), 4 GROUP (a consumer-group event: key = group, body =
msgpack), 5 RELEASE (dequeue-put released messages into topic `topic`'s ready queue; seq 0,
deliver_at 0, produced_at = the release time; body below). Type 5 came with data-directory format 3
(storage.datadir): an older build refuses such a directory instead of reading a RELEASE record as
damage. The record layout did not change, so RECORD_VERSION stays 1.

RELEASE body: the ready-queue units appended, in order, after the index of the first:

    offset size  field        type  meaning
    ------ ----  -----------  ----  ------------------------------------------------------
       0     8   first_index  u64   the ready-queue index of the first unit
       8   40·n  units              storage.readyqueue UNITs: commit_offset(8) commit_size(4)
                                      tag_hash(4) deliver_at(8) released_at(8) seq(8)

The ready queues are derived from these records: a replica (or recovery) appends the units of a
RELEASE record whose units its queue lacks (`first_index` says where they go, so applying one
twice changes nothing), which keeps a queue's indexes — what consumer-group records refer to —
the same on every member of a replicated shard.

Version history: 1 — original. Every later version keeps the frame `length(4) crc(4)
version(1)` and the CRC's span, so this build can tell a newer record from a damaged one: an
intact frame (its CRC matches) with a version above RECORD_VERSION raises UnsupportedVersion,
which is never skipped, resynced over or truncated — recovery stops and the daemon refuses to
start. Segments have no file header: every record carries its version.

The length fields bound what a record can carry: topic and tag at most 255 UTF-8 bytes (u8), key
and packed headers at most 65,535 (u16), and the whole record at most MAX_RECORD. The API edge
(broker.codec) refuses longer input with a 400; encode() refuses it too (RecordTooLarge), so a
gap there is an error, never a struct.error or a record that recovery would later reject.

Reading: `decode` one record; `scan_buffer` a whole buffer at once into columns (record
offsets — and their packed headers on demand —, where the run of whole records ends and why) — the batch entry
point the Spark reader builds Arrow columns from; `CommitLog.scan` records from an offset,
skipping damage (resync on the next intact record). `CommitLog(..., readonly=True)` takes no
lock, writes and cuts nothing: the mode for tools that read next to a live daemon.
"""

from __future__ import annotations

import enum
import itertools
import logging
import re
import struct
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgpack
from delayd.storage import native
from delayd.storage.bytetable import ByteTable
from delayd.storage.errors import (
    ChecksumMismatch,
    CorruptData,
    Insane,
    RecordTooLarge,
    TornRecord,
    UnsupportedVersion,
)
from delayd.storage.segments import SegmentedFile, segment_name

log = logging.getLogger("delayd.storage")

RECORD_VERSION = 1
HEADER = ByteTable("<IIBBHQqqHBBHHI")
HEADER_SIZE = HEADER.size  # 48
assert HEADER_SIZE == 48
FRAME = ByteTable("<IIB")  # length, crc, version: the part every version keeps
FRAME_SIZE = FRAME.size  # 9
CRC_FROM = 8  # the CRC covers bytes [8, length)
_LEN_CRC = ByteTable("<II")
_LENGTH = ByteTable("<I")
_REST = ByteTable("<BBHQqqHBBHHI")  # HEADER without length and crc
# The records' CRC (= zlib.crc32): the batch core's where it is built (it folds 16-byte blocks with
# PCLMULQDQ where the CPU has it, 3-6 times zlib's speed on a release's big RELEASE bodies).
_crc32 = getattr(native.compiled(), "crc32", zlib.crc32)
MAX_RECORD = 64 * 1024 * 1024
SCAN_CHUNK = 1 << 20
# What the length fields can say (u8 and u16 above).
MAX_TOPIC_BYTES = 0xFF
MAX_TAG_BYTES = 0xFF
MAX_KEY_BYTES = 0xFFFF
MAX_HEADERS_BYTES = 0xFFFF  # the msgpack-packed map
# A resync considers frames of versions 1..15 only: format versions are small numbers, and the
# bound keeps a resync over a long stretch of garbage affordable (each candidate costs a CRC).
RESYNC_VERSIONS = re.compile(rb"[\x01-\x0f]")
MAX_DAMAGE_NOTES = 32  # damaged stretches a ScanReport keeps by default (it counts them all)


class RecordFlag(enum.IntFlag):
    NONE = 0
    CONTINUED = 1  # not the last record of an atomic batch: a tail that ends here is torn


class RecordType(enum.IntEnum):
    MESSAGE = 1  # a produced message
    CANCEL = 2  # cancels message `seq`; body empty
    ROLL = 3  # a roll copy: the message again, roll_count + 1, same seq
    GROUP = 4  # consumer-group event: key = group, body = msgpack {op, idx}
    RELEASE = 5  # messages released into topic's ready queue: body = first_index(8) + ready units


RELEASE_HEAD = ByteTable("<Q")  # a RELEASE body's first_index; the units follow


def release_body(first_index: int, units: bytes) -> bytes:
    return RELEASE_HEAD.pack(first_index) + units


def release_parts(body: bytes) -> tuple[int, bytes]:
    """(first_index, packed ready units) of a RELEASE record's body."""
    if len(body) < RELEASE_HEAD.size:
        raise Insane(f"RELEASE body of {len(body)} bytes")
    return RELEASE_HEAD.unpack_from(body)[0], body[RELEASE_HEAD.size:]


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


# ------------------------------------------------------------------------------ encoding

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
    return _LEN_CRC.pack(len(rest) + 8, _crc32(rest)) + rest


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
    pack, crc32, len_crc = _REST.pack, _crc32, _LEN_CRC.pack
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


# ------------------------------------------------------------------------------ decoding

_TYPES = {int(t): t for t in RecordType}
_FIRST_TYPE, _LAST_TYPE = min(_TYPES), max(_TYPES)
_unpack_header = HEADER.unpack_from


def _other_version(buf: bytes | bytearray | memoryview, pos: int, length: int, version: int, offset: int) -> None:
    """The frame at `pos` is not version 1: a newer record (its CRC matches) or damage."""
    if _crc32(memoryview(buf)[pos + CRC_FROM:pos + length]) != _LEN_CRC.unpack_from(buf, pos)[1]:
        raise ChecksumMismatch(f"crc mismatch at {offset}")
    if version > RECORD_VERSION:
        raise UnsupportedVersion(f"commit-log record at offset {offset}", version, RECORD_VERSION)
    raise Insane(f"record version {version} at {offset}")


def decode(buf: bytes | bytearray | memoryview, pos: int = 0, offset: int = -1, *, verify: bool = True) -> Record:
    """Decode the record at `buf[pos:]`.

    Raises TornRecord (it runs past the buffer), ChecksumMismatch/Insane/CorruptData (damage),
    or UnsupportedVersion (an intact record of a newer format: never damage). The frame is
    checked first, then the version, then the version-1 layout and CRC; a record whose CRC
    matches but whose topic, tag or key is not UTF-8, or whose headers are not a msgpack map,
    is CorruptData too (no writer makes one: the API edge and the batch core check all four).
    """
    n = len(buf)
    if n - pos < HEADER_SIZE:
        if n - pos >= FRAME_SIZE:
            length, _crc, version = FRAME.unpack_from(buf, pos)
            if version != RECORD_VERSION and FRAME_SIZE <= length <= n - pos:
                _other_version(buf, pos, length, version, offset)
        raise TornRecord(f"header cut at {offset}")
    (length, crc, version, rtype, flags, seq, deliver_at, produced_at, roll,
     tl, gl, kl, hl, bl) = _unpack_header(buf, pos)
    if version != RECORD_VERSION:
        if length < FRAME_SIZE or length > MAX_RECORD:
            raise ChecksumMismatch(f"impossible length {length} at {offset}")
        if n - pos < length:
            raise TornRecord(f"record of {length} bytes cut at {offset}")
        _other_version(buf, pos, length, version, offset)
    if length < HEADER_SIZE or length > MAX_RECORD or length != HEADER_SIZE + tl + gl + kl + hl + bl:
        raise ChecksumMismatch(f"impossible length {length} at {offset}")
    if n - pos < length:
        raise TornRecord(f"record of {length} bytes cut at {offset}")
    if verify and _crc32(memoryview(buf)[pos + CRC_FROM:pos + length]) != crc:
        raise ChecksumMismatch(f"crc mismatch at {offset}")
    rt = _TYPES.get(rtype)
    if rt is None:
        raise CorruptData(f"unknown record type {rtype} at {offset}")
    if type(buf) is not bytes:  # slices of bytes are bytes, and need no second copy
        buf, pos = bytes(buf[pos:pos + length]), 0
    p = pos + HEADER_SIZE + tl
    tag = key = headers = None
    try:
        topic = buf[pos + HEADER_SIZE:p].decode()
        if gl:
            tag = buf[p:p + gl].decode()
            p += gl
        if kl:
            key = buf[p:p + kl].decode()
            p += kl
        if hl:
            headers = msgpack.unpackb(buf[p:p + hl])
            p += hl
            if type(headers) is not dict:
                raise ValueError("headers are not a map")
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # UnicodeDecodeError is a ValueError
        raise CorruptData(f"undecodable field at {offset}: {e}") from None
    return Record(rt, seq, topic, buf[p:p + bl], deliver_at, produced_at, roll, tag, key, headers, offset, length,
                  flags)


def declared_length(buf: bytes | bytearray | memoryview, i: int) -> int:
    """The length a record at `buf[i:]` says it has (HEADER_SIZE when that is impossible)."""
    if len(buf) - i < 4:
        return HEADER_SIZE
    (length,) = _LENGTH.unpack_from(buf, i)
    return length if FRAME_SIZE <= length <= MAX_RECORD else HEADER_SIZE


class ScanStop(enum.Enum):
    """Why `scan_buffer` stopped where it did."""
    END = "end"  # the buffer ends on a record boundary
    CUT = "cut"  # a record (or its header) runs past the end of the buffer: read more, or a torn tail
    DAMAGED = "damaged"  # the bytes at `end` are not a record


@dataclass(slots=True)
class BufferScan:
    """The whole, valid records at the start of a buffer, as columns (`scan_buffer`)."""
    buf: bytes
    starts: array  # 'q': offset of each record in the buffer
    end: int  # where the run of valid records ends
    batch_end: int  # where the last complete atomic batch of the run ends (<= end)
    stop: ScanStop

    def __len__(self) -> int:
        return len(self.starts)

    def headers(self) -> bytes:
        """The records' 48-byte headers, back to back (HEADER.iter_unpack them, or view them with
        a numpy dtype): the fixed fields as one packed array."""
        buf = self.buf
        return b"".join([buf[s:s + HEADER_SIZE] for s in self.starts])


I64_MAX = (1 << 63) - 1


def record_offsets(sizes: bytes, start: int) -> bytes:
    """The offset of each of records written back to back from `start`, their lengths given as
    u32s (`sizes`): i64s, an array('q')'s bytes. The reference of the compiled `record_offsets`
    (storage/batch_produce.c): this prefix sum cost produce 38 ns a message."""
    view = memoryview(sizes).cast("B")
    if len(view) % 4:
        raise ValueError("sizes: not a whole number of u32s")
    if not isinstance(start, int):
        raise TypeError("start: expected an int")
    lens = array("I")
    lens.frombytes(view)
    if start < 0 or start + sum(lens) > I64_MAX:
        raise ValueError("offsets out of range")
    out = array("q", itertools.accumulate(lens, initial=start))
    out.pop()
    return out.tobytes()


_offsets = getattr(native.compiled(), "record_offsets", record_offsets)


def scan_buffer(buf: bytes, start: int = 0, *, verify: bool = True) -> BufferScan:
    """Every whole, valid record from `buf[start:]` up to the first that is not, in one call.

    The per-buffer loop of every bulk reader (the Spark reader builds its Arrow columns from the
    result). The compiled batch core runs it (`scan_starts`) when it is built; `scan_buffer_py`
    is the reference both are tested against. A record of a newer format version raises
    UnsupportedVersion; damage stops the run with DAMAGED (the caller resyncs with `find_record`).
    """
    c = native.compiled()
    if c is None:
        return scan_buffer_py(buf, start, verify=verify)
    starts, pos, batch_end, code = c.scan_starts(buf, start, verify)
    stop = _STOPS[code]
    if stop is None:  # the frame or layout is off: decode() says which (a newer version raises)
        stop = _classify(buf, pos)
    return BufferScan(buf, array("q", starts), pos, batch_end, stop)


def _classify(buf: bytes, pos: int) -> ScanStop:
    try:
        decode(buf, pos, pos, verify=True)
        return ScanStop.DAMAGED  # (not reached: one of scan_buffer's checks failed)
    except TornRecord:
        return ScanStop.CUT
    except CorruptData:
        return ScanStop.DAMAGED


def scan_buffer_py(buf: bytes, start: int = 0, *, verify: bool = True) -> BufferScan:
    """scan_buffer in Python: the reference of the compiled `scan_starts`."""
    n = len(buf)
    pos = start
    starts = array("q")
    put = starts.append
    unpack, crc32 = _unpack_header, zlib.crc32
    batch_end = start
    stop = ScanStop.END
    cont = int(RecordFlag.CONTINUED)
    last = n - HEADER_SIZE  # a header must fit
    while pos <= last:
        (length, crc, version, rtype, flags, _s, _d, _p, _r, tl, gl, kl, hl, bl) = unpack(buf, pos)
        e = pos + length
        if version != RECORD_VERSION or length != HEADER_SIZE + tl + gl + kl + hl + bl or length > MAX_RECORD \
                or not _FIRST_TYPE <= rtype <= _LAST_TYPE or e > n:
            stop = _classify(buf, pos)  # the rare case: a newer version raises, damage stops
            break
        if verify and crc32(buf[pos + CRC_FROM:e]) != crc:  # a bytes slice: cheaper than a memoryview here
            stop = ScanStop.DAMAGED
            break
        put(pos)
        pos = e
        if not flags & cont:
            batch_end = e
    else:
        if pos < n:
            stop = ScanStop.CUT  # less than a header left
    return BufferScan(buf, starts, pos, batch_end, stop)


_STOPS = (ScanStop.END, ScanStop.CUT, ScanStop.DAMAGED, None)  # scan_starts' codes


def find_record(data: bytes, start: int, offset: int = 0) -> int | None:
    """Position (>= start) in `data` of the next intact record after damage, or None.

    Tries each position whose version byte is 1..15; a candidate must pass the full decode
    (frame, layout, CRC). An intact record of a newer version raises UnsupportedVersion: data
    after damage is never cut or skipped because its version is unknown. `offset` is the log
    offset of data[0], for messages.
    """
    j = start
    n = len(data)
    while True:
        m = RESYNC_VERSIONS.search(data, j + 8)
        if m is None:
            return None
        j = m.start() - 8
        if j + FRAME_SIZE > n:
            return None
        try:
            decode(data, j, offset + j)
        except UnsupportedVersion:
            raise
        except CorruptData:
            j += 1
            continue
        return j


@dataclass(slots=True)
class Damage:
    """A damaged stretch a scan stepped over."""
    offset: int
    size: int  # bytes skipped (to the next intact record, or to the segment's end)
    error: CorruptData  # what was wrong at `offset`


@dataclass(slots=True)
class ScanReport:
    records: int = 0
    skipped_records: int = 0  # damaged records stepped over (intact data after them)
    skipped_bytes: int = 0
    truncated_bytes: int = 0  # torn or corrupt tail cut off
    damage: list[Damage] = field(default_factory=list)  # the first `max_notes` stretches, in log order
    max_notes: int = MAX_DAMAGE_NOTES


# ------------------------------------------------------------------------------ the log

class CommitLog:
    """Segmented append-only record log. Offsets are global byte offsets."""

    def __init__(self, directory: Path, segment_bytes: int = 64 * 1024 * 1024, *, readonly: bool = False) -> None:
        self.files = SegmentedFile(Path(directory), segment_bytes, readonly=readonly, checkpoint_taker=True)

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

    def append_packed(self, data: bytes, sizes: bytes) -> array:
        """append() for records already packed back to back (`sizes`: each one's length, u32):
        one write when they fit the segment (the usual case), split between segments as append()
        does otherwise. Returns each record's offset ('q')."""
        total = len(data)
        if self.files.remaining() < total <= self.files.segment_bytes:
            self.files.roll()  # keep a batch in one write (and one segment): a crash leaves all or none
        if total > self.files.remaining():
            parts, p = [], 0
            for n in array("I", sizes):
                parts.append(data[p:p + n])
                p += n
            return array("q", self.append(parts))
        pos = self.files.append(data)
        offsets = array("q")
        offsets.frombytes(_offsets(sizes, pos))
        return offsets

    def append_raw(self, offset: int, data: bytes) -> int:
        """A replica's append: records another member wrote, at the offset they have there
        (commit-log offsets are the same on every member). `data` must start exactly at the log
        end (a gap or an overlap raises ValueError) and hold whole, CRC-checked atomic batches
        (else CorruptData: nothing is written; a primary sends whole batches, except of a batch
        larger than a segment). Not durable until flush/fsync. Returns the new end."""
        if offset != self.files.end:
            raise ValueError(f"append_raw at {offset}, but the log ends at {self.files.end}")
        if not data:
            return offset
        scan = scan_buffer(bytes(data))
        if scan.stop is not ScanStop.END:
            raise CorruptData(f"replicated bytes at {offset}: not whole intact records "
                              f"({scan.stop.value} at +{scan.end})")
        starts = scan.starts
        parts = [data[s:e] for s, e in zip(starts, list(starts[1:]) + [len(data)], strict=True)]
        got = self.append(parts)
        if got and got[0] != offset:  # (cannot happen: segments are contiguous)
            raise Insane(f"append_raw wrote at {got[0]}, not {offset}")
        return self.files.end

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        """The log's bytes from `offset` (a record boundary): whole atomic batches within one
        segment, about `max_bytes` (more when one batch is larger) — what a primary streams to a
        follower. Only a batch larger than a segment (it spans segments) goes out record by record."""
        if offset >= self.files.end:
            return b""
        seg_end = self.files.segment_end(self.files.segment_of(offset))
        want = min(max(max_bytes, HEADER_SIZE), seg_end - offset)
        while True:
            buf = self.files.read(offset, want)
            scan = scan_buffer(buf, verify=False)
            if scan.batch_end or want >= seg_end - offset:
                return buf[:scan.batch_end or scan.end]
            want = min(seg_end - offset, 2 * want)

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
        need = declared_length(buf, 0)
        if len(buf) < need:
            buf = self.files.read(offset, need)
        return decode(buf, 0, offset)

    def scan(self, start: int, end: int | None = None, report: ScanReport | None = None,
             *, verify: bool = True) -> Iterator[Record]:
        """Yield valid records from `start` up to `end` (default: the log end).

        A damaged record followed by intact data is skipped and counted; the scan resumes at
        the next position where a record with a valid CRC starts. A record of a newer format
        version raises UnsupportedVersion.
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
                except TornRecord as e:
                    # Read more only when it can help: what the record says it needs (a header at
                    # least) is not all in `buf` yet, and the segment holds it. A tail shorter than
                    # a header whose length field reads under a header's size was read again
                    # forever (found by the differential test of `recover`).
                    need = max(declared_length(buf, i), HEADER_SIZE)
                    if len(buf) - i < need and pos + i + need <= seg_end:
                        if i == 0:  # one record larger than the chunk
                            buf = self.files.read(pos, need)
                            continue
                        break  # crosses the chunk boundary: read again from it
                    i = self._resync(pos + i, seg_end, report, e) - pos
                    break
                except CorruptData as e:
                    i = self._resync(pos + i, seg_end, report, e) - pos
                    break
                report.records += 1
                yield rec
                i += rec.size
            pos += i

    def read_records(self, pos: int, max_records: int, end: int | None = None, *,
                     verify: bool = False) -> tuple[list[Record], int]:
        """enqueue-get: up to `max_records` records from `pos` up to `end` (not CRC-checked again:
        the daemon wrote them, or recovery checked them; `verify`: checked, damage skipped as
        `scan` skips it), and the position after them."""
        out: list[Record] = []
        for rec in self.scan(pos, end, verify=verify):
            out.append(rec)
            if len(out) >= max_records:
                break
        if out:
            pos = out[-1].offset + out[-1].size
        return out, pos

    def _resync(self, bad: int, seg_end: int, report: ScanReport, error: CorruptData) -> int:
        """Find the next intact record after a damaged one, within the same segment."""
        data = self.files.read(bad, seg_end - bad)
        j = find_record(data, 1, bad)
        skipped = (seg_end - bad) if j is None else j
        report.skipped_bytes += skipped
        if len(report.damage) < report.max_notes:
            report.damage.append(Damage(bad, skipped, error))
        if j is None:
            return seg_end
        report.skipped_records += 1
        return bad + j

    def recover(self, start: int) -> ScanReport:
        """Check every record from `start` to the end; cut a torn or corrupt tail.

        The tail is what lies after the last intact record of the last segment: an interrupted
        write leaves it, and no produce was acknowledged for it. A record of a newer version
        anywhere on the way raises UnsupportedVersion before anything is cut.
        """
        report = ScanReport()
        last_good = max(start, self.files.start)
        batch_start = last_good
        pos = last_good
        while pos < self.files.end:
            # A buffer at a time through `scan_buffer` (no Record a record: after a kill -9 under
            # load this runs over a checkpoint's worth of produce); where no whole record is at
            # `pos` (one larger than the buffer, damage to step over, a segment's end), one record
            # of the record-at-a-time `scan`, which resyncs and reports.
            base = self.files.segment_of(pos)
            seg_end = self.files.segment_end(base)
            if pos < seg_end:
                found = scan_buffer(self.files.read(pos, min(SCAN_CHUNK, seg_end - pos)), 0, verify=True)
                if found.starts:
                    report.records += len(found.starts)
                    if found.batch_end:
                        batch_start = pos + found.batch_end
                    pos = last_good = pos + found.end
                    continue
            rec = next(self.scan(pos, report=report), None)
            if rec is None:
                break
            pos = last_good = rec.offset + rec.size
            if not rec.flags & RecordFlag.CONTINUED:
                batch_start = last_good
        if batch_start < last_good:
            # The tail ends inside an atomic batch (a torn multi-record write): drop all of it.
            last_good = batch_start
        if last_good < self.files.end and last_good >= self.files.bases[-1]:
            # Anything after the last intact record is a tail that never completed.
            report.skipped_bytes -= min(report.skipped_bytes, self.files.end - last_good)
            report.damage = [d for d in report.damage if d.offset < last_good]
            report.truncated_bytes = self.files.truncate(last_good, "commit log: torn or corrupt tail")
        for d in report.damage:
            base = self.files.segment_of(d.offset)
            log.warning("commit log: %d damaged bytes skipped at offset %d (file %s, position %d: %s); "
                        "the records there are lost", d.size, d.offset, segment_name(base), d.offset - base, d.error)
        return report

    def delete_before(self, offset: int) -> list[int]:
        return self.files.delete_before(offset)

    def disk_bytes(self) -> int:
        return self.files.disk_bytes()

    def close(self) -> None:
        self.files.close()
