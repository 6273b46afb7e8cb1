"""The batch core's pull stage in Python: the reference of storage/batch_pull.c.

A consumer group's take (`take_rows`), the commit-log stretches to read for it (`read_plan`), the
msgpack answer (`encode_pull`), the keys of released records (`record_keys`) and an ack's receipts
(`parse_receipts`, `parse_receipts_raw`).
storage/batch.py says how a reference and the compiled core relate; `batch.ops` is the one in use.

PullRow (PROW = 56 bytes): a message a pull hands out (take_rows → encode_pull).

    offset size  field        type  meaning
    ------ ----  -----------  ----  ---------------------------------------------------
       0    40   unit               the ready-queue unit (storage/readyqueue.py UNIT)
      40     8   index        u64   the unit's index in its topic's ready queue
      48     4   attempt      u32   the delivery attempt this lease is
      52     4   token        u32   the lease token's number in the answer's token list
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
from delayd.storage.batch_common import SCAN_CORRUPT, SCAN_OK, read_record, require, utf8_or_none
from delayd.storage.commitlog import HEADER as RECORD
from delayd.storage.commitlog import I64_MAX
from delayd.storage.readyqueue import UNIT as READY

PULL = struct.Struct("<qIIqqQQII")  # the 40-byte ready unit, then index, attempt, token
PROW = PULL.size
assert PROW == 56
MAX_HEADERS_ON_FILE = 64


PULL_FIELDS = ("id", "receipt", "topic", "key", "tag", "headers", "body", "deliver_at", "delivered_at", "attempt")
ALL_PULL_FIELDS = (1 << len(PULL_FIELDS)) - 1


def encode_pull(rows: bytes, prefix: bytes, tokens: list[str], reads: list[tuple[int, bytes]],
                fields: int = ALL_PULL_FIELDS) -> tuple[bytes, list[tuple[int, int]]]:
    """The msgpack answer of a pull, ``{"messages": [...]}``, from PullRows (a 40-byte ready unit,
    then its index u64, attempt u32 and the number of its lease token in `tokens` u32) and their
    records in `reads` ((commit-log offset, bytes) sorted by offset): per message the API's
    object — id (prefix + seq in hex), receipt (id.index-hex.token), topic, key, tag, headers,
    body, deliver_at (the record's), delivered_at (the unit's release time), attempt; of those
    only the ones whose bit (k for PULL_FIELDS[k]) is set in `fields`. A record not in `reads`, or
    one that does not check out (CRC, version, UTF-8 of topic/tag/key, headers that are not
    exactly msgpack.packb of a str→str dict of at most 64 entries) is left out and named in
    `problems` as (row index, outcome): 0 not read, SCAN_TORN, SCAN_CORRUPT, SCAN_VERSION,
    whichever fields are asked for."""
    if not isinstance(fields, int):
        raise TypeError("fields must be int")
    require(0 <= fields <= ALL_PULL_FIELDS, "fields")
    require(len(rows) % PROW == 0, "rows")
    kept = [name for k, name in enumerate(PULL_FIELDS) if fields >> k & 1]
    starts = [s for s, _ in reads]
    out: list[dict[str, Any]] = []
    problems = []
    for i in range(len(rows) // PROW):
        off, size, _tgh, _d, released_at, seq, index, attempt, token = PULL.unpack_from(rows, i * PROW)
        if token >= len(tokens):
            raise IndexError("token")
        found = read_record(reads, starts, off, size)
        if found is None:
            problems.append((i, 0))
            continue
        c, _length, buf, at = found
        if c != SCAN_OK:
            problems.append((i, c))
            continue
        (_l, _c, _v, _t, _f, _seq, deliver_at, _pa, _r, tl, gl, kl, hl, bl) = RECORD.unpack_from(buf, at)
        p = at + RECORD.size
        raw = bytes(buf[p:p + tl + gl + kl + hl + bl])
        try:
            topic = raw[:tl].decode()
            tag = raw[tl:tl + gl].decode() or None
            key = raw[tl + gl:tl + gl + kl].decode() or None
        except UnicodeDecodeError:
            problems.append((i, SCAN_CORRUPT))
            continue
        hraw = raw[tl + gl + kl:tl + gl + kl + hl]
        headers: dict[str, str] = {}
        if hl:
            try:
                headers = msgpack.unpackb(hraw)
            except (ValueError, TypeError, msgpack.UnpackException):
                headers = None  # type: ignore[assignment]
            if not isinstance(headers, dict) or len(headers) > MAX_HEADERS_ON_FILE or msgpack.packb(headers) != hraw \
                    or not all(type(k) is str and type(v) is str for k, v in headers.items()):
                problems.append((i, SCAN_CORRUPT))
                continue
        mid = prefix.decode() + format(seq, "x")
        msg = {"id": mid, "receipt": f"{mid}.{index:x}.{tokens[token]}", "topic": topic, "key": key,
               "tag": tag, "headers": headers, "body": raw[tl + gl + kl + hl:], "deliver_at": deliver_at,
               "delivered_at": released_at, "attempt": attempt}
        out.append({name: msg[name] for name in kept})
    return msgpack.packb({"messages": out}, use_bin_type=True), problems


def record_keys(locs: bytes, reads: list[tuple[int, bytes]], stride: int = 12) -> tuple[list[str | None], bytes,
                                                                                    list[tuple[int, int]]]:
    """The key and the seq of the record located at the start of each row of `locs` ((offset
    i64, size u32), rows of `stride` bytes: what release_rows gives for keyed messages, or ready
    units), from `reads` ((commit-log offset, bytes) sorted by offset): (keys, seqs, problems),
    a key per row (None: the record has none, or is a problem), the record's seq per row (u64;
    0 for a problem), and the rows whose record is not in `reads` whole or does not check out
    (CRC, version, UTF-8 of topic, tag and key) as (row index, outcome) — 0 not read, SCAN_TORN,
    SCAN_CORRUPT, SCAN_VERSION — for the caller to read again through the commit log, as with
    encode_pull. What dequeue-put marks delivered in the key index, without a Record a message
    (the compiled one gives the keys packed, storage/batch_keyseq.c)."""
    if not isinstance(stride, int):
        raise TypeError("stride must be int")
    if not isinstance(reads, list) or not all(isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], int)
                                              for r in reads):
        raise TypeError("reads: expected a list of (offset, buffer)")
    require(stride >= 12 and len(locs) % stride == 0, "locs/stride")
    starts = [s for s, _ in reads]
    keys: list[str | None] = []
    seqs: list[int] = []
    problems: list[tuple[int, int]] = []
    for i, (off, size) in enumerate(struct.Struct(f"<qI{stride - 12}x").iter_unpack(locs)):
        found = read_record(reads, starts, off, size)
        key, seq = None, 0
        if found is None or found[0] != SCAN_OK:
            problems.append((i, 0 if found is None else found[0]))
        else:
            _c, _length, buf, at = found
            (_l, _c2, _v, _t, _f, rseq, _d, _pa, _r, tl, gl, kl, _hl, _bl) = RECORD.unpack_from(buf, at)
            raw = bytes(buf[at + RECORD.size:at + RECORD.size + tl + gl + kl])
            try:
                raw[:tl].decode()
                raw[tl:tl + gl].decode()
                key, seq = raw[tl + gl:].decode() or None, rseq
            except UnicodeDecodeError:
                problems.append((i, SCAN_CORRUPT))
        keys.append(key)
        seqs.append(seq)
    return keys, struct.pack(f"<{len(seqs)}Q", *seqs), problems


def read_plan(rows: bytes, stride: int, bases: bytes, span: int, gap: int) -> bytes:
    """The stretches of the commit log to read for the records located at the start of each row
    ((offset i64, size u32), rows of `stride` bytes): (start, end) i64 pairs in offset order.
    Records at most `gap` apart share a stretch of at most `span` bytes, and no stretch runs past
    the first segment base (`bases`: ascending i64) after its start."""
    require(stride >= 12 and span >= 0 and gap >= 0, "stride/span/gap")
    require(len(rows) % stride == 0 and len(bases) % 8 == 0, "rows/bases")
    bs = list(struct.unpack(f"<{len(bases) // 8}q", bases))
    require(bs == sorted(bs), "bases must ascend")
    loc = struct.Struct(f"<qI{stride - 12}x")
    locs = sorted((off, min(off + size, I64_MAX)) for off, size in loc.iter_unpack(rows))
    out = []
    i = seg = 0
    while i < len(locs):
        start, end = locs[i]
        while seg < len(bs) and bs[seg] <= start:
            seg += 1
        limit = bs[seg] if seg < len(bs) else I64_MAX
        k = i + 1
        while k < len(locs) and locs[k][1] <= limit and locs[k][1] - start <= span and locs[k][0] - end <= gap:
            end = max(end, locs[k][1])
            k += 1
        out.append(struct.pack("<qq", start, end))
        i = k
    return b"".join(out)


def parse_receipts(receipts: list[Any]) -> tuple[bytes, bytes, list[str]]:
    """(indexes u64, token ids u32, distinct tokens) of receipts `{id}.{index hex}.{token}`. A
    receipt not in canonical form (lowercase hex without sign or leading zeros, up to 16 digits)
    gets token id 0xFFFFFFFF: the caller's reference parser decides it."""
    idx: list[int] = []
    tid: list[int] = []
    tokens: list[str] = []
    seen: dict[str, int] = {}
    for r in receipts:
        parts = r.rsplit(".", 2) if type(r) is str else []
        h = parts[1] if len(parts) == 3 else ""
        if not (1 <= len(h) <= 16 and all(ch in "0123456789abcdef" for ch in h) and (len(h) == 1 or h[0] != "0")) \
                or utf8_or_none(r) is None:
            idx.append(0)
            tid.append(0xFFFFFFFF)
            continue
        k = seen.get(parts[2])
        if k is None:
            k = seen[parts[2]] = len(tokens)
            tokens.append(parts[2])
        idx.append(int(h, 16))
        tid.append(k)
    return struct.pack(f"<{len(idx)}Q", *idx), struct.pack(f"<{len(tid)}I", *tid), tokens


def parse_receipts_raw(body: bytes | bytearray, max_n: int) -> tuple[bytes, bytes, list[str]] | None:
    """parse_receipts of an ack's msgpack body as it arrived: a map of one entry, the str
    "receipts", to an array of at most `max_n` str (UTF-8), nothing after it; None for any other
    body (the caller decodes it and answers what is wrong with it)."""
    u = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(body), 1))
    u.feed(body)
    try:
        if u.read_map_header() != 1 or u.unpack() != "receipts":
            return None
        count = u.read_array_header()
        if count > max_n:
            return None
        receipts = [u.unpack() for _ in range(count)]
    except (msgpack.UnpackException, ValueError, TypeError):
        return None
    if any(type(r) is not str for r in receipts) or u.tell() != len(body):
        return None
    return parse_receipts(receipts)


def take_rows(units: bytes, first_index: int, exclude: bytes, wanted: bytes | None, max_n: int, attempt: int,
              token: int) -> tuple[bytes, int, bytes]:
    """A consumer group handing out new messages from its cursor (Groups.take): the ready units
    (40 bytes each) at indexes first_index.., skipping those in `exclude` (sorted u64 indexes,
    acked or leased already) and, when `wanted` (u32 tag hashes) is given, those whose tag is not
    wanted — their indexes come back in `skipped` (they count as consumed by the group); at most
    max_n PullRows with `attempt` and `token`. Returns (rows, units examined, skipped)."""
    require(len(units) % READY.size == 0 and len(exclude) % 8 == 0 and (wanted is None or len(wanted) % 4 == 0),
          "units, exclude or wanted have the wrong size")
    ex = [x for (x,) in struct.iter_unpack("<Q", exclude)]
    require(ex == sorted(ex), "exclude must be sorted")
    exs = set(ex)
    want = None if wanted is None else {x for (x,) in struct.iter_unpack("<I", wanted)}
    rows: list[bytes] = []
    skipped: list[bytes] = []
    i, n = 0, len(units) // READY.size
    while i < n and len(rows) < max_n:
        index = first_index + i
        u = units[i * READY.size:(i + 1) * READY.size]
        i += 1
        if index in exs:
            continue
        if want is not None and READY.unpack(u)[2] not in want:
            skipped.append(struct.pack("<Q", index))
            continue
        rows.append(u + struct.pack("<QII", index, attempt, token))
    return b"".join(rows), i, b"".join(skipped)
