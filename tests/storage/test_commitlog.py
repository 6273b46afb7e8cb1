"""Commit log: the byte table of a record, CRC checks, segment rolling, scanning and recovery."""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import msgpack
import pytest
from delayd.storage import commitlog as cl
from delayd.storage.commitlog import HEADER_SIZE, CommitLog, Record, RecordType, ScanReport, decode, encode
from delayd.storage.errors import (
    ChecksumMismatch,
    CorruptData,
    RecordTooLarge,
    TornRecord,
    UnsupportedVersion,
)
from delayd.storage.segments import segment_name
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def full_record(seq: int = 7, body: bytes = b"hello body") -> Record:
    return Record(RecordType.MESSAGE, seq, "orders.close", body, deliver_at=1_700_000_123_456,
                  produced_at=1_700_000_000_001, roll_count=3, tag="paid", key="order-42",
                  headers={"trace": "abc", "ü": "ß"})


def msg(seq: int, body: bytes = b"x" * 20, deliver_at: int = 1000) -> bytes:
    return encode(Record(RecordType.MESSAGE, seq, "t", body, deliver_at, 1))


def test_every_field_sits_where_the_byte_table_says() -> None:
    rec = full_record()
    data = encode(rec)
    topic, tag, key = b"orders.close", b"paid", b"order-42"
    hdrs = msgpack.packb(rec.headers)
    assert len(data) == 48 + len(topic) + len(tag) + len(key) + len(hdrs) + len(rec.body)
    u32 = struct.Struct("<I").unpack_from
    assert u32(data, 0)[0] == len(data)
    assert u32(data, 4)[0] == zlib.crc32(data[8:])
    assert data[8] == cl.RECORD_VERSION
    assert data[9] == RecordType.MESSAGE
    assert struct.unpack_from("<H", data, 10)[0] == 0  # flags
    assert struct.unpack_from("<Q", data, 12)[0] == 7  # seq
    assert struct.unpack_from("<q", data, 20)[0] == 1_700_000_123_456  # deliver_at
    assert struct.unpack_from("<q", data, 28)[0] == 1_700_000_000_001  # produced_at
    assert struct.unpack_from("<H", data, 36)[0] == 3  # roll_count
    assert (data[38], data[39]) == (len(topic), len(tag))
    assert struct.unpack_from("<HHI", data, 40) == (len(key), len(hdrs), len(rec.body))
    p = 48
    for part in (topic, tag, key, hdrs, rec.body):
        assert data[p:p + len(part)] == part
        p += len(part)


def test_round_trip_of_every_field() -> None:
    rec = full_record()
    got = decode(encode(rec), 0, 4096)
    assert got == Record(RecordType.MESSAGE, 7, "orders.close", b"hello body", 1_700_000_123_456,
                         1_700_000_000_001, 3, "paid", "order-42", {"trace": "abc", "ü": "ß"},
                         offset=4096, size=len(encode(rec)))


@pytest.mark.parametrize("rtype", list(RecordType))
def test_round_trip_of_each_type_with_empty_optionals(rtype: RecordType) -> None:
    rec = Record(rtype, 2**64 - 1, "t", b"", -5, 0, 65535)
    got = decode(encode(rec))
    assert (got.type, got.seq, got.topic, got.body, got.deliver_at, got.roll_count) == \
        (rtype, 2**64 - 1, "t", b"", -5, 65535)
    assert got.tag is None and got.key is None and got.headers is None


def test_decode_at_a_position_inside_a_buffer() -> None:
    a, b = encode(full_record(1)), encode(full_record(2, b"second"))
    buf = a + b
    assert decode(buf, len(a), 100).seq == 2
    assert decode(memoryview(buf), len(a)).body == b"second"


def test_validation_errors_each_have_their_class() -> None:
    data = bytearray(encode(full_record()))
    with pytest.raises(TornRecord):
        decode(bytes(data[:30]))
    with pytest.raises(TornRecord):
        decode(bytes(data[:-1]))
    bad = bytearray(data)
    bad[-1] ^= 0xFF
    with pytest.raises(ChecksumMismatch):
        decode(bytes(bad))
    assert decode(bytes(bad), verify=False).body[-1] == data[-1] ^ 0xFF
    bad = bytearray(data)
    struct.pack_into("<I", bad, 0, 20)  # shorter than a header
    with pytest.raises(ChecksumMismatch):
        decode(bytes(bad))
    bad = bytearray(data)
    bad[8] = 9  # version
    struct.pack_into("<I", bad, 4, zlib.crc32(bytes(bad[8:])))
    with pytest.raises(UnsupportedVersion):
        decode(bytes(bad))
    bad = bytearray(data)
    bad[9] = 99  # type
    struct.pack_into("<I", bad, 4, zlib.crc32(bytes(bad[8:])))
    with pytest.raises(CorruptData):
        decode(bytes(bad))


@pytest.mark.parametrize("where", ["topic", "tag", "key", "headers", "headers_form"])
def test_a_field_that_does_not_decode_under_a_right_crc_is_corrupt(where: str) -> None:
    """Damage the CRC does not see (a writer's bug) is CorruptData, not a UnicodeDecodeError or
    msgpack's ValueError escaping to a caller that handles damage as StorageError."""
    rec = full_record()
    data = bytearray(encode(rec))
    at = {"topic": HEADER_SIZE, "tag": HEADER_SIZE + len(rec.topic), "key": HEADER_SIZE + len(rec.topic) + 4,
          "headers": HEADER_SIZE + len(rec.topic) + 4 + 8}
    if where == "headers_form":  # well-formed msgpack, but not a map
        packed, hl = msgpack.packb([1]), struct.unpack_from("<H", data, 42)[0]
        data[at["headers"]:at["headers"] + hl] = packed
        struct.pack_into("<H", data, 42, len(packed))
        struct.pack_into("<I", data, 0, len(data))
    else:
        data[at[where]] = 0xFF if where != "headers" else 0x83  # not UTF-8; a map of 3 of 2 entries
    struct.pack_into("<I", data, 4, zlib.crc32(bytes(data[8:])))
    with pytest.raises(CorruptData, match="undecodable"):
        decode(bytes(data))


def test_append_read_and_reopen(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "cl", 1 << 16)
    recs = [encode(full_record(i, b"b" * i)) for i in range(1, 50)]
    offsets = log.append(recs)
    assert offsets[0] == 0 and all(b > a for a, b in zip(offsets, offsets[1:], strict=False))
    log.flush()
    for off, data in zip(offsets, recs, strict=True):
        assert log.read(off).size == len(data)
        assert log.read(off, len(data)).body == decode(data).body
    log.close()
    log = CommitLog(tmp_path / "cl", 1 << 16)
    assert log.end == offsets[-1] + len(recs[-1])
    assert [r.seq for r in log.scan(0)] == list(range(1, 50))
    assert log.read(offsets[10]).seq == 11
    log.close()


def test_read_of_a_record_larger_than_the_first_guess(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "cl", 1 << 22)
    big = encode(full_record(1, b"z" * 100_000))
    log.append([msg(0), big])
    assert log.read(len(msg(0))).body == b"z" * 100_000
    log.close()


def test_segments_roll_and_records_never_span(tmp_path: Path) -> None:
    one = msg(1)
    size = len(one)
    log = CommitLog(tmp_path / "cl", size * 3 + size // 2)
    offsets = log.append([msg(i) for i in range(10)])
    assert log.files.bases == [0, 3 * size, 6 * size, 9 * size]
    assert offsets == [i * size for i in range(10)]
    assert sorted(p.name for p in (tmp_path / "cl").iterdir()) == [segment_name(b) for b in log.files.bases]
    # Separate appends roll the same way.
    more = [log.append([msg(i)])[0] for i in range(10, 14)]
    assert more == [10 * size, 11 * size, 12 * size, 13 * size]
    assert [r.seq for r in log.scan(0)] == list(range(14))
    # Scan from inside the log, and up to a bound.
    assert [r.seq for r in log.scan(4 * size, 8 * size)] == [4, 5, 6, 7]
    log.close()


def test_scan_a_record_bigger_than_the_scan_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl, "SCAN_CHUNK", 256)
    log = CommitLog(tmp_path / "cl", 1 << 20)
    log.append([msg(1), encode(full_record(2, b"q" * 1000)), msg(3)] + [msg(i) for i in range(4, 30)])
    assert [r.seq for r in log.scan(0)] == list(range(1, 30))
    log.close()


def test_delete_before_and_scan_from_before_the_start(tmp_path: Path) -> None:
    size = len(msg(1))
    log = CommitLog(tmp_path / "cl", size * 2)
    log.append([msg(i) for i in range(6)])
    assert log.delete_before(4 * size) == [0, 2 * size]
    assert log.start == 4 * size
    assert [r.seq for r in log.scan(0)] == [4, 5]
    assert log.disk_bytes() == 2 * size
    log.close()


def test_recover_cuts_a_torn_tail(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "cl", 1 << 20)
    offsets = log.append([msg(i) for i in range(5)])
    log.close()
    seg = tmp_path / "cl" / segment_name(0)
    data = seg.read_bytes()
    seg.write_bytes(data[:-7])
    log = CommitLog(tmp_path / "cl", 1 << 20)
    rep = log.recover(0)
    assert rep.records == 4 and rep.truncated_bytes == len(msg(4)) - 7 and rep.skipped_records == 0
    assert log.end == offsets[4]
    assert [r.seq for r in log.scan(0)] == [0, 1, 2, 3]
    log.close()


def test_recover_cuts_a_torn_header(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "cl", 1 << 20)
    log.append([msg(i) for i in range(3)])
    log.close()
    seg = tmp_path / "cl" / segment_name(0)
    seg.write_bytes(seg.read_bytes() + b"\x99" * 10)  # a header cut short
    log = CommitLog(tmp_path / "cl", 1 << 20)
    rep = log.recover(0)
    assert rep.truncated_bytes == 10 and rep.records == 3
    log.close()


def test_recover_cuts_a_corrupt_last_record(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "cl", 1 << 20)
    offsets = log.append([msg(i) for i in range(5)])
    log.close()
    seg = tmp_path / "cl" / segment_name(0)
    data = bytearray(seg.read_bytes())
    data[offsets[4] + 60] ^= 0x01
    seg.write_bytes(bytes(data))
    log = CommitLog(tmp_path / "cl", 1 << 20)
    rep = log.recover(offsets[2])
    assert rep.records == 2 and rep.truncated_bytes == len(msg(4))
    assert log.end == offsets[4]
    log.close()


def test_damaged_record_in_the_middle_is_skipped_and_counted(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "cl", 1 << 20)
    offsets = log.append([msg(i) for i in range(10)])
    end = log.end
    log.close()
    seg = tmp_path / "cl" / segment_name(0)
    data = bytearray(seg.read_bytes())
    data[offsets[4] + 50] ^= 0x40
    seg.write_bytes(bytes(data))
    log = CommitLog(tmp_path / "cl", 1 << 20)
    rep = log.recover(0)
    assert rep.skipped_records == 1 and rep.skipped_bytes == len(msg(4)) and rep.truncated_bytes == 0
    assert log.end == end
    assert [r.seq for r in log.scan(0)] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    with pytest.raises(ChecksumMismatch):
        log.read(offsets[4])
    log.close()


def test_damaged_length_field_resyncs_on_the_next_record(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "cl", 1 << 20)
    offsets = log.append([msg(i) for i in range(6)])
    log.close()
    seg = tmp_path / "cl" / segment_name(0)
    data = bytearray(seg.read_bytes())
    struct.pack_into("<I", data, offsets[2], 0xFFFF)
    seg.write_bytes(bytes(data))
    log = CommitLog(tmp_path / "cl", 1 << 20)
    rep = ScanReport()
    assert [r.seq for r in log.scan(0, report=rep)] == [0, 1, 3, 4, 5]
    assert rep.skipped_records == 1
    log.close()


def test_damage_at_the_end_of_an_older_segment_is_not_truncated(tmp_path: Path) -> None:
    size = len(msg(1))
    log = CommitLog(tmp_path / "cl", size * 2)
    log.append([msg(i) for i in range(6)])
    log.close()
    seg = tmp_path / "cl" / segment_name(0)
    data = bytearray(seg.read_bytes())
    data[size + 50] ^= 0x01  # last record of the first (closed) segment
    seg.write_bytes(bytes(data))
    log = CommitLog(tmp_path / "cl", size * 2)
    rep = log.recover(0)
    assert rep.truncated_bytes == 0 and rep.skipped_bytes == size
    assert [r.seq for r in log.scan(0)] == [0, 2, 3, 4, 5]
    assert log.end == 6 * size
    log.close()


def test_header_size_constant() -> None:
    assert HEADER_SIZE == 48 == cl.HEADER.size


def test_encode_messages_matches_encode_record_by_record() -> None:
    from delayd.storage.store import NewMessage
    msgs = [NewMessage("t", b"body", 5), NewMessage("täpic", b"", -3, tag="x", key="k", headers={"a": "b"}),
            NewMessage("t", b"z" * 300, 9, tag="", key=None, headers={})]
    got = cl.encode_messages(msgs, 40, 1234)
    want = [encode(Record(RecordType.MESSAGE, 40 + i, m.topic, m.body, m.deliver_at, 1234, 0, m.tag, m.key,
                          m.headers), cl.RecordFlag.CONTINUED if i < 2 else 0) for i, m in enumerate(msgs)]
    assert got == want
    assert [decode(r).flags for r in got] == [1, 1, 0]
    assert cl.encode_messages(msgs[:1], 1, 0, last_flags=cl.RecordFlag.CONTINUED) == \
        [encode(Record(RecordType.MESSAGE, 1, "t", b"body", 5, 0), cl.RecordFlag.CONTINUED)]


FIELDS_AT_THEIR_LIMIT = {"topic": "t" * cl.MAX_TOPIC_BYTES, "tag": "é" * 127 + "a",
                         "key": "€" * 21845, "headers": {"h": "v" * (cl.MAX_HEADERS_BYTES - 6)}}
FIELDS_ONE_PAST = {"topic": "t" * 256, "tag": "é" * 128, "key": "€" * 21845 + "a",
                   "headers": {"h": "v" * (cl.MAX_HEADERS_BYTES - 5)}}


@pytest.mark.parametrize("field", FIELDS_AT_THEIR_LIMIT)
def test_a_field_that_its_length_field_cannot_hold_is_refused(field: str) -> None:
    """Second line of defence behind the API's limits: RecordTooLarge naming the field, not a
    struct.error (which the HTTP layer answered as a 500) and not a truncated length."""
    from delayd.storage.store import NewMessage
    base = {"topic": "t", "tag": None, "key": None, "headers": None}
    ok_msg = NewMessage(**{**base, field: FIELDS_AT_THEIR_LIMIT[field]}, body=b"b", deliver_at=1)  # type: ignore[arg-type]
    rec = Record(RecordType.MESSAGE, 1, ok_msg.topic, b"b", 1, 0, 0, ok_msg.tag, ok_msg.key, ok_msg.headers)
    assert decode(encode(rec)) == decode(cl.encode_messages([ok_msg], 1, 0)[0])
    bad = NewMessage(**{**base, field: FIELDS_ONE_PAST[field]}, body=b"b", deliver_at=1)  # type: ignore[arg-type]
    with pytest.raises(RecordTooLarge, match=field):
        cl.encode_messages([ok_msg, bad], 1, 0)
    with pytest.raises(RecordTooLarge, match=field):
        encode(Record(RecordType.MESSAGE, 2, bad.topic, b"b", 1, 0, 0, bad.tag, bad.key, bad.headers))


def test_a_record_over_max_record_is_refused() -> None:
    from delayd.storage.store import NewMessage
    body = b"x" * (cl.MAX_RECORD - HEADER_SIZE)  # the topic's byte makes it one too many
    with pytest.raises(RecordTooLarge, match="at most"):
        cl.encode_messages([NewMessage("t", body, 1)], 1, 0)
    with pytest.raises(RecordTooLarge, match="at most"):
        encode(Record(RecordType.MESSAGE, 1, "t", body))
    assert len(encode(Record(RecordType.MESSAGE, 1, "", body))) == cl.MAX_RECORD


def test_decode_of_a_bytearray_or_memoryview_gives_bytes() -> None:
    data = encode(full_record())
    for buf in (bytearray(b"xx" + data), memoryview(b"xx" + data)):
        r = decode(buf, 2)
        assert type(r.body) is bytes and r.body == b"hello body" and r.headers == {"trace": "abc", "ü": "ß"}


def test_scan_buffer_gives_a_buffer_of_records_as_columns() -> None:
    from delayd.storage.commitlog import HEADER, ScanStop, scan_buffer
    recs = [encode(full_record(i, b"b" * i), cl.RecordFlag.CONTINUED if i in (1, 2) else 0) for i in range(4)]
    buf = b"".join(recs)
    scan = scan_buffer(buf)
    offsets = [sum(len(r) for r in recs[:i]) for i in range(4)]
    assert list(scan.starts) == offsets and scan.end == len(buf) and scan.stop is ScanStop.END
    assert scan.batch_end == len(buf)  # record 3 closes the batch 1..3
    assert [h[5] for h in HEADER.iter_unpack(scan.headers())] == [0, 1, 2, 3]  # seq
    cut = scan_buffer(buf[:-5])  # the last record runs past the buffer
    assert list(cut.starts) == offsets[:3] and cut.stop is ScanStop.CUT and cut.end == offsets[3]
    assert cut.batch_end == offsets[1], "records 1 and 2 belong to a batch whose end is not there"
    damaged = bytearray(buf)
    damaged[offsets[2] + 60] ^= 1
    bad = scan_buffer(bytes(damaged))
    assert list(bad.starts) == offsets[:2] and bad.stop is ScanStop.DAMAGED and bad.end == offsets[2]
    assert len(scan_buffer(bytes(damaged), verify=False)) == 4  # without CRCs the layout still holds
    assert scan_buffer(buf[:20]).stop is ScanStop.CUT and scan_buffer(b"").stop is ScanStop.END


def recover_record_by_record(log: CommitLog, start: int) -> ScanReport:
    """What `CommitLog.recover` did before it read a buffer at a time (`scan_buffer`): every
    record through `scan`, the tail cut after the last intact record that closes its batch. The
    reference its buffer-at-a-time loop is compared with."""
    report = ScanReport()
    last_good = batch_start = max(start, log.files.start)
    for rec in log.scan(start, report=report):
        last_good = rec.offset + rec.size
        if not rec.flags & cl.RecordFlag.CONTINUED:
            batch_start = last_good
    last_good = min(last_good, batch_start)
    if last_good < log.files.end and last_good >= log.files.bases[-1]:
        report.skipped_bytes -= min(report.skipped_bytes, log.files.end - last_good)
        report.damage = [d for d in report.damage if d.offset < last_good]
        report.truncated_bytes = log.files.truncate(last_good, "reference")
    return report


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 300), st.booleans()), min_size=1, max_size=30),
       st.lists(st.integers(0, 10**6), max_size=3), st.integers(0, 120), st.sampled_from([100, 256, 700, 1 << 20]),
       st.integers(0, 3))
def test_recover_a_buffer_at_a_time_cuts_and_counts_what_record_by_record_did(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: list[tuple[int, bool]], flips: list[int], cut: int,
        chunk: int, start_at: int) -> None:
    """Records of any size (some longer than a scan buffer), atomic batches (CONTINUED), segments
    rolling, bytes flipped anywhere and a tail cut off: the buffer-at-a-time `recover` leaves the
    same log and the same report as the record-by-record reference."""
    monkeypatch.setattr(cl, "SCAN_CHUNK", chunk)
    d = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
    log = CommitLog(d / "a", 900)
    offsets = log.append([encode(Record(RecordType.MESSAGE, i, "t", b"b" * n, 5, 1),
                                 cl.RecordFlag.CONTINUED if more else 0) for i, (n, more) in enumerate(records)])
    log.close()
    segs = sorted((d / "a").iterdir())
    for f in flips:
        seg = segs[f % len(segs)]
        data = bytearray(seg.read_bytes())
        data[f % len(data)] ^= 0x10
        seg.write_bytes(bytes(data))
    last = segs[-1]
    last.write_bytes(last.read_bytes()[:max(0, last.stat().st_size - cut)])
    shutil.copytree(d / "a", d / "b")
    start = offsets[min(start_at, len(offsets) - 1)]
    got = CommitLog(d / "a", 900)
    want = CommitLog(d / "b", 900)
    try:
        try:
            expected: ScanReport | type[Exception] = recover_record_by_record(want, start)
        except CorruptData as e:  # (a flip can make a header read as a newer version)
            expected = type(e)
        if isinstance(expected, type):
            with pytest.raises(expected):
                got.recover(start)
            return
        report = got.recover(start)
        assert (report.records, report.truncated_bytes, report.skipped_records, report.skipped_bytes) == \
            (expected.records, expected.truncated_bytes, expected.skipped_records, expected.skipped_bytes)
        assert [(x.offset, x.size) for x in report.damage] == [(x.offset, x.size) for x in expected.damage]
        assert got.end == want.end
        assert [(r.offset, r.seq) for r in got.scan(0)] == [(r.offset, r.seq) for r in want.scan(0)]
    finally:
        got.close()
        want.close()


@pytest.mark.timeout(20)
def test_a_tail_shorter_than_a_header_that_claims_less_is_cut_not_read_again_forever(tmp_path: Path) -> None:
    """The last bytes of a segment, fewer than a header, whose length field reads as less than a
    header (9-47 bytes): the scan read the same bytes again and again (recovery never ended)."""
    log = CommitLog(tmp_path / "cl", 1 << 20)
    offsets = log.append([msg(i) for i in range(3)])
    log.close()
    seg = tmp_path / "cl" / segment_name(0)
    seg.write_bytes(seg.read_bytes() + struct.pack("<I", 33) + b"\x01" * 29)  # 33 bytes claiming 33
    log = CommitLog(tmp_path / "cl", 1 << 20)
    assert [r.seq for r in log.scan(0)] == [0, 1, 2]
    rep = log.recover(offsets[1])
    assert rep.records == 2 and rep.truncated_bytes == 33
    log.close()
