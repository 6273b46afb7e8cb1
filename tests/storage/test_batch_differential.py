"""The compiled batch core against its Python reference (storage/batch.py, storage/batch_pull.py), byte for byte.

Every function of `delayd.storage._batch` gets the same inputs as its reference in
`delayd.storage.batch` — valid batches, and damaged ones (flipped bytes, cut buffers, garbage) —
and must return the same bytes, leave the same state behind (wheel, counts, message-table spans)
and fail the same way. `make asan` runs this file against a build with AddressSanitizer.
"""

from __future__ import annotations

import copy
import random
import struct
import zlib
from typing import Any

import msgpack
import pytest
from delayd.broker import codec, errors
from delayd.broker.config import Config
from delayd.storage import batch as ref
from delayd.storage import batch_common, commitlog
from delayd.storage import batch_pull as pull_ref
from delayd.storage.commitlog import (
    Record,
    RecordFlag,
    RecordType,
    decode,
    encode,
    encode_messages,
    release_body,
)
from delayd.storage.msgtable import ENTRY
from delayd.storage.readyqueue import UNIT as READY
from delayd.storage.timerlog import UNIT, UNIT_SIZE, UnitMagic
from delayd.storage.timerwheel import HEADER as WHEEL_HEADER
from delayd.storage.timerwheel import SLOT
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

c = pytest.importorskip("delayd.storage._batch", reason="the compiled batch core is built by pip install")
if c is ref:  # pragma: no cover
    pytest.skip("DELAYD_PURE=1: nothing to compare", allow_module_level=True)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMITS = (1 << 20, 3650 * 86_400_000, 128, 255, 256, 64, 8192)
NOW = 1_800_000_000_000


def same(f_c: Any, f_ref: Any, *args: Any) -> Any:
    """Both raise the same exception type, or both return equal results; the result."""
    try:
        want = f_ref(*args)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        with pytest.raises(type(e)):
            f_c(*args)
        return None
    got = f_c(*args)
    assert got == want
    return got


class Span:
    """What MessageTable.begin_batch hands the batch functions (storage.msgtable._Span)."""

    def __init__(self, base: int, buf: bytearray, valid: int) -> None:
        self.base, self.buf, self.valid = base, buf, valid
        self.lo, self.hi = len(buf), 0

    def state(self) -> tuple[int, bytes, int, int, int]:
        return self.base, bytes(self.buf), self.valid, self.lo, self.hi


def span_states(spans: list[Span]) -> list[tuple[int, bytes, int, int, int]]:
    return [s.state() for s in spans]


# ---------------------------------------------------------------------------------- crc32
@SETTINGS
@given(st.binary(max_size=300) | st.integers(0, 5000).map(lambda n: random.Random(n).randbytes(n)),
       st.integers(0, 2**32 - 1), st.booleans())
def test_crc32(data: bytes, value: int, fold: bool) -> None:
    """Both ways the compiled CRC goes: slicing by 8 alone, and (where the CPU has PCLMULQDQ)
    the blocks of 64 bytes or more folded by carry-less multiplies."""
    was = c.crc_folds()
    try:
        c.crc_folds(fold and was)
        assert c.crc32(data, value) == ref.crc32(data, value) == zlib.crc32(data, value)
    finally:
        c.crc_folds(was)


# ---------------------------------------------------------------------------------- produce
texts = st.text(max_size=40) | st.text(st.characters(codec="utf-8"), min_size=100, max_size=300) | \
    st.sampled_from(["", "\ud800", "é" * 128, "€" * 85, "€" * 86, "x" * 128, "x" * 129, "k" * 256, "k" * 257,
                     "é" * 128 + "x"])
ints = st.integers(-5, 5) | st.integers(0, 4_000 * 86_400_000) | st.sampled_from(
    [True, False, 2**63, -(2**63) - 1, NOW, NOW + 3650 * 86_400_000, NOW + 3650 * 86_400_000 + 1, 1.5])
headers = st.dictionaries(texts, texts, max_size=5) | st.sampled_from(
    [{}, {str(i): "v" for i in range(64)}, {str(i): "v" for i in range(65)}, {"k": "v" * 8191},
     {"k": "v" * 8192}, {"k": 1}, {1: "v"}, {"é" * 40: "€" * 2700}])
values = st.one_of(st.none(), texts, st.binary(max_size=40), ints, headers, st.lists(st.integers(), max_size=2))


@st.composite
def valid_message(draw: Any) -> dict[str, Any]:
    """A message object the API accepts (most of a real batch)."""
    m: dict[str, Any] = {"body": draw(st.binary(max_size=64) | st.text(max_size=20))}
    when = draw(st.sampled_from(["delay_ms", "deliver_at", None]))
    if when == "delay_ms":
        m["delay_ms"] = draw(st.integers(0, 3650 * 86_400_000))
    elif when == "deliver_at":
        m["deliver_at"] = draw(st.integers(0, NOW + 3650 * 86_400_000))
    if draw(st.booleans()):
        m["key"] = draw(st.text(min_size=1, max_size=20) | st.sampled_from(["k" * 256, "é" * 128]))
    if draw(st.booleans()):
        m["tag"] = draw(st.text(max_size=10) | st.sampled_from(["", "x" * 128, "€" * 85]))
    if draw(st.booleans()):
        m["headers"] = draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4) |
                            st.sampled_from([{str(i): "v" for i in range(64)}, {"k": "v" * 8191}]))
    if draw(st.booleans()):
        m["replace"] = draw(st.booleans())
    return m


@st.composite
def noisy_message(draw: Any) -> Any:
    """Anything: invalid fields, wrong types, limits and one past them, not an object at all."""
    if draw(st.integers(0, 30)) == 0:
        return draw(values)
    m: dict[Any, Any] = {}
    body = draw(st.sampled_from(["body", "body", "body", "body_b64", "none", "both"]))
    if body in ("body", "both"):
        m["body"] = draw(st.binary(max_size=64) | texts | st.sampled_from([b"x" * (1 << 20), b"x" * ((1 << 20) + 1), 5]))
    if body in ("body_b64", "both"):
        m["body_b64"] = draw(st.sampled_from(["aGk=", "!!", ""]))
    for name in ("delay_ms", "deliver_at"):
        if draw(st.integers(0, 3)) == 0:
            m[name] = draw(ints | st.sampled_from(["2027-01-01T08:00:00Z"]))
    for name, strat in (("key", texts | values), ("tag", texts | values), ("headers", headers | values),
                        ("replace", st.booleans() | values)):
        if draw(st.integers(0, 2)) == 0:
            m[name] = draw(strat)
    if draw(st.integers(0, 25)) == 0:
        m[draw(st.sampled_from(["extra", b"body", 7]))] = 1
    return m


def message() -> st.SearchStrategy[Any]:
    return st.one_of(valid_message(), valid_message(), valid_message(), noisy_message())


@SETTINGS
@given(st.lists(message(), min_size=1, max_size=6), st.integers(1, 2**40), st.sampled_from([b"orders", b"t" * 128]),
       st.data())
def test_encode_produce(items: list[Any], first_seq: int, topic: bytes, data: Any) -> None:
    select = data.draw(st.none() | st.lists(st.integers(0, len(items) - 1), max_size=len(items), unique=True).map(
        lambda ix: struct.pack(f"<{len(ix)}I", *ix)))
    got = same(c.encode_produce, ref.encode_produce, items, topic, NOW, first_seq, LIMITS, select)
    # Against the API's own parser and the commit log's encoder, the reference that existed first:
    # the fast path decides only what they accept, and encodes exactly what they would.
    cfg = Config()
    try:
        parsed = codec.parse_produce(topic.decode(), {"messages": items}, cfg, NOW)
    except errors.ApiError:
        assert got is None
        return
    if got is None:
        return  # a form only the reference parser handles (body_b64, ...)
    records, sizes, dues, keys, replace = got
    order = range(len(items)) if select is None else struct.unpack(f"<{len(select) // 4}I", select)
    want = encode_messages([parsed.messages[i] for i in order], first_seq, NOW)
    assert records == b"".join(want)
    assert sizes == struct.pack(f"<{len(want)}I", *map(len, want))
    assert dues == struct.pack(f"<{len(items)}q", *(m.deliver_at for m in parsed.messages))
    assert keys == (parsed.keys if any(k is not None for k in parsed.keys) else None)
    assert replace == (parsed.replace if any(parsed.replace) else None)


@SETTINGS
@given(st.lists(message(), min_size=1, max_size=5), st.sampled_from(["packed", "cut", "flip", "extra", "dup"]),
       st.integers(0, 10**6), st.integers(4, 400), st.data())
def test_encode_produce_raw(items: list[Any], damage: str, where: int, max_elements: int, data: Any) -> None:
    """The compiled reader of a msgpack body decides nothing the reference leaves undecided, and
    where it decides it gives the reference's bytes; on damaged bodies too."""
    try:
        raw = msgpack.packb({"messages": items}, use_bin_type=True)
    except (OverflowError, UnicodeEncodeError):  # a 65-bit integer, a lone surrogate: unsendable
        assume(False)
    if damage == "cut":
        raw = raw[:where % len(raw)]
    elif damage == "flip":
        i = where % len(raw)
        raw = raw[:i] + bytes([raw[i] ^ (1 + where % 255)]) + raw[i + 1:]
    elif damage == "extra":
        raw += b"\xc0"
    elif damage == "dup":  # the same batch under "messages" twice: the reference keeps the last
        raw = b"\x82" + raw[1:] + raw[1:]
    select = data.draw(st.none() | st.lists(st.integers(0, len(items) - 1), max_size=len(items), unique=True).map(
        lambda ix: struct.pack(f"<{len(ix)}I", *ix)))
    for budget in (max_elements, 10**6):
        args = (raw, b"orders", NOW, 9, LIMITS, 1000, budget, select)
        want = ref.encode_produce_raw(*args)
        got = c.encode_produce_raw(*args)
        assert got is None or got == want
        if damage == "packed":  # (damage can make a repeated name, which only the reference decides)
            assert (got is None) == (want is None), "bodies as clients write them are decided by both"


@SETTINGS
@given(st.lists(valid_message(), min_size=1, max_size=8))
def test_encode_produce_raw_decides_what_clients_send(items: list[dict[str, Any]]) -> None:
    """Bodies as the SDK (msgpack.packb) writes them: decided by the compiled reader, equal to the
    reference and to encode_produce of the decoded items."""
    raw = msgpack.packb({"messages": items}, use_bin_type=True)
    want = ref.encode_produce(items, b"orders", NOW, 3, LIMITS, None)
    assert c.encode_produce_raw(raw, b"orders", NOW, 3, LIMITS, 1000, 10**6, None) == want
    assert ref.encode_produce_raw(raw, b"orders", NOW, 3, LIMITS, 1000, 10**6, None) == want


@SETTINGS
@given(st.integers(0, 20), st.sampled_from([b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xff", b"\xc3",
                                            b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]),
       st.integers(0, 20))
def test_a_str_is_checked_as_utf8_at_any_offset(before: int, middle: bytes, after: int) -> None:
    """A key's bytes are UTF-8 checked eight ASCII bytes at a time, then byte by byte: a sequence
    (valid, cut short, overlong, a surrogate, past U+10FFFF) is judged the same wherever it falls
    against those eight-byte steps, as bytes.decode judges it."""
    text = b"k" * before + middle + b"y" * after
    raw = b"\x81\xa8messages\x91\x82\xa4body\xc4\x01x\xa3key\xd9" + bytes([len(text)]) + text
    got = c.encode_produce_raw(raw, b"orders", NOW, 3, LIMITS, 1000, 10**6, None)
    try:
        key = text.decode("utf-8")
    except UnicodeDecodeError:
        assert got is None  # (the reference path then answers it: 400)
    else:
        assert got is not None and got[3] == [key]
        assert got == ref.encode_produce_raw(raw, b"orders", NOW, 3, LIMITS, 1000, 10**6, None)


def test_encode_produce_raw_takes_any_msgpack_width() -> None:
    """msgpack allows wider encodings than the shortest (str8 for a short name, uint64 for a small
    number, map16 for a small map); what they mean is decided the same, and headers are stored in
    the shortest form either way."""
    short = msgpack.packb({"messages": [{"body": b"x", "delay_ms": 5, "headers": {"a": "b"}, "tag": "t"}]})
    wide = (b"\xde\x00\x01\xd9\x08messages\xdc\x00\x01\xde\x00\x04"
            b"\xd9\x04body\xc5\x00\x01x" b"\xda\x00\x08delay_ms\xcf" + struct.pack(">Q", 5) +
            b"\xd9\x07headers\xde\x00\x01\xd9\x01a\xdb\x00\x00\x00\x01b" b"\xa3tag\xd9\x01t")
    assert msgpack.unpackb(wide) == msgpack.unpackb(short)
    for impl in (c, ref):
        assert impl.encode_produce_raw(wide, b"o", NOW, 1, LIMITS, 10, 100, None) == \
            impl.encode_produce_raw(short, b"o", NOW, 1, LIMITS, 10, 100, None) is not None


def test_encode_produce_decides_the_common_forms() -> None:
    """The fast path is not vacuous: plain, keyed, tagged and header-carrying messages are its."""
    items = [{"body": b"x", "delay_ms": 5}, {"body": "text", "deliver_at": NOW + 1, "key": "k", "tag": "t"},
             {"body": b"", "headers": {"a": "b"}, "replace": True}]
    for impl in (c, ref):
        got = impl.encode_produce(items, b"orders", NOW, 1, LIMITS, None)
        assert got is not None and got[3] == [None, "k", None] and got[4] == [False, False, True]


def encoded_records(draw: Any, n: int, first_seq: int = 1) -> list[bytes]:
    items = [{"body": draw(st.binary(max_size=30)), "delay_ms": draw(st.integers(0, 10**6)),
              **({"key": draw(st.text(min_size=1, max_size=5))} if draw(st.booleans()) else {}),
              **({"tag": draw(st.text(max_size=5))} if draw(st.booleans()) else {})} for _ in range(n)]
    recs, sizes, *_ = ref.encode_produce(items, b"topic", NOW, first_seq, LIMITS, None)
    out, p = [], 0
    for (size,) in struct.iter_unpack("<I", sizes):
        out.append(recs[p:p + size])
        p += size
    # RELEASE records (storage/commitlog.py) among them: the scans take every record type.
    for _ in range(draw(st.integers(0, 2))):
        units = b"".join(READY.pack(draw(st.integers(0, 2**40)), 60, 0, NOW, NOW + 1, draw(st.integers(1, 99)))
                         for _ in range(draw(st.integers(0, 3))))
        rel = encode(Record(RecordType.RELEASE, 0, "topic", release_body(draw(st.integers(0, 99)), units),
                            produced_at=NOW))
        out.insert(draw(st.integers(0, len(out))), rel)
    return out


@SETTINGS
@given(st.data())
def test_produced_rows(data: Any) -> None:
    recs = encoded_records(data.draw, data.draw(st.integers(0, 5)))
    offsets, off = [], data.draw(st.integers(0, 2**40))
    for r in recs:
        offsets.append(off)
        off += len(r) + data.draw(st.integers(0, 100))
    buf = b"".join(recs)
    cut = data.draw(st.integers(0, len(buf)))
    extra = data.draw(st.integers(0, 1))
    offs = struct.pack(f"<{len(offsets) + extra}q", *offsets, *([0] * extra))
    same(c.produced_rows, ref.produced_rows, buf[:cut] if data.draw(st.booleans()) else buf, offs, 12345)


@SETTINGS
@given(st.lists(st.integers(0, 2**32 - 1), max_size=20) | st.lists(st.integers(0, 300), max_size=20),
       st.integers(-(2**64), 2**64) | st.integers(0, 2**40) | st.integers(2**63 - 2**36, 2**63 - 1),
       st.sampled_from(["whole", "cut", "bytearray", "list", "float start"]))
@example([5, 6], 2**63 - 12, "whole")  # the last record ends at the i64's end
@example([5, 6], 2**63 - 10, "whole")  # ... and past it: out of range, though every offset fits
@example([2**32 - 1] * 3, -1, "whole")
def test_record_offsets(sizes: list[int], start: Any, form: str) -> None:
    """The offsets of records written back to back (storage/commitlog.py record_offsets, the
    reference): any u32 sizes, starts out of range, damaged arguments."""
    raw: Any = struct.pack(f"<{len(sizes)}I", *sizes)
    raw = {"whole": raw, "cut": raw[:-1], "bytearray": bytearray(raw), "list": sizes, "float start": raw}[form]
    start = float(start) if form == "float start" else start
    got = same(c.record_offsets, commitlog.record_offsets, raw, start)
    if form == "whole" and got is not None:
        assert list(struct.unpack(f"<{len(sizes)}q", got)) == [start + sum(sizes[:i]) for i in range(len(sizes))]


# ---------------------------------------------------------------------------------- scan
@st.composite
def log_buffer(draw: Any) -> bytes:
    recs = encoded_records(draw, draw(st.integers(0, 6)))
    buf = bytearray(b"".join(recs))
    for _ in range(draw(st.integers(0, 3))):
        if buf:
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        buf = buf[:draw(st.integers(0, len(buf)))]
    if draw(st.integers(0, 5)) == 0:
        buf += draw(st.binary(max_size=80))
    return bytes(buf)


@SETTINGS
@given(log_buffer(), st.integers(0, 2**40), st.booleans(), st.integers(0, 8))
def test_scan_rows(buf: bytes, base: int, verify: bool, max_records: int) -> None:
    same(c.scan_rows, ref.scan_rows, buf, base, verify, max_records)


def test_scan_rows_stops_at_a_newer_version_not_as_damage() -> None:
    recs, *_ = ref.encode_produce([{"body": b"a"}, {"body": b"b"}], b"t", NOW, 1, LIMITS, None)
    rec = bytearray(recs)
    first = struct.unpack_from("<I", rec)[0]
    rec[first + 8] = 2  # the second record: version 2 ...
    struct.pack_into("<I", rec, first + 4, zlib.crc32(rec[first + 8:]))  # ... with a correct CRC
    for impl in (c, ref):
        rows, consumed, outcome = impl.scan_rows(bytes(rec), 0, True, 10)
        assert (len(rows) // ref.MROW, consumed, outcome) == (1, first, batch_common.SCAN_VERSION)


# ---------------------------------------------------------------------------------- enqueue-put
PRECISION, NSLOTS = 1000, 64
HDR = WHEEL_HEADER.size


@st.composite
def index_case(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(0, 12))
    base_seq = draw(st.integers(0, 50))
    load_time = draw(st.integers(0, 40)) * PRECISION
    window_end = load_time + draw(st.sampled_from([80_000] * 4 + [30_000] * 2) | st.integers(-1000, 80_000))
    rows, entries = [], bytearray(ENTRY.size * (n + 4))
    for i in range(n):
        seq = base_seq + i
        off = draw(st.integers(0, 10_000))
        # In the window, or far: just past it (either roll slot), or well beyond
        deliver_at = draw(st.integers(-3000, 70_000).map(lambda d: load_time + d)
                          | st.integers(1, 20_000).map(lambda d: window_end + d)
                          | st.integers(70_000, 300_000).map(lambda d: load_time + d))
        rtype = draw(st.sampled_from([1] * 10 + [3] * 3 + [2, 4, 5, 9]))  # 3: a roll copy
        state = draw(st.sampled_from([1] * 12 + [0, 2, 3]))
        eoff = off if draw(st.integers(0, 12 if rtype == 1 else 2)) else off + 1
        ENTRY.pack_into(entries, i * ENTRY.size, state, draw(st.integers(0, 3)), draw(st.integers(0, 2)), 77, eoff)
        rows.append(ref.MROW_FMT.pack(seq, deliver_at, off, 77 + rtype, 0xABCD, draw(st.integers(0, 9)),
                                      draw(st.integers(0, 2)), rtype, draw(st.integers(0, 1))))
    wheel = bytearray(HDR + NSLOTS * SLOT.size)
    for _ in range(draw(st.integers(0, 6))):
        k = draw(st.integers(0, NSLOTS - 1))
        t = draw(st.sampled_from([k * PRECISION, (k + NSLOTS) * PRECISION, 5]))
        SLOT.pack_into(wheel, HDR + k * SLOT.size, t, draw(st.integers(0, 500)) * UNIT_SIZE,
                       draw(st.integers(0, 500)) * UNIT_SIZE, draw(st.integers(-1, 5)), draw(st.integers(0, 7)))
    spans_cut = draw(st.sampled_from([n + 4] * 6 + list(range(n + 4))))
    valid = spans_cut * ENTRY.size if draw(st.integers(0, 5)) else draw(st.integers(0, spans_cut * ENTRY.size))
    return {
        "rows": b"".join(rows), "start": draw(st.sampled_from([0, 0, 0]) | st.integers(0, n)),
        "spans": [Span(base_seq, entries[:spans_cut * ENTRY.size], valid)],
        "wheel": wheel, "counts": bytearray(4 * NSLOTS), "load_time": load_time,
        "window_end": window_end,
        "unsafe_from": load_time + draw(st.sampled_from([NSLOTS * PRECISION] * 4) | st.integers(0, NSLOTS * PRECISION)),
        "tlog_pos": draw(st.integers(0, 1000)) * UNIT_SIZE, "now": load_time + draw(st.integers(-500, 500)),
        "max_units": draw(st.sampled_from([14] * 4) | st.integers(0, 14)),
    }


@SETTINGS
@given(index_case())
def test_index_rows(case: dict[str, Any]) -> None:
    results = []
    for impl in (c, ref):
        k = copy.deepcopy(case)
        out = impl.index_rows(k["rows"], k["start"], k["spans"], k["wheel"], HDR, PRECISION, NSLOTS,
                              k["load_time"], k["window_end"], k["unsafe_from"], k["tlog_pos"], k["now"],
                              k["max_units"])
        impl.put_slots(k["wheel"], HDR, PRECISION, NSLOTS, out[2])
        impl.add_counts(k["counts"], out[4])
        results.append((out, bytes(k["wheel"]), bytes(k["counts"]), span_states(k["spans"])))
    assert results[0] == results[1]


def test_index_rows_parks_far_messages_in_roll_units() -> None:
    """Due beyond the window: a ROLL unit at base + window / 2 (due within a third of a window
    after its end) or base + window, flag FAR, a FarRow; none when there is no window."""
    load_time, now = 10 * PRECISION, 10 * PRECISION + 300
    window_end = now + 30_000  # base = now, window 30 s
    dues = [window_end + 9_999, window_end + 10_000, window_end + 200_000]
    rows = b"".join(ref.MROW_FMT.pack(7 + i, due, 100 * i, 77, 0xABCD, 0, 0, 1, 0) for i, due in enumerate(dues))
    entries = bytearray(ENTRY.size * 3)
    for i in range(3):
        ENTRY.pack_into(entries, i * ENTRY.size, 1, 0, 0, 77, 100 * i)
    for impl in (c, ref):
        spans = [Span(7, bytearray(entries), len(entries))]
        wheel = bytearray(HDR + NSLOTS * SLOT.size)
        consumed, units, slots, late, counts, far, near = impl.index_rows(
            rows, 0, spans, wheel, HDR, PRECISION, NSLOTS, load_time, window_end, load_time + NSLOTS * PRECISION,
            0, now, 10)
        got = [UNIT.unpack_from(units, k * UNIT_SIZE) for k in range(3)]
        assert consumed == 3 and not late and not counts and not near
        assert [(u[2], u[3] + u[4]) for u in got] == [(int(UnitMagic.ROLL), now + 15_000),
                                                      (int(UnitMagic.ROLL), now + 30_000),
                                                      (int(UnitMagic.ROLL), now + 30_000)]
        assert [ref.FAR.unpack_from(far, k * ref.FAR_ROW) for k in range(3)] == [
            (due, 7 + i, 0xABCD) for i, due in enumerate(dues)]
        assert [spans[0].buf[k * ENTRY.size + 1] for k in range(3)] == [ref.FLAG_FAR] * 3
        # Without a window (window_end at or before max(now, load_time)) the reference path decides.
        assert impl.index_rows(rows, 0, [Span(7, bytearray(entries), len(entries))], bytearray(wheel), HDR,
                               PRECISION, NSLOTS, load_time, now, load_time + NSLOTS * PRECISION, 0, now, 10)[0] == 0


def test_index_rows_takes_roll_copies() -> None:
    """A roll copy moves its message's entry to itself (unless the table's is newer) and gets a
    unit: still far, a ROLL unit and flag FAR but no FarRow (it is in the far index); inside the
    window, a DEFAULT unit counted in its slot and a FarRow in `near`. A copy of a message no
    longer scheduled, or older than the table's, is consumed with nothing done."""
    load_time = now = 10 * PRECISION
    window_end = now + 30_000
    # (deliver_at, copy's roll_count, entry: state, roll_count, offset)
    cases = [(window_end + 100_000, 2, (1, 1, 7)), (now + 5_000, 3, (1, 2, 7)), (now + 5_000, 1, (1, 2, 7)),
             (now + 5_000, 5, (3, 4, 7)), (now + 6_000, 4, (1, 4, 400))]
    rows = b"".join(ref.MROW_FMT.pack(20 + i, due, 100 * (i + 1), 90, 0xABCD, 0, roll, int(RecordType.ROLL), 0)
                    for i, (due, roll, _e) in enumerate(cases))
    for impl in (c, ref):
        entries = bytearray(ENTRY.size * len(cases))
        for i, (_d, _r, (state, roll, off)) in enumerate(cases):
            ENTRY.pack_into(entries, i * ENTRY.size, state, 0, roll, 77, off)
        spans = [Span(20, entries, len(entries))]
        consumed, units, _slots, late, counts, far, near = impl.index_rows(
            rows, 0, spans, bytearray(HDR + NSLOTS * SLOT.size), HDR, PRECISION, NSLOTS, load_time, window_end,
            load_time + NSLOTS * PRECISION, 0, now, 10)
        assert consumed == len(cases) and not late and not far
        got = [UNIT.unpack_from(units, k * UNIT_SIZE) for k in range(len(units) // UNIT_SIZE)]
        assert [(u[2], u[3] + u[4], u[5], u[8]) for u in got] == [
            (int(UnitMagic.ROLL), now + 30_000, 100, 20), (int(UnitMagic.DEFAULT), now + 5_000, 200, 21),
            (int(UnitMagic.DEFAULT), now + 6_000, 500, 24)]
        assert [ref.FAR.unpack_from(near, k * ref.FAR_ROW) for k in range(len(near) // ref.FAR_ROW)] == [
            (now + 5_000, 21, 0xABCD), (now + 6_000, 24, 0xABCD)]
        assert struct.unpack(f"<{len(counts) // 4}I", counts) == ((now + 5_000) // PRECISION % NSLOTS,
                                                                 (now + 6_000) // PRECISION % NSLOTS)
        assert [ENTRY.unpack_from(entries, i * ENTRY.size) for i in range(len(cases))] == [
            (1, ref.FLAG_FAR, 2, 90, 100), (1, ref.FLAG_SLOT, 3, 90, 200), (1, 0, 2, 77, 7), (3, 0, 4, 77, 7),
            (1, ref.FLAG_SLOT, 4, 90, 500)]


def test_index_rows_rejects_wrong_sizes() -> None:
    for impl in (c, ref):
        with pytest.raises((ValueError, struct.error, IndexError)):
            impl.index_rows(b"x" * 39, 0, [], bytearray(HDR + NSLOTS * SLOT.size), HDR, PRECISION, NSLOTS,
                            0, 0, 0, 0, 0, 10)
        with pytest.raises(ValueError):
            impl.add_counts(bytearray(4 * NSLOTS), struct.pack("<I", NSLOTS))


# ---------------------------------------------------------------------------------- dequeue-get
@st.composite
def chain_case(draw: Any) -> tuple[bytes, int, int, list[tuple[int, int]]]:
    """A TimerLog region holding a slot's chain (with DELETE markers and damage) and the windows
    a walker reads it through."""
    slot_time = draw(st.integers(0, 100)) * PRECISION
    n = draw(st.integers(0, 10))
    base = draw(st.integers(0, 20)) * UNIT_SIZE
    units, prev = [], -1
    for i in range(n):
        magic = draw(st.sampled_from([1] * 30 + [2, 2, 4, 4, 4, 0, 9]))
        fire = slot_time + draw(st.integers(0, PRECISION - 1)) if draw(st.integers(0, 40)) else slot_time - 1
        seq = draw(st.integers(1, 6))
        units.append(UNIT.pack(UNIT_SIZE if draw(st.integers(0, 40)) else 51, prev, magic, fire - 7, 7,
                               draw(st.integers(0, 1000)) if draw(st.integers(0, 40)) else -1, 80, 3, seq))
        prev = base + i * UNIT_SIZE
    buf = bytearray(b"".join(units))
    if buf and draw(st.integers(0, 8)) == 0:
        buf[draw(st.integers(0, len(buf) - 1))] ^= 0xFF
    last = prev if draw(st.integers(0, 6)) else draw(st.integers(-1, base + len(buf) + 60))
    windows = []
    for _ in range(draw(st.integers(1, 4))):
        lo = draw(st.integers(0, max(0, len(buf))))
        hi = draw(st.integers(lo, len(buf)))
        windows.append((lo, hi))
    windows.append((0, len(buf)))
    return bytes(buf), base, last, windows


@SETTINGS
@given(chain_case(), st.integers(0, 5))
def test_walker(case: tuple[bytes, int, int, list[tuple[int, int]]], max_units: int) -> None:
    buf, base, last, windows = case
    slot_time = 0
    for u in range(len(buf) // UNIT_SIZE):
        enq, delay = struct.unpack_from("<qi", buf, u * UNIT_SIZE + 16)
        slot_time = (enq + delay) - (enq + delay) % PRECISION
        break
    wc, wr = c.Walker(slot_time, PRECISION, last), ref.Walker(slot_time, PRECISION, last)
    for lo, hi in windows:
        assert wc.feed(buf[lo:hi], base + lo, max_units) == wr.feed(buf[lo:hi], base + lo, max_units)
        assert wc.pos == wr.pos


# ---------------------------------------------------------------------------------- dequeue-get-message
@st.composite
def resolve_case(draw: Any) -> dict[str, Any]:
    recs = encoded_records(draw, draw(st.integers(0, 6)), first_seq=10)
    start = draw(st.integers(0, 1000))
    offsets, buf = [], bytearray()
    for r in recs:
        offsets.append(start + len(buf))
        buf += r
    if buf and draw(st.integers(0, 3)) == 0:
        buf[draw(st.integers(0, len(buf) - 1))] ^= 1 << draw(st.integers(0, 7))
    entries = bytearray(ENTRY.size * 20)
    units = []
    for i, (off, r) in enumerate(zip(offsets, recs, strict=True)):
        seq = 10 + i
        state = draw(st.sampled_from([1, 1, 1, 2, 3, 0]))
        eoff = off if draw(st.integers(0, 5)) else off + 3
        ENTRY.pack_into(entries, (seq - 10) * ENTRY.size, state, 0, 0, len(r), eoff)
        magic = draw(st.sampled_from([1, 1, 1, 2]))
        units.append(struct.pack("<q", i * UNIT_SIZE) + UNIT.pack(UNIT_SIZE, -1, magic, 5, 5, off, len(r), 9, seq))
    reads = []
    if buf:
        cut = draw(st.integers(0, len(buf)))
        reads = [(start, bytes(buf[:cut])), (start + cut, bytes(buf[cut:]))] if draw(st.booleans()) else \
            [(start, bytes(buf))]
        if draw(st.integers(0, 4)) == 0:
            reads = reads[:1]
    return {"units": b"".join(units), "spans": [Span(10, entries, draw(st.integers(0, len(entries))))],
            "reads": reads}


@SETTINGS
@given(resolve_case(), st.integers(0, 10**6))
def test_classify_and_dues(case: dict[str, Any], slot_time: int) -> None:
    kinds, locs = same(c.classify, ref.classify, case["units"], case["spans"])
    same(c.dues, ref.dues, case["units"], kinds, case["reads"], slot_time)
    same(c.roll_copies, ref.roll_copies, case["units"], kinds, case["reads"])


@pytest.mark.parametrize("roll", [0, 7, 0xFFFE, 0xFFFF])
def test_roll_copies_are_the_record_again_as_a_roll(roll: int) -> None:
    """A copy differs from its record in type, flags, roll_count (+1, kept at 65,535) and CRC
    only, decodes as the same message, and one of a damaged or missing record is a problem."""
    rec = Record(RecordType.MESSAGE, 12, "t", b"body", 5000, 4000, roll, "tag", "k", {"h": "v"})
    first = bytearray(encode(rec, flags=int(RecordFlag.CONTINUED)))
    damaged = bytearray(first)
    damaged[-1] ^= 1
    buf = bytes(first + damaged)
    units = b"".join(struct.pack("<q", 0) + UNIT.pack(UNIT_SIZE, -1, 2, 5, 5, off, len(first), 9, 12)
                     for off in (100, 100 + len(first), 100 + 2 * len(first)))
    for impl in (c, ref):
        data, sizes, problems = impl.roll_copies(units, bytes([2, 2, 2]), [(100, buf)])
        assert struct.unpack(f"<{len(sizes) // 4}I", sizes) == (len(first),)
        assert problems == [(1, 2), (2, 0)]  # corrupt; not in the reads
        got = decode(data)
        assert (got.type, got.flags, got.roll_count) == (RecordType.ROLL, 0, min(roll + 1, 0xFFFF))
        assert (got.seq, got.topic, got.body, got.deliver_at, got.produced_at, got.tag, got.key, got.headers) == \
            (12, "t", b"body", 5000, 4000, "tag", "k", {"h": "v"})
        assert data[48:] == first[48:] and data[12:36] == first[12:36] and data[38:48] == first[38:48]


# ---------------------------------------------------------------------------------- dequeue-put
def _dues(max_rows: int, max_off: int) -> st.SearchStrategy[bytes]:
    return st.lists(st.tuples(st.integers(-5, 20), st.integers(0, 8), st.integers(0, max_off)), max_size=max_rows).map(
        lambda xs: b"".join(ref.DUE.pack(t, seq, off, 40, seq % 3, 7, 0, 0) for t, seq, off in xs))


due_rows = _dues(10, 50)
# Pushes of up to 80 rows: the compiled heap keeps one of 32 or more as a sorted run, a smaller
# one in its heap of rows; equal rows (same deliver_at, seq and bytes) come out the same.
heap_rows = _dues(80, 3)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["push", "pop"]), heap_rows, st.integers(-5, 25), st.integers(0, 100)),
                max_size=12))
def test_due_heap(ops: list[tuple[str, bytes, int, int]]) -> None:
    hc, hr = c.DueHeap(), ref.DueHeap()
    for op, rows, now, max_n in ops:
        if op == "push":
            hc.push(rows)
            hr.push(rows)
        else:
            assert hc.pop(now, max_n) == hr.pop(now, max_n)
        assert len(hc) == len(hr) and hc.next_due() == hr.next_due()


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 3000))
def test_due_heap_deep(seed: int, n: int) -> None:
    """Heaps many levels deep and many runs (a burst due in one second), with ties in
    deliver_at and seq: the same rows come out in the same order, chunk by chunk."""
    rnd = random.Random(seed)
    hc, hr = c.DueHeap(), ref.DueHeap()
    rows = [ref.DUE.pack(rnd.randrange(50), rnd.randrange(n), rnd.randrange(1 << 40), 40, k, 7, 0, 0) for k in range(n)]
    k = 0
    while k < n:  # chunks small and large (the heap of rows and sorted runs), some already in order
        size = rnd.choice((1, 5, 31, 32, 97, 256, 700))
        chunk = rows[k:k + size]
        if rnd.randrange(4) == 0:
            chunk.sort(key=lambda r: ref.DUE.unpack(r)[:2], reverse=rnd.randrange(2) == 0)
        hc.push(b"".join(chunk))
        hr.push(b"".join(chunk))
        k += size
    now = -1
    while len(hr):
        now += rnd.randrange(3)
        want = rnd.randrange(1, 200)
        assert hc.pop(now, want) == hr.pop(now, want)
        assert len(hc) == len(hr) and hc.next_due() == hr.next_due()


@SETTINGS
@given(due_rows, st.binary(min_size=16 * 9, max_size=16 * 9), st.integers(0, 16 * 9), st.integers(0, 10**6))
def test_release_rows_and_set_states(rows: bytes, raw: bytes, valid: int, now: int) -> None:
    entries = bytearray(raw)
    for k in range(9):  # mostly SCHEDULED at the row's offset, as the pipeline leaves them
        if entries[k * 16] % 3:
            entries[k * 16] = 1
    states = []
    for impl in (c, ref):
        spans = [Span(0, bytearray(entries), valid)]
        out = impl.release_rows(rows, spans, now)
        seqs = b"".join(v[1] for v in out.values())
        missing = impl.set_states(seqs + struct.pack("<Q", 99), spans, 2)
        states.append((out, missing, span_states(spans)))
    assert states[0] == states[1]


@SETTINGS
@given(st.lists(st.integers(0, 3000), max_size=20), st.integers(1, 700), st.integers(0, 300),
       st.sampled_from([(8, 0), (40, 0), (48, 8), (60, 52), (7, 0), (16, 9)]))
def test_seq_runs(seqs: list[int], per: int, gap: int, layout: tuple[int, int]) -> None:
    stride, at = layout
    rows = b"".join(bytes(at) + struct.pack("<Q", q) + bytes(max(0, stride - at - 8)) for q in seqs) \
        if stride >= at + 8 else b"x" * stride
    same(c.seq_runs, ref.seq_runs, rows, per, gap, stride, at)


@SETTINGS
@given(st.lists(st.tuples(st.integers(-50, 5000), st.integers(0, 400)), max_size=24),
       st.lists(st.integers(-100, 6000), max_size=5), st.integers(0, 900), st.integers(0, 300),
       st.sampled_from([12, 56, 16]))
def test_read_plan(locs: list[tuple[int, int]], bases: list[int], span: int, gap: int, stride: int) -> None:
    rows = b"".join(struct.pack("<qI", o, s) + bytes(stride - 12) for o, s in locs)
    packed = struct.pack(f"<{len(bases)}q", *sorted(bases))
    plan = same(c.read_plan, pull_ref.read_plan, rows, stride, packed, span, gap)
    stretches = list(struct.iter_unpack("<qq", plan))
    for o, s in locs:  # every record lies wholly in one stretch
        assert any(a <= o and o + s <= b for a, b in stretches)
    same(c.read_plan, pull_ref.read_plan, rows, stride, packed[::-1] if len(set(bases)) > 1 else b"x", span, gap)
    same(c.read_plan, pull_ref.read_plan, rows + b"x", stride, packed, span, gap)
    same(c.read_plan, pull_ref.read_plan, rows, stride, struct.pack("<qq", 0, 2**63 - 1), 2**63 - 1, 2**63 - 1)
    same(c.read_plan, pull_ref.read_plan, struct.pack("<qI", 2**63 - 5, 2**32 - 1), 12, b"", 5, 5)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(49, 3000), st.sampled_from([3, 1 << 20, 1 << 40, 1 << 62]))
def test_seq_runs_and_read_plan_of_many_rows(seed: int, n: int, spread: int) -> None:
    """Past the compiled sort's insertion-only size: its radix passes over the bytes the rows
    differ in, unsigned seqs near 2**64, negative offsets, and ties (equal seqs; records at one
    offset with different sizes) come out as the reference's sorted() does."""
    rnd = random.Random(seed)
    seqs = [rnd.choice((0, 2**64 - 1 - rnd.randrange(spread), rnd.randrange(spread))) for _ in range(n)]
    for stride, at in ((8, 0), (56, 40)):
        rows = b"".join(bytes(at) + struct.pack("<Q", q) + bytes(stride - at - 8) for q in seqs)
        same(c.seq_runs, ref.seq_runs, rows, rnd.randrange(1, 1 << 30), rnd.randrange(spread), stride, at)
    offsets = [rnd.randrange(-spread, spread) for _ in range(n // 2 + 1)]
    locs = [(rnd.choice(offsets), rnd.randrange(0, 1 << 12)) for _ in range(n)]
    rows = b"".join(struct.pack("<qI", o, s) + bytes(44) for o, s in locs)
    bases = struct.pack("<3q", -spread // 2, 0, spread // 2)
    same(c.read_plan, pull_ref.read_plan, rows, 56, bases, rnd.randrange(1 << 16), rnd.randrange(1 << 10))
    # many records at one offset (a long run of tied keys, which the comparator sorts alone)
    rows = b"".join(struct.pack("<qI", offsets[0], rnd.randrange(1 << 12)) + bytes(44) for _ in range(n))
    same(c.read_plan, pull_ref.read_plan, rows, 56, bases, rnd.randrange(1 << 16), rnd.randrange(1 << 10))


# ---------------------------------------------------------------------------------- garbage in
@SETTINGS
@given(st.binary(max_size=200), st.integers(-2**40, 2**40), st.integers(0, 10))
def test_garbage_is_an_error_or_a_result_never_a_crash(junk: bytes, n: int, k: int) -> None:
    for f_c, f_ref, args in (
        (c.scan_rows, ref.scan_rows, (junk, n, True, k)),
        (c.produced_rows, ref.produced_rows, (junk, junk[:8 * k], 5)),
        (c.seq_runs, ref.seq_runs, (junk[:8 * (len(junk) // 8)], k + 1, k)),
    ):
        same(f_c, f_ref, *args)
    units = junk[:ref.UROW * (len(junk) // ref.UROW)]
    kinds = bytes(len(units) // ref.UROW)
    same(c.classify, ref.classify, units, [Span(0, bytearray(junk[:64]), 64)])
    same(c.dues, ref.dues, units, bytes(b % 3 for b in kinds), [(n, junk)], 7)
    wc, wr = c.Walker(0, PRECISION, n % 400), ref.Walker(0, PRECISION, n % 400)
    assert wc.feed(junk, 0, k) == wr.feed(junk, 0, k)
    for impl in (c, ref):
        with pytest.raises(ValueError):
            impl.DueHeap().push(junk + b"x" if len(junk) % ref.DROW == 0 else junk)


def test_record_types_match() -> None:
    assert [int(t) for t in RecordType] == [1, 2, 3, 4, 5]


def test_scans_take_release_records() -> None:
    """A RELEASE record is a record like any other to both scans (REC_RELEASE in the C)."""
    units = READY.pack(100, 60, 0, NOW, NOW + 1, 7) + READY.pack(160, 60, 0, NOW, NOW + 2, 8)
    rel = encode(Record(RecordType.RELEASE, 0, "topic", release_body(3, units), produced_at=NOW))
    recs = encoded_records_fixed() + [rel]
    buf = b"".join(recs)
    for impl in (c, ref):
        rows, consumed, outcome = impl.scan_rows(buf, 0, True, 10)
        assert (len(rows) // ref.MROW, consumed, outcome) == (len(recs), len(buf), batch_common.SCAN_OK)
        assert ref.MROW_FMT.unpack_from(rows, (len(recs) - 1) * ref.MROW)[7] == int(RecordType.RELEASE)
    from delayd.storage import commitlog
    scan = commitlog.scan_buffer(buf)
    assert (len(scan), scan.end, scan.stop) == (len(recs), len(buf), commitlog.ScanStop.END)
    assert commitlog.release_parts(commitlog.decode(rel).body) == (3, units)


def encoded_records_fixed() -> list[bytes]:
    recs, sizes, *_ = ref.encode_produce([{"body": b"a"}, {"body": b"bc", "key": "k"}], b"topic", NOW, 1, LIMITS,
                                         None)
    first = struct.unpack_from("<I", sizes)[0]
    return [recs[:first], recs[first:]]
    assert msgpack.packb({"a": "b"}) == b"\x81\xa1a\xa1b"


# ---------------------------------------------------------------------------------- pull
@st.composite
def pull_case(draw: Any) -> dict[str, Any]:
    recs = encoded_records(draw, draw(st.integers(0, 6)), first_seq=draw(st.integers(1, 2**40)))
    if draw(st.integers(0, 3)) == 0:  # a record with headers, some of them long
        items = [{"body": draw(st.binary(max_size=300)), "headers": draw(st.dictionaries(
            st.text(max_size=40), st.text(max_size=300), max_size=20))}]
        r, _sizes, *_ = ref.encode_produce(items, b"t" * draw(st.integers(1, 200)), NOW, 5, LIMITS, None)
        recs.append(r)
    start = draw(st.integers(0, 10**6))
    offsets, buf = [], bytearray()
    for r in recs:
        offsets.append(start + len(buf))
        buf += r
    if buf and draw(st.integers(0, 4)) == 0:
        i = draw(st.integers(0, len(buf) - 1))
        buf[i] ^= 1 << draw(st.integers(0, 7))
        if draw(st.booleans()):  # damage that keeps the CRC right: only the checks past it see it
            j = next((k for k, o in enumerate(offsets) if o - start > i), len(offsets)) - 1
            o = offsets[j] - start
            struct.pack_into("<I", buf, o + 4, zlib.crc32(buf[o + 8:o + struct.unpack_from("<I", buf, o)[0]]))
    tokens = draw(st.lists(st.text(max_size=8), min_size=1, max_size=3))
    rows = []
    for off, r in zip(offsets, recs, strict=True):
        seq = struct.unpack_from("<Q", r, 12)[0]
        rows.append(pull_ref.PULL.pack(off, len(r), 0, 0, draw(st.integers(-5, 2**50)), seq, draw(st.integers(0, 2**40)),
                                  draw(st.integers(1, 2**32 - 1)), draw(st.integers(0, len(tokens) - 1))))
    reads = [(start, bytes(buf))] if draw(st.integers(0, 5)) else []
    fields = draw(st.one_of(st.none(), st.integers(0, pull_ref.ALL_PULL_FIELDS),
                            st.sampled_from([-1, pull_ref.ALL_PULL_FIELDS + 1, 2**64 + 1, 2**70, "body", 1.0, True])))
    return {"rows": b"".join(rows), "prefix": draw(st.sampled_from([b"d-", b"s12-"])), "tokens": tokens,
            "reads": reads, "fields": fields}


@SETTINGS
@given(pull_case())
def test_encode_pull(case: dict[str, Any]) -> None:
    args = (case["rows"], case["prefix"], case["tokens"], case["reads"])
    if case["fields"] is None:
        got = same(c.encode_pull, pull_ref.encode_pull, *args)
    else:
        got = same(c.encode_pull, pull_ref.encode_pull, *args, case["fields"])
    if got is not None:
        assert isinstance(msgpack.unpackb(got[0]), dict)
    if got is not None and case["fields"] is not None:  # a choice of fields leaves out the others, nothing more
        full, problems = c.encode_pull(*args)
        assert got[1] == problems
        keep = [f for k, f in enumerate(pull_ref.PULL_FIELDS) if case["fields"] >> k & 1]
        assert msgpack.unpackb(got[0]) == {"messages": [{f: m[f] for f in keep} for m in msgpack.unpackb(full)["messages"]]}


@SETTINGS
@given(pull_case(), st.sampled_from([12, 20, pull_ref.PROW]))
def test_record_keys(case: dict[str, Any], stride: int) -> None:
    """The keys and seqs dequeue-put marks delivered in the key index, of pull_case's records
    (flipped bits, with the CRC made right again or not, and not read at all), located by rows of
    12 bytes, of 20 (more after the location) and by the PullRows themselves."""
    rows = case["rows"]
    places = [rows[i:i + 12] for i in range(0, len(rows), pull_ref.PROW)]
    locs = rows if stride == pull_ref.PROW else b"".join(p + b"\x07" * (stride - 12) for p in places)
    keys, seqs, problems = same(c.record_keys, pull_ref.record_keys, locs, case["reads"], stride)
    assert isinstance(keys, c.Keys) and len(keys) == len(places)
    starts = [s for s, _ in case["reads"]]
    bad = dict(problems)
    for i, (off, size) in enumerate(struct.unpack("<qI", p) for p in places):
        if i in bad:
            assert keys[i] is None and seqs[8 * i:8 * i + 8] == bytes(8)
            continue
        found = batch_common.read_record(case["reads"], starts, off, size)
        assert found is not None
        # As the byte table lays the record out (not commitlog.decode: the headers are not
        # checked here, and a flip in them under a CRC made right again does not decode).
        buf, at = found[2], found[3]
        (_l, _c, _v, _t, _f, seq, _d, _p, _r, tl, gl, kl, _h, _b) = commitlog.HEADER.unpack_from(buf, at)
        key = bytes(buf[at + commitlog.HEADER_SIZE + tl + gl:at + commitlog.HEADER_SIZE + tl + gl + kl])
        assert (keys[i], struct.unpack_from("<Q", seqs, 8 * i)[0]) == (key.decode() if kl else None, seq)


def test_record_keys_refuses_what_is_not_rows() -> None:
    for args in ((b"x" * 13, []), (b"x" * 12, [], 11), (b"", [(0, b"")], 12.0), (b"", [(0,)]), (b"", [("a", b"")]),
                 (b"", ((0, b""),))):
        same(c.record_keys, pull_ref.record_keys, *args)


receipt = st.one_of(
    st.builds(lambda node, seq, idx, tok: f"{node}-{seq:x}.{idx:x}.{tok}", st.sampled_from(["d", "s1"]),
              st.integers(1, 2**64 - 1), st.integers(0, 2**64 - 1), st.text(max_size=6)),
    st.text(max_size=20), st.sampled_from(["d-1.0x1f.t", "d-1.+1.t", "d-1.01.t", "d-1.F.t", "a.b", "d-1..t",
                                           "d-1.1.", "d-1.1.\ud800", "x.10000000000000000.t"]),
    st.integers(), st.none())


@SETTINGS
@given(st.lists(receipt, max_size=8))
def test_parse_receipts(receipts: list[Any]) -> None:
    got = same(c.parse_receipts, pull_ref.parse_receipts, receipts)
    idx, tid, tokens = got
    for i, r in enumerate(receipts):  # what it decides, it decides as Groups.parse_receipt does
        if struct.unpack_from("<I", tid, 4 * i)[0] != 0xFFFFFFFF:
            parts = r.rsplit(".", 2)
            assert (int(parts[1], 16), parts[2]) == (struct.unpack_from("<Q", idx, 8 * i)[0],
                                                      tokens[struct.unpack_from("<I", tid, 4 * i)[0]])



def _mp_str(text: str, form: int) -> bytes:
    """A msgpack str (lone surrogates as their bytes: not UTF-8) in one of its forms: 0 the
    shortest, as packb writes it; 1, 2, 3: str8, str16, str32 (str16 when str8 cannot hold it)."""
    b = text.encode("utf-8", "surrogatepass")
    if form == 0:
        form = 1 if len(b) > 31 else -1
    if form == 1 and len(b) > 255:
        form = 2
    return (bytes([0xa0 | len(b)]) if form < 0 else bytes([0xd8 + form]) + len(b).to_bytes(1 << (form - 1), "big")) + b


def _ack_body(receipts: list[str], map_form: int, array_form: int, key: str, str_forms: list[int]) -> bytes:
    head = [b"\x81", b"\xde\x00\x01", b"\xdf\x00\x00\x00\x01"][map_form]
    n = len(receipts)
    arr = [bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big"), b"\xdc" + n.to_bytes(2, "big"),
           b"\xdd" + n.to_bytes(4, "big")][array_form]
    return head + _mp_str(key, 0) + arr + b"".join(_mp_str(r, str_forms[i % len(str_forms)]) for i, r in enumerate(receipts))


@SETTINGS
@given(st.lists(st.one_of(receipt.filter(lambda r: isinstance(r, str)), st.just("d-5.1f.tok")), max_size=20),
       st.integers(0, 2), st.integers(0, 2), st.sampled_from(["receipts", "receipts", "receipt", "ids", "receiptsx"]),
       st.lists(st.integers(0, 3), min_size=1, max_size=3), st.integers(-1, 25),
       st.sampled_from(["none", "none", "cut", "flip", "tail", "second entry", "bin", "int"]), st.data())
def test_parse_receipts_raw(receipts: list[str], map_form: int, array_form: int, key: str, str_forms: list[int],
                            max_n: int, damage: str, data: st.DataObject) -> None:
    """An ack body read in place gives what parse_receipts gives for the receipts msgpack decodes
    from it, in any of msgpack's forms; any other body (damaged, another shape, over max_n) None."""
    body = _ack_body(receipts, map_form, array_form, key, str_forms)
    if damage == "cut":
        body = body[:data.draw(st.integers(0, max(0, len(body) - 1)))]
    elif damage == "flip" and body:
        at = data.draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([body[at] ^ data.draw(st.integers(1, 255))]) + body[at + 1:]
    elif damage == "tail":
        body += data.draw(st.binary(min_size=1, max_size=3))
    elif damage == "second entry":
        body = b"\x82" + body[1:] + msgpack.packb("x") + msgpack.packb(1)
    elif damage == "bin":
        body = msgpack.packb({key: [r.encode("utf-8", "surrogatepass") for r in receipts]}, use_bin_type=True)
    elif damage == "int":
        body = msgpack.packb({key: [*(r for r in receipts if "\ud800" not in r), 7]})
    got = same(c.parse_receipts_raw, pull_ref.parse_receipts_raw, bytearray(body), max_n)
    try:
        decoded = msgpack.unpackb(body, raw=False)
    except Exception:  # noqa: BLE001 - not msgpack: nothing to read in place
        decoded = None
    fits = (type(decoded) is dict and list(decoded) == ["receipts"] and type(decoded["receipts"]) is list
            and all(type(r) is str for r in decoded["receipts"]) and len(decoded["receipts"]) <= max_n
            and body[0] in (0x81, 0xde, 0xdf))
    if fits:
        assert got == c.parse_receipts(decoded["receipts"])
    elif damage == "none" and key == "receipts" and "\ud800" not in "".join(receipts) and max_n >= len(receipts):
        raise AssertionError("a well-formed body was not read")
    else:
        assert got is None



def test_parse_receipts_raw_reads_the_whole_body_or_nothing() -> None:
    """The cases the drawn bodies above reach only by chance, every time: a body is read only
    when it ends where the array's last str ends, and only up to max_n receipts."""
    body = msgpack.packb({"receipts": ["d-1.1f.tok", "d-2.20.tok"]})
    read = c.parse_receipts(["d-1.1f.tok", "d-2.20.tok"])
    for f in (c.parse_receipts_raw, pull_ref.parse_receipts_raw):
        assert f(body, 2) == read
        assert f(body + b"\x00", 2) is None, "a byte after the array"
        assert f(body[:-1], 2) is None, "the last str cut short"
        assert f(body, 1) is None, "more receipts than max_n"
        assert f(b"\x81\xa8receipts\x90", 0) == (b"", b"", [])


@SETTINGS
@given(due_rows, st.integers(-2**40, 2**40), st.sampled_from([(ref.DROW, 0), (40, 16), (8, 0), (7, 0)]),
       st.lists(st.integers(-50, 50), max_size=6))
def test_lateness_and_buckets(rows: bytes, now: int, layout: tuple[int, int], bounds: list[int]) -> None:
    stride, at = layout
    rows = rows[:len(rows) - len(rows) % stride] if stride != 7 else rows
    got = same(c.lateness, ref.lateness, rows, stride, at, now)
    values = got if got is not None else struct.pack("<3q", -5, 0, 99)
    packed = struct.pack(f"<{len(bounds)}q", *sorted(bounds))
    same(c.bucket_counts, ref.bucket_counts, values, packed)
    same(c.bucket_counts, ref.bucket_counts, values, struct.pack(f"<{len(bounds)}q", *bounds))


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)), max_size=12), st.integers(0, 2**40),
       st.lists(st.integers(0, 30), max_size=6), st.none() | st.lists(st.integers(0, 2**32 - 1), max_size=3),
       st.integers(0, 12), st.data())
def test_take_rows(units: list[tuple[int, int]], first: int, exclude: list[int], wanted: list[int] | None,
                   max_n: int, data: Any) -> None:
    raw = b"".join(READY.pack(off, 10, data.draw(st.sampled_from(wanted or [0]) | st.integers(0, 3)), 5, 6, seq)
                   for seq, off in units)
    ex = sorted({first + e for e in exclude})
    same(c.take_rows, pull_ref.take_rows, raw, first, struct.pack(f"<{len(ex)}Q", *ex),
         None if wanted is None else struct.pack(f"<{len(wanted)}I", *wanted), max_n, 1, 0)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(-2**63, 2**63 - 1), st.booleans()), max_size=20),
       st.sampled_from([b"d-", b"s12-", b"\xc3\xa9-", b'"-']), st.booleans())
def test_encode_produced(items: list[tuple[int, int, bool]], prefix: bytes, as_json: bool) -> None:
    n = len(items)
    args = (struct.pack(f"<{n}Q", *(i[0] for i in items)), struct.pack(f"<{n}q", *(i[1] for i in items)),
            bytes(i[2] for i in items), prefix, as_json)
    same(c.encode_produced, ref.encode_produced, *args)


@SETTINGS
@given(st.integers(-(2**65), 2**65) | st.integers(2**64 - 30, 2**64 + 2) | st.integers(0, 2**40), st.integers(0, 20),
       st.integers(-1, 1), st.booleans())
def test_encode_produced_of_consecutive_seqs(first: int, n: int, off: int, as_json: bool) -> None:
    """`seqs` as the first of consecutive seqs: the same answer as the seqs themselves, any
    first (out of range: the same error), lengths that do not agree."""
    dues, dup = struct.pack(f"<{n}q", *range(n)), bytes(n)
    got = same(c.encode_produced, ref.encode_produced, first, dues[:8 * max(n + off, 0)], dup, b"d-", as_json)
    if got is not None and off == 0:
        assert got == c.encode_produced(struct.pack(f"<{n}Q", *range(first, first + n)), dues, dup, b"d-", as_json)


@SETTINGS
@given(log_buffer(), st.integers(0, 40), st.booleans())
def test_scan_starts_is_scan_buffer(buf: bytes, start: int, verify: bool) -> None:
    """commitlog.scan_buffer with the compiled loop against its Python reference."""
    from delayd.storage import commitlog
    start = min(start, len(buf))
    try:
        want = commitlog.scan_buffer_py(buf, start, verify=verify)
    except Exception as e:  # noqa: BLE001 - a newer version raises in both
        with pytest.raises(type(e)):
            commitlog.scan_buffer(buf, start, verify=verify)
        return
    got = commitlog.scan_buffer(buf, start, verify=verify)
    assert (list(got.starts), got.end, got.batch_end, got.stop) == (list(want.starts), want.end, want.batch_end,
                                                                      want.stop)


@SETTINGS
@given(st.lists(st.tuples(st.integers(-2**40, 2**40), st.integers(-2**40, 2**40)), max_size=10),
       st.integers(0, 3))
def test_unit_bounds_and_tally(units: list[tuple[int, int]], junk: int) -> None:
    raw = b"".join(READY.pack(off, 1, 2, 3, rel, 4) for off, rel in units) + b"x" * junk
    same(c.unit_bounds, ref.unit_bounds, raw)
    rows = b"".join(ref.DUE.pack(1, 2, 3, 4, 5, 6, 7, rel % 5) for _o, rel in units)
    same(c.tally, ref.tally, rows + b"y" * junk, ref.DROW, 40)
