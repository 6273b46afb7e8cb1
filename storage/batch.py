"""The batch core: the per-message loops of the pipeline as functions over whole batches.

Each function takes a batch and returns a batch, and comes twice: compiled in C
(`storage/_batch.c` with the stage files `storage/batch_*.c`, module `delayd.storage._batch`, built
by the project's own `pip install`) and here in Python. The Python version is the reference: it
is the specification the C follows, and `tests/storage/test_batch_differential.py` checks with
hypothesis that both give the same bytes for the same input, damaged input included. The pull
stage's references are in storage/batch_pull.py (imported here, so this module holds them all),
what they share with these in storage/batch_common.py. `ops` is the implementation in use: the
compiled one, or this module when it is not built or `DELAYD_PURE=1` is set (storage.native
decides).

Batches move between stages as rows of fixed size in one bytes object (no Python object per
message). Their layouts (little-endian):

MessageRow (MROW = 40 bytes): a commit-log record to index (enqueue-put).

    offset size  field        type  meaning
    ------ ----  -----------  ----  ---------------------------------------------------
       0     8   seq          u64   message sequence number
       8     8   deliver_at   i64   due time, epoch ms
      16     8   offset       i64   the record's commit-log offset
      24     4   size         u32   the record's length
      28     4   topic_hash   u32   crc32 of the topic
      32     4   tag_hash     u32   readyqueue.tag_hash of the tag (0: none)
      36     2   roll_count   u16
      38     1   type         u8    RecordType
      39     1   bits         u8    ROW_KEYED: the record has a key

DueRow (DROW = 48 bytes): a message leaving the timer (dequeue-get-message → dequeue-put).

       0     8   deliver_at   i64
       8     8   seq          u64
      16     8   offset       i64   commit-log record
      24     4   size         u32
      28     4   topic_hash   u32
      32     4   tag_hash     u32
      36     4   bits         u32   ROW_KEYED
      40     8   slot_time    i64   the wheel slot it was loaded from (in-flight accounting)

FarRow (FAR_ROW = 20 bytes): a message `index_rows` parked far (a ROLL unit), for the far index
and the hourly far counts.

       0     8   deliver_at   i64
       8     8   seq          u64
      16     4   topic_hash   u32

UnitRow (UROW = 60 bytes): a TimerLog unit taken out of the wheel: its position (i64), then the
52 unit bytes of storage/timerlog.py.

Wheel slots travel as the wheel's own 32-byte slots (storage/timerwheel.py), message-table
entries as the table's 16-byte entries, ready-queue units as the queue's 40-byte units.
"""

from __future__ import annotations

import bisect
import heapq
import struct
import sys
import zlib
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import msgpack
from delayd.storage import native
from delayd.storage.batch_common import (
    MROW_FMT,
    SCAN_OK,
    SpanLike,
    check_record,
    read_record,
    require,
    span_entry,
    touch,
    utf8_or_none,
)

# The pull stage's references, here too so that `ops` has every batch function without the core:
from delayd.storage.batch_pull import PROW
from delayd.storage.batch_pull import encode_pull as encode_pull
from delayd.storage.batch_pull import parse_receipts as parse_receipts
from delayd.storage.batch_pull import parse_receipts_raw as parse_receipts_raw
from delayd.storage.batch_pull import read_plan as read_plan
from delayd.storage.batch_pull import record_keys as record_keys
from delayd.storage.batch_pull import take_rows as take_rows
from delayd.storage.batch_recovery import census as census
from delayd.storage.batch_recovery import message_runs as message_runs
from delayd.storage.batch_recovery import restore_states as restore_states
from delayd.storage.commitlog import HEADER as RECORD
from delayd.storage.commitlog import MAX_RECORD, RECORD_VERSION, RecordFlag, RecordType
from delayd.storage.msgtable import ENTRY, MessageState
from delayd.storage.readyqueue import UNIT as READY
from delayd.storage.readyqueue import bounds_py
from delayd.storage.timerlog import NO_POS, UNIT, UNIT_SIZE, UnitMagic
from delayd.storage.timerwheel import SLOT

DUE = struct.Struct("<qQqIIIIq")
FAR = struct.Struct("<qQI")
UROW_POS = struct.Struct("<q")
MROW, DROW, FAR_ROW, UROW = MROW_FMT.size, DUE.size, FAR.size, 8 + UNIT_SIZE
assert (MROW, DROW, FAR_ROW, UROW) == (40, 48, 20, 60)
ROW_KEYED = 1
# message-table flags (storage.schedule.Placed): counted in the per-slot schedule, parked far
FLAG_SLOT, FLAG_FAR = 1, 2

SCAN_READ = 1 << 20  # read_rows reads at most this much of the log at once
KIND_DROP, KIND_DUE, KIND_ROLL = 0, 1, 2
_FIELDS = frozenset({"body", "body_b64", "delay_ms", "deliver_at", "key", "tag", "headers", "replace"})
_CONTINUED = int(RecordFlag.CONTINUED)
_MESSAGE, _ROLL, _GROUP, _LAST = int(RecordType.MESSAGE), int(RecordType.ROLL), int(RecordType.GROUP), \
    max(map(int, RecordType))
_SCHEDULED, _DELIVERED, _CANCELLED = int(MessageState.SCHEDULED), int(MessageState.DELIVERED), \
    int(MessageState.CANCELLED)


def _i32(buf: Any) -> memoryview:
    """An i32 view of a writable buffer (array('i'), bytearray, mmap)."""
    return memoryview(buf).cast("B").cast("i")


def _mp_str(s: bytes) -> int:
    n = len(s)
    return 1 + n if n < 32 else 2 + n if n < 256 else 3 + n if n < 65536 else 5 + n


# ------------------------------------------------------------------------------------ produce
def _parse_item(m: Any, now_ms: int, limits: tuple[int, ...]) -> tuple | None:
    """The fast path's reading of one message object, or None when it does not decide it."""
    max_body, max_delay, max_tag_chars, max_tag_bytes, max_key_bytes, max_headers, max_header_bytes = limits
    if type(m) is not dict or not all(type(k) is str for k in m) or not set(m) <= _FIELDS:
        return None
    if "body_b64" in m or "body" not in m:
        return None
    b = m["body"]
    if type(b) is bytes:
        body = b
    elif type(b) is str:
        utf8 = utf8_or_none(b)
        if utf8 is None:
            return None
        body = utf8
    else:
        return None
    if len(body) > max_body:
        return None
    if "delay_ms" in m and "deliver_at" in m:
        return None
    if "delay_ms" in m:
        d = m["delay_ms"]
        if type(d) is not int or not 0 <= d <= max_delay or d > (1 << 63) - 1:
            return None
        deliver_at = now_ms + d
    elif "deliver_at" in m:
        t = m["deliver_at"]
        if type(t) is not int or not 0 <= t <= now_ms + max_delay or t > (1 << 63) - 1:
            return None
        deliver_at = t
    else:
        deliver_at = now_ms
    key = m.get("key")
    kb = b""
    if key is not None:
        if type(key) is not str:
            return None
        kb2 = utf8_or_none(key)
        if kb2 is None or not 1 <= len(kb2) <= min(max_key_bytes, 65535):
            return None
        kb = kb2
    tag = m.get("tag")
    tb = b""
    if tag is not None:
        if type(tag) is not str or len(tag) > max_tag_chars:
            return None
        tb2 = utf8_or_none(tag)
        if tb2 is None or len(tb2) > min(max_tag_bytes, 255):
            return None
        tb = tb2
    hb = b""
    headers = m.get("headers")
    if headers is not None:
        if type(headers) is not dict or len(headers) > max_headers:
            return None
        if headers:
            size, enc = 0, 1 if len(headers) < 16 else 3 if len(headers) < 65536 else 5
            for k, v in headers.items():
                if type(k) is not str or type(v) is not str:
                    return None
                k8, v8 = utf8_or_none(k), utf8_or_none(v)
                if k8 is None or v8 is None:
                    return None
                size += len(k8) + len(v8)
                enc += _mp_str(k8) + _mp_str(v8)
            if size > max_header_bytes or enc > 65535:
                return None
            hb = msgpack.packb(headers)
    replace = m.get("replace", False)
    if type(replace) is not bool:
        return None
    return body, deliver_at, kb, tb, hb, replace, key


def encode_produce(items: list[Any], topic: bytes, now_ms: int, first_seq: int, limits: tuple[int, ...],
                   select: bytes | None) -> tuple[bytes, bytes, bytes, list[str | None] | None,
                                                  list[bool] | None] | None:
    """Validate a produce batch and encode the selected items as MESSAGE records.

    None when the fast path does not decide the batch: an item is invalid, or valid only in a form
    the API's reference parser handles (body_b64, a due time as text, ...). The caller then runs
    that parser, which raises the right error. Otherwise (records, sizes, deliver_at, keys,
    replace): the records of the items in `select` (u32 indexes; all items when None) with seqs
    first_seq, first_seq+1, ..., each CONTINUED but the last, produced at now_ms; each record's size
    (u32); every item's due time (i64); per item its key (None without) or None when no item has
    one; per item its replace flag or None when none asks for it. `limits`: max body bytes, max
    delay ms, max tag characters, max tag bytes, max key bytes, max headers, max header bytes.
    """
    require(1 <= len(topic) <= 255, "topic must be 1-255 bytes")
    parsed = []
    for m in items:
        p = _parse_item(m, now_ms, limits)
        if p is None:
            return None
        parsed.append(p)
    require(select is None or len(select) % 4 == 0, "select must hold u32 indexes")
    order = range(len(parsed)) if select is None else struct.unpack(f"<{len(select) // 4}I", select)
    for i in order:
        if i >= len(parsed):
            raise IndexError("select index out of range")
    chosen = [parsed[i] for i in order]
    for body, _d, kb, tb, hb, _r, _k in chosen:
        if RECORD.size + len(topic) + len(tb) + len(kb) + len(hb) + len(body) > MAX_RECORD:
            return None
    recs, sizes = [], []
    last = len(chosen) - 1
    for j, (body, deliver_at, kb, tb, hb, _r, _k) in enumerate(chosen):
        rest = RECORD.pack(0, 0, RECORD_VERSION, _MESSAGE, _CONTINUED if j < last else 0, first_seq + j, deliver_at,
                           now_ms, 0, len(topic), len(tb), len(kb), len(hb), len(body))[8:]
        rest += topic + tb + kb + hb + body
        rec = struct.pack("<II", len(rest) + 8, zlib.crc32(rest)) + rest
        recs.append(rec)
        sizes.append(len(rec))
    keys = [p[6] for p in parsed] if any(p[6] is not None for p in parsed) else None
    replace = [p[5] for p in parsed] if any(p[5] for p in parsed) else None
    return (b"".join(recs), struct.pack(f"<{len(sizes)}I", *sizes),
            struct.pack(f"<{len(parsed)}q", *(p[1] for p in parsed)), keys, replace)


def encode_produce_raw(raw: bytes | bytearray | memoryview, topic: bytes, now_ms: int, first_seq: int,
                       limits: tuple[int, ...], max_batch: int, max_elements: int, select: bytes | None
                       ) -> tuple[bytes, bytes, bytes, list[str | None] | None, list[bool] | None] | None:
    """`encode_produce` for a msgpack produce body as it arrived: exactly `{"messages": [...]}`
    with 1..max_batch messages, nothing after it, and at most `max_elements` map keys, values and
    array items in all (broker.bodies' element budget). None when it does not decide the body.

    The compiled version reads the bytes without building objects and may leave undecided what
    this one decides (a map key given twice, a header name given twice, more than 64 headers):
    where it decides, the result is this one's, byte for byte, and it never decides a body this
    one leaves undecided. An undecided body goes to the API's full parser, which answers it."""
    try:
        top = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception:  # noqa: BLE001 - whatever does not decode is the full parser's to answer
        return None
    if type(top) is not dict or list(top) != ["messages"]:
        return None
    items = top["messages"]
    if type(items) is not list or not 1 <= len(items) <= max_batch:
        return None
    elements = 2 + len(items)
    for m in items:
        if type(m) is dict:
            h = m.get("headers")
            elements += 2 * len(m) + (2 * len(h) if type(h) is dict else 0)
    if elements > max_elements:
        return None
    return encode_produce(items, topic, now_ms, first_seq, limits, select)


def produced_rows(records: bytes, offsets: bytes, topic_hash: int) -> tuple[bytes, bytes]:
    """For records just appended (whole records back to back, and each one's commit-log offset as
    i64): their message-table entries (SCHEDULED, flags 0, roll 0, size, offset) and the
    MessageRows enqueue-put indexes — what a scan of the log would give, without reading it."""
    raw = memoryview(offsets).cast("B")  # bytes, or the array('q') CommitLog.append_packed returns
    require(len(raw) % 8 == 0, "offsets must be i64")
    n = len(raw) // 8
    offs = struct.unpack(f"<{n}q", raw)
    entries, rows = [], []
    p = 0
    for off in offs:
        if len(records) - p < RECORD.size:
            raise ValueError("records shorter than their offsets")
        (length, _crc, _v, rtype, _f, seq, deliver_at, _pa, roll, tl, gl, kl, _hl, _bl) = RECORD.unpack_from(records, p)
        if length < RECORD.size or len(records) - p < length:
            raise ValueError("record length")
        if RECORD.size + tl + gl > length:
            raise ValueError("record fields")
        tag = records[p + RECORD.size + tl:p + RECORD.size + tl + gl]
        entries.append(ENTRY.pack(_SCHEDULED, 0, 0, length, off))
        rows.append(MROW_FMT.pack(seq, deliver_at, off, length, topic_hash, _tag_hash_bytes(tag), roll, rtype,
                                  ROW_KEYED if kl else 0))
        p += length
    return b"".join(entries), b"".join(rows)


def _tag_hash_bytes(tag: bytes) -> int:
    return (zlib.crc32(tag) or 1) if tag else 0


# ------------------------------------------------------------------------------------ scan
def scan_rows(buf: bytes | memoryview, base: int, verify: bool, max_records: int) -> tuple[bytes, int, int]:
    """MessageRows of the whole records at the start of `buf` (which sits at commit-log offset
    `base`), until max_records, the end of the buffer, or a record that does not check out.
    Returns (rows, bytes consumed, outcome): outcome says why it stopped (SCAN_OK: end of buffer or
    max_records; SCAN_TORN, SCAN_CORRUPT, SCAN_VERSION) — whether that is a chunk boundary, a torn
    tail or damage is the caller's call (CommitLog.scan)."""
    rows: list[bytes] = []
    i = 0
    outcome = SCAN_OK
    while i < len(buf) and len(rows) < max_records:
        c, length = check_record(buf, i, verify)
        if c != SCAN_OK:
            outcome = c
            break
        (_l, _c, _v, rtype, _f, seq, deliver_at, _p, roll, tl, gl, kl, _h, _b) = RECORD.unpack_from(buf, i)
        topic = bytes(buf[i + RECORD.size:i + RECORD.size + tl])
        tag = bytes(buf[i + RECORD.size + tl:i + RECORD.size + tl + gl])
        rows.append(MROW_FMT.pack(seq, deliver_at, base + i, length, zlib.crc32(topic), _tag_hash_bytes(tag), roll,
                                  rtype, ROW_KEYED if kl else 0))
        i += length
    return b"".join(rows), i, outcome


def row_of(rec: Any, topic_hash: int | None = None) -> bytes:
    """The MessageRow of a decoded commit-log record (storage.commitlog.Record)."""
    th = zlib.crc32(rec.topic.encode()) if topic_hash is None else topic_hash
    tag = rec.tag.encode() if rec.tag else b""
    return MROW_FMT.pack(rec.seq, rec.deliver_at, rec.offset, rec.size, th, _tag_hash_bytes(tag), rec.roll_count,
                         int(rec.type), ROW_KEYED if rec.key else 0)


def due_row(deliver_at: int, seq: int, offset: int, size: int, topic_hash: int, tag_hash: int, keyed: bool,
            slot_time: int) -> bytes:
    return DUE.pack(deliver_at, seq, offset, size, topic_hash, tag_hash, ROW_KEYED if keyed else 0, slot_time)


def unit_row(u: Any) -> bytes:
    """The UnitRow of a storage.timerlog.Unit."""
    return UROW_POS.pack(u.pos) + UNIT.pack(UNIT_SIZE, u.prev_pos, int(u.magic), u.enqueue_time, u.delay,
                                            u.commit_offset, u.commit_size, u.topic_hash, u.seq)


def read_rows(commit: Any, pos: int, max_records: int, end: int | None = None, *,
              verify: bool = False) -> tuple[bytes, int]:
    """enqueue-get: MessageRows of up to `max_records` records from commit-log offset `pos` up to
    `end` (default: the log's end), not CRC-checked again (the daemon wrote them, or recovery
    checked them; `verify`: checked, for recovery's passes), and the offset after them. One read
    and one compiled scan per call; where no whole record is at `pos` (one larger than a read,
    damage to step over, a newer version) the commit log's own scan decides."""
    files = commit.files
    stop = files.end if end is None else min(end, files.end)
    if pos >= stop:
        return b"", pos
    base = files.segment_of(pos)
    seg_end = min(files.segment_end(base), stop)
    if pos < seg_end:
        buf = files.read(pos, min(SCAN_READ, seg_end - pos))
        rows, consumed, _outcome = ops.scan_rows(buf, pos, verify, max_records)
        if consumed:
            return rows, pos + consumed
    records, after = commit.read_records(pos, max_records, stop, verify=verify)
    return b"".join(row_of(r) for r in records), after


# ------------------------------------------------------------------------------------ enqueue-put
def index_rows(rows: bytes, start: int, spans: Sequence[SpanLike], wheel: Any, header_size: int, precision: int,
               nslots: int, load_time: int, window_end: int, unsafe_from: int, tlog_pos: int,
               now_ms: int, max_units: int) -> tuple[int, bytes, bytes, bytes, bytes, bytes, bytes]:
    """enqueue-put's common case for MessageRows[start:], in order; returns (consumed, units, slots,
    late, counts, far, near).

    A GROUP record is consumed with nothing to index. A MESSAGE whose message-table entry is
    SCHEDULED at this record and whose due time is inside the window (`window_end`), in a slot that
    may take a unit (fire before `unsafe_from`, else the slot's previous lap is not dispatched
    yet), gets a DEFAULT unit: in its own slot (its slot index in `counts`, flag FLAG_SLOT), or — when its
    slot was already loaded (due before `load_time`) — in slot `load_time`, flags 0, plus a DueRow
    in `late` so dequeue-put gets it now. One due beyond the window is parked far (RIP-43): a ROLL
    unit at its roll slot — `base + window // 2` when it is due within a third of a window after
    `window_end`, else `base + window`, with base = max(now_ms, load_time) and window =
    window_end - base (which must be positive) — flag FLAG_FAR, and a FarRow in `far` for the
    far index and the hourly counts. A cancelled MESSAGE loses its flags; one delivered or
    superseded (the table points elsewhere) is consumed as is.

    A ROLL record (a far message's roll copy) is current when its message is SCHEDULED and the
    table points at it, or points at an older record whose roll_count is not above the copy's:
    then the entry is moved to the copy (state, flags 0, roll_count, size, offset) once its unit
    is sure to be made. It gets its unit as a MESSAGE does, except that one still far is already
    in the far index (flag FAR, no FarRow), and one that came inside the window leaves it: a
    FarRow in `near`. A roll copy of a message no longer SCHEDULED, or older than the table's,
    is consumed as is.

    Anything else stops the batch at that row and the caller's full path (Store) takes it:
    cancel records, a message not in the spans, a full lap, max_units units made.

    Units are returned, not written: the caller appends them to the TimerLog at `tlog_pos`, then
    writes `slots` (the new state of every slot touched, as 32-byte wheel slots) with put_slots —
    a unit is on file before a slot points at it — and adds `counts` (u32 slot indexes) to the
    schedule with add_counts (a batch that fails and is retried counts once). The spans' flag
    bytes are updated in place.
    """
    require(precision > 0 and nslots > 0, "bad wheel geometry")
    require(len(rows) % MROW == 0 and header_size >= 0 and len(wheel) >= header_size + nslots * SLOT.size,
          "rows or wheel have the wrong size")
    n = len(rows) // MROW
    if not 0 <= start <= n:
        raise IndexError("start")
    slots: dict[int, list[int]] = {}
    units, late, incs, far, near = [], [], [], [], []
    pos = tlog_pos
    i = start
    made = 0
    while i < n and made < max_units:
        seq, deliver_at, offset, size, th, tgh, roll, rtype, bits = MROW_FMT.unpack_from(rows, i * MROW)
        if rtype == _GROUP:
            i += 1
            continue
        if rtype != _MESSAGE and rtype != _ROLL:
            break
        hit = span_entry(spans, seq)
        if hit is None:
            break
        span, at, readable = hit
        state, _fl, eroll, _sz, eoff = ENTRY.unpack_from(span.buf, at) if readable else (0, 0, 0, 0, -1)
        moved = False  # a roll copy the entry moves to
        if rtype == _ROLL:
            if state in (_CANCELLED, _DELIVERED) or (state == _SCHEDULED and eoff != offset and roll < eroll):
                i += 1
                continue
            if state != _SCHEDULED:
                break  # UNKNOWN: the reference decides
            moved = eoff != offset
        elif state == _CANCELLED:
            span.buf[at + 1] = 0
            touch(span, at + 1, at + 2)
            i += 1
            continue
        elif state != _SCHEDULED or eoff != offset:
            if state == _DELIVERED or (state == _SCHEDULED and eoff != offset):
                i += 1
                continue
            break
        unit = int(UnitMagic.DEFAULT)
        if deliver_at > window_end:
            base = max(now_ms, load_time)
            window = window_end - base
            if window <= 0:
                break
            fire = base + (window // 2 if deliver_at - window_end < window // 3 else window)
            unit = int(UnitMagic.ROLL)
        else:
            fire = load_time if deliver_at < load_time else deliver_at
        if fire >= unsafe_from or not -(1 << 31) <= fire - now_ms < 1 << 31:
            break
        st = fire - fire % precision
        if moved:
            ENTRY.pack_into(span.buf, at, _SCHEDULED, 0, roll, size, offset)
            touch(span, at, at + ENTRY.size)
        s = slots.get(st)
        if s is None:
            t, first, last, num, magic = SLOT.unpack_from(wheel, header_size + st // precision % nslots * SLOT.size)
            s = slots[st] = [first, last, num, magic] if t == st and num > 0 else [NO_POS, NO_POS, 0, 0]
        units.append(UNIT.pack(UNIT_SIZE, s[1], unit, now_ms, fire - now_ms, offset, size, th, seq))
        if s[2] == 0:
            s[0] = pos
        s[1] = pos
        s[2] += 1
        s[3] |= unit
        pos += UNIT_SIZE
        made += 1
        if unit == UnitMagic.ROLL:
            span.buf[at + 1] = FLAG_FAR
            if rtype == _MESSAGE:  # a roll copy's message is in the far index already
                far.append(FAR.pack(deliver_at, seq, th))
        else:
            if rtype == _ROLL:
                near.append(FAR.pack(deliver_at, seq, th))
            if deliver_at >= load_time:
                incs.append(deliver_at // precision % nslots)
                span.buf[at + 1] = FLAG_SLOT
            else:
                span.buf[at + 1] = 0
                late.append(DUE.pack(deliver_at, seq, offset, size, th, tgh, bits, st))
        touch(span, at + 1, at + 2)
        i += 1
    slot_bytes = b"".join(SLOT.pack(st, *s) for st, s in slots.items())
    return (i - start, b"".join(units), slot_bytes, b"".join(late), struct.pack(f"<{len(incs)}I", *incs),
            b"".join(far), b"".join(near))


def add_counts(counts: Any, indexes: bytes) -> None:
    """counts[i] += 1 (i32) for every u32 slot index (index_rows' `counts`, once its units are on
    file). An index out of range is an error and nothing is added."""
    cnt = _i32(counts)
    require(len(indexes) % 4 == 0, "slot index out of range")
    ix = struct.unpack(f"<{len(indexes) // 4}I", indexes)
    require(all(i < len(cnt) for i in ix), "slot index out of range")
    for i in ix:
        cnt[i] += 1


def put_slots(wheel: Any, header_size: int, precision: int, nslots: int, slots: bytes) -> None:
    """Write 32-byte wheel slots (as index_rows returns them) to their places in the wheel."""
    require(precision > 0 and nslots > 0, "bad wheel geometry")
    require(len(slots) % SLOT.size == 0 and len(wheel) >= header_size + nslots * SLOT.size,
          "slots or wheel have the wrong size")
    for k in range(len(slots) // SLOT.size):
        raw = slots[k * SLOT.size:(k + 1) * SLOT.size]
        st = SLOT.unpack(raw)[0]
        at = header_size + st // precision % nslots * SLOT.size
        wheel[at:at + SLOT.size] = raw


# ------------------------------------------------------------------------------------ dequeue-get
class Walker:
    """One slot's chain, newest first (TimerIndex.walk): `feed` walks it through windows of
    TimerLog bytes, applying DELETE markers (a marker is always newer than its target)."""

    def __init__(self, slot_time: int, precision: int, last_pos: int) -> None:
        if precision <= 0:
            raise ValueError("precision")
        self.slot_time, self.precision, self.pos = slot_time, precision, last_pos
        self._deleted: set[int] = set()

    def feed(self, buf: bytes | memoryview, buf_pos: int, max_units: int) -> tuple[bytes, int]:
        """(UnitRows of the live units walked inside `buf` — TimerLog bytes at `buf_pos` — at most
        max_units, outcome): 0 the chain ended, 1 more to come at `pos` (outside `buf`, or past
        max_units), 2 damage at `pos` (not a unit, or a unit of another slot)."""
        out: list[bytes] = []
        end = buf_pos + len(buf)
        while True:
            if self.pos == NO_POS:
                return b"".join(out), 0
            if len(out) >= max_units or self.pos < buf_pos or self.pos + UNIT_SIZE > end:
                return b"".join(out), 1
            at = self.pos - buf_pos
            size, prev, magic, enq, delay, off, _cs, _th, seq = UNIT.unpack_from(buf, at)
            if size != UNIT_SIZE or prev >= self.pos or prev < NO_POS or not 0 < magic < 8 or off < 0:
                return b"".join(out), 2
            fire = enq + delay
            if fire - fire % self.precision != self.slot_time:
                return b"".join(out), 2
            if magic & UnitMagic.DELETE:
                self._deleted.add(seq)
            elif seq not in self._deleted:
                out.append(UROW_POS.pack(self.pos) + bytes(buf[at:at + UNIT_SIZE]))
            self.pos = prev


# ------------------------------------------------------------------------------------ dequeue-get-message
def classify(units: bytes, spans: Sequence[SpanLike]) -> tuple[bytes, bytes]:
    """(kinds, locations) for UnitRows: KIND_DUE / KIND_ROLL for a unit whose message is SCHEDULED
    and whose table entry points at this unit's record (DEFAULT / ROLL unit), else KIND_DROP
    (cancelled, delivered, unknown, or a stale unit of a message that rolled since).
    `locations`: (offset i64, size u32) of the current record of every live unit, in order."""
    require(len(units) % UROW == 0, "units")
    kinds = bytearray(len(units) // UROW)
    locs = []
    for i in range(len(kinds)):
        _size, _prev, magic, _e, _d, off, _cs, _th, seq = UNIT.unpack_from(units, i * UROW + 8)
        hit = span_entry(spans, seq)
        if hit is None or not hit[2]:
            continue
        state, _f, _r, esize, eoff = ENTRY.unpack_from(hit[0].buf, hit[1])
        if state != _SCHEDULED or eoff != off:
            continue
        kinds[i] = KIND_ROLL if magic & UnitMagic.ROLL else KIND_DUE
        locs.append(struct.pack("<qI", eoff, esize))
    return bytes(kinds), b"".join(locs)


def unit_records(units: bytes, kinds: bytes, reads: list[tuple[int, bytes]], kind: int,
                 problems: list) -> Iterator[tuple[int, int, Any, int]]:
    """For `dues` and `roll_copies`: (unit offset, record length, buffer, place in it) of the
    record of each unit of `kind`, from `reads` ((commit-log offset, bytes) sorted by offset),
    checked as commitlog.decode checks it (CRC included). A unit whose record is not in `reads`
    (outcome 0: the caller reads it itself) or does not check out (SCAN_TORN, SCAN_CORRUPT,
    SCAN_VERSION) goes into `problems` as (unit index, outcome)."""
    require(len(units) % UROW == 0 and len(kinds) == len(units) // UROW, "units/kinds")
    starts = [s for s, _ in reads]
    for i in range(len(units) // UROW):
        if kinds[i] != kind:
            continue
        _s, _p, _m, _e, _d, off, size, _th, _seq = UNIT.unpack_from(units, i * UROW + 8)
        found = read_record(reads, starts, off, size)
        if found is None or found[0] != SCAN_OK:
            problems.append((i, 0 if found is None else found[0]))
            continue
        yield off, found[1], found[2], found[3]


def dues(units: bytes, kinds: bytes, reads: list[tuple[int, bytes]], slot_time: int) -> tuple[bytes, list]:
    """DueRows of the units classified KIND_DUE, from their records (`unit_records`): deliver_at,
    seq, offset and size from the record, the hashes of its topic and tag, the keyed bit, and
    `slot_time`; `problems` as `unit_records` gives them."""
    out: list[bytes] = []
    problems: list[tuple[int, int]] = []
    for off, length, buf, at in unit_records(units, kinds, reads, KIND_DUE, problems):
        (_l, _c, _v, _t, _f, seq, deliver_at, _pa, _r, tl, gl, kl, _h, _b) = RECORD.unpack_from(buf, at)
        topic = bytes(buf[at + RECORD.size:at + RECORD.size + tl])
        tag = bytes(buf[at + RECORD.size + tl:at + RECORD.size + tl + gl])
        out.append(DUE.pack(deliver_at, seq, off, length, zlib.crc32(topic), _tag_hash_bytes(tag),
                            ROW_KEYED if kl else 0, slot_time))
    return b"".join(out), problems


MAX_ROLL_COUNT = 0xFFFF  # a record's roll_count (u16) stays here once there


def roll_copies(units: bytes, kinds: bytes, reads: list[tuple[int, bytes]]) -> tuple[bytes, bytes, list]:
    """The roll copies of the units classified KIND_ROLL, packed back to back for one append
    (`sizes`: each copy's length, u32), in unit order: the record (`unit_records`) again with
    type ROLL, flags 0, roll_count + 1 (it stays at MAX_ROLL_COUNT) and its CRC made anew; every
    other byte is the record's own. `problems` as in `dues`."""
    out: list[bytearray] = []
    sizes: list[int] = []
    problems: list[tuple[int, int]] = []
    for _off, length, buf, at in unit_records(units, kinds, reads, KIND_ROLL, problems):
        copy = bytearray(buf[at:at + length])
        copy[9], copy[10:12] = RecordType.ROLL, b"\0\0"
        roll = int.from_bytes(copy[36:38], "little")
        copy[36:38] = min(roll + 1, MAX_ROLL_COUNT).to_bytes(2, "little")
        copy[4:8] = zlib.crc32(copy[8:]).to_bytes(4, "little")
        out.append(copy)
        sizes.append(length)
    return b"".join(out), struct.pack(f"<{len(sizes)}I", *sizes), problems


# ------------------------------------------------------------------------------------ dequeue-put
class DueHeap:
    """DueRows ordered by (deliver_at, seq, then the row's bytes — a total order, so equal
    inputs come out equally): dequeue-put holds messages here until they are due."""

    def __init__(self) -> None:
        self._h: list[tuple[int, int, bytes]] = []

    def push(self, rows: bytes) -> None:
        require(len(rows) % DROW == 0, "dues")
        for k in range(len(rows) // DROW):
            row = rows[k * DROW:(k + 1) * DROW]
            deliver_at, seq = struct.unpack_from("<qQ", row)
            heapq.heappush(self._h, (deliver_at, seq, row))

    def pop(self, now_ms: int, max_n: int) -> bytes:
        out: list[bytes] = []
        while self._h and len(out) < max_n and self._h[0][0] <= now_ms:
            out.append(heapq.heappop(self._h)[2])
        return b"".join(out)

    def next_due(self) -> int | None:
        return self._h[0][0] if self._h else None

    def __len__(self) -> int:
        return len(self._h)


def release_rows(rows: bytes, spans: Sequence[SpanLike], now_ms: int) -> dict[int, tuple[bytes, bytes, bytes]]:
    """dequeue-put's check for DueRows: a message is released once, and only while SCHEDULED at
    the same record (a cancel that arrived meanwhile wins). Per topic hash: (ready-queue units
    (offset, size, tag_hash, deliver_at, released_at=now_ms, seq), u64 seqs, (offset i64, size u32)
    of the released ones that have a key). Nothing is marked: the caller appends each topic's
    units, then marks them delivered with set_states (and the keyed ones in the key index)."""
    require(len(rows) % DROW == 0, "dues")
    seen: set[int] = set()
    out: dict[int, tuple[list[bytes], list[bytes], list[bytes]]] = {}
    for k in range(len(rows) // DROW):
        deliver_at, seq, off, size, th, tgh, bits, _st = DUE.unpack_from(rows, k * DROW)
        if seq in seen:
            continue
        hit = span_entry(spans, seq)
        if hit is None or not hit[2]:
            continue
        state, _f, _r, _s, eoff = ENTRY.unpack_from(hit[0].buf, hit[1])
        if state != _SCHEDULED or eoff != off:
            continue
        seen.add(seq)
        units, seqs, keyed = out.setdefault(th, ([], [], []))
        units.append(READY.pack(off, size, tgh, deliver_at, now_ms, seq))
        seqs.append(struct.pack("<Q", seq))
        if bits & ROW_KEYED:
            keyed.append(struct.pack("<qI", off, size))
    return {th: (b"".join(u), b"".join(s), b"".join(k)) for th, (u, s, k) in out.items()}


def set_states(seqs: bytes, spans: Sequence[SpanLike], state: int) -> int:
    """The entries of u64 `seqs` take `state`; returns how many were in no span (the caller
    writes those itself)."""
    require(0 <= state <= 255, "state")
    require(len(seqs) % 8 == 0, "seqs")
    missing = 0
    for (seq,) in struct.iter_unpack("<Q", seqs):
        hit = span_entry(spans, seq)
        if hit is None:
            missing += 1
            continue
        span, at, _readable = hit
        span.buf[at] = state
        touch(span, at, at + 1)
    return missing


def encode_produced(seqs: bytes | int, deliver_at: bytes, duplicate: bytes, prefix: bytes, as_json: bool) -> bytes | None:
    """The answer of a produce, ``{"messages": [{"id", "deliver_at", "duplicate"}, ...]}``, as
    msgpack.packb or json.dumps(separators=(",", ":")) writes it; ids are prefix + seq in hex.
    `seqs`: each message's (u64), or an int, the first of consecutive seqs (a produce that stored
    every message). None for JSON with a prefix that is not plain ASCII (the caller encodes that
    itself)."""
    if isinstance(seqs, int):
        require(0 <= seqs < 1 << 64, "seqs: out of range")
        n = len(deliver_at) // 8
        require(len(deliver_at) == 8 * n and len(duplicate) == n, "seqs, deliver_at and duplicate must be of one length")
        require(seqs + max(n - 1, 0) < 1 << 64, "seqs: out of range")
        seqs = struct.pack(f"<{n}Q", *range(seqs, seqs + n))
    n = len(seqs) // 8
    require(len(seqs) % 8 == 0 and len(deliver_at) == 8 * n and len(duplicate) == n,
          "seqs, deliver_at and duplicate must be of one length")
    if as_json and any(b >= 0x80 or b < 0x20 or b in b'"\\' for b in prefix):
        return None
    if not as_json and len(prefix) > 64:
        raise ValueError("prefix")
    p = prefix.decode()
    msgs = [{"id": p + format(s, "x"), "deliver_at": d, "duplicate": bool(u)} for s, d, u in
            zip(struct.unpack(f"<{n}Q", seqs), struct.unpack(f"<{n}q", deliver_at), duplicate, strict=True)]
    if as_json:
        import json
        return json.dumps({"messages": msgs}, separators=(",", ":")).encode()
    return msgpack.packb({"messages": msgs}, use_bin_type=True)


def lateness(rows: bytes, stride: int, at: int, now_ms: int) -> bytes:
    """now_ms minus the i64 due time `at` that offset of every row of `stride` bytes (i64 each):
    DueRows (DROW, 0) or ready-queue units (40, 16)."""
    require(stride >= 8 and 0 <= at and at + 8 <= stride, "stride/at")
    require(len(rows) % stride == 0, "rows")
    n = len(rows) // stride
    return struct.pack(f"<{n}q", *(now_ms - struct.unpack_from("<q", rows, k * stride + at)[0] for k in range(n)))


def bucket_counts(values: bytes, bounds: bytes) -> tuple[list[int], int]:
    """How many i64 `values` fall in each bucket (value <= bounds[k], the first such k; the last
    count: past every bound, +Inf) and their sum: a Prometheus histogram's observations of a
    batch at once. `bounds`: ascending i64s."""
    require(len(values) % 8 == 0 and len(bounds) % 8 == 0, "values/bounds")
    bs = list(struct.unpack(f"<{len(bounds) // 8}q", bounds))
    require(bs == sorted(bs), "bounds must ascend")
    counts = [0] * (len(bs) + 1)
    total = 0
    for (v,) in struct.iter_unpack("<q", values):
        counts[bisect.bisect_left(bs, v)] += 1
        total += v
    return counts, total


def unit_bounds(units: bytes) -> tuple[int, int]:
    """(lowest commit offset, latest release time) of packed ready-queue units; (1 << 62, 0)
    for none (what ready-queue retention keeps per segment)."""
    require(len(units) % READY.size == 0, "units")
    return bounds_py(units)


def tally(rows: bytes, stride: int, at: int) -> dict[int, int]:
    """{value: count} of the i64 field `at` that offset in rows of `stride` bytes."""
    require(stride >= 8 and 0 <= at and at + 8 <= stride, "stride/at")
    require(len(rows) % stride == 0, "rows")
    out: dict[int, int] = {}
    for k in range(len(rows) // stride):
        (v,) = struct.unpack_from("<q", rows, k * stride + at)
        out[v] = out.get(v, 0) + 1
    return out


# ------------------------------------------------------------------------------------ helpers
def crc32(data: bytes | memoryview, value: int = 0) -> int:
    return zlib.crc32(data, value)


def seq_runs(seqs: bytes, segment_entries: int, gap: int, stride: int = 8, at: int = 0) -> list[tuple[int, int, int]]:
    """The distinct u64 seqs, sorted, cut into runs within one message-table segment whose
    neighbours are at most `gap` apart: (segment, first index, last index) per run
    (MessageTable.begin_runs reads each with one pread). `seqs` holds rows of `stride` bytes with
    the u64 seq `at` that offset in each (8, 0: plain u64s)."""
    require(segment_entries > 0, "segment_entries")
    require(stride >= 8 and 0 <= at and at + 8 <= stride, "stride/at")
    require(len(seqs) % stride == 0, "seqs")
    s = sorted(struct.unpack_from("<Q", seqs, k * stride + at)[0] for k in range(len(seqs) // stride))
    out = []
    i = 0
    while i < len(s):
        seg = s[i] // segment_entries
        j = i + 1
        while j < len(s) and s[j] // segment_entries == seg and s[j] - s[j - 1] <= gap:
            j += 1
        out.append((seg, s[i] % segment_entries, s[j - 1] % segment_entries))
        i = j
    return out


def _check(c: ModuleType) -> ModuleType:
    assert (c.MROW, c.DROW, c.UROW, c.PROW) == (MROW, DROW, UROW, PROW)
    assert (c.RECORD_HEADER, c.UNIT_SIZE, c.ENTRY_SIZE, c.READY_UNIT, c.RECORD_VERSION) == \
        (RECORD.size, UNIT_SIZE, ENTRY.size, READY.size, RECORD_VERSION)
    return c


_compiled = native.compiled()
ops: Any = _check(_compiled) if _compiled is not None else sys.modules[__name__]
