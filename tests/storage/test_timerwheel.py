"""TimerWheel: header validation order, slot addressing, stale laps, geometry."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from delayd.storage.errors import BadMagic, ChecksumMismatch, GeometryMismatch, UnsupportedVersion
from delayd.storage.timerwheel import (
    HEADER,
    SLOT,
    SLOT_SIZE,
    WHEEL_MAGIC,
    WHEEL_VERSION,
    Slot,
    TimerWheel,
    columns,
)


def test_a_fresh_wheel_has_a_valid_header(tmp_path: Path) -> None:
    w = TimerWheel(tmp_path / "w", 100, 16)
    assert w.created and w.span_ms == 1600
    w.close()
    data = (tmp_path / "w").read_bytes()
    assert len(data) == 32 + 16 * 32
    assert struct.unpack_from("<I", data, 0)[0] == WHEEL_MAGIC
    assert data[:4] == b"DWLH"
    assert struct.unpack_from("<H", data, 4)[0] == WHEEL_VERSION
    assert struct.unpack_from("<II", data, 8) == (100, 16)  # precision_ms, slot_count
    assert struct.unpack_from("<I", data, 24)[0] == zlib.crc32(data[:24])
    w = TimerWheel(tmp_path / "w", 100, 16)
    assert not w.created
    w.close()


def test_slot_fields_round_trip_at_their_offsets(tmp_path: Path) -> None:
    w = TimerWheel(tmp_path / "w", 100, 16)
    w.put(1_234_567, 520, 1040, 3, 5)
    assert w.get(1_234_599) == Slot(1_234_500, 520, 1040, 3, 5)
    w.close()
    data = (tmp_path / "w").read_bytes()
    at = HEADER.size + (1_234_500 // 100 % 16) * SLOT_SIZE
    assert struct.unpack_from("<q", data, at)[0] == 1_234_500  # slot_time
    assert struct.unpack_from("<q", data, at + 8)[0] == 520  # first_pos
    assert struct.unpack_from("<q", data, at + 16)[0] == 1040  # last_pos
    assert struct.unpack_from("<i", data, at + 24)[0] == 3  # num
    assert struct.unpack_from("<I", data, at + 28)[0] == 5  # magic
    assert SLOT.size == 32
    w = TimerWheel(tmp_path / "w", 100, 16)
    assert w.get(1_234_500) == Slot(1_234_500, 520, 1040, 3, 5)  # persisted via the mmap
    w.close()


def test_another_lap_reads_as_empty(tmp_path: Path) -> None:
    w = TimerWheel(tmp_path / "w", 100, 16)
    w.put(5_000, 0, 52, 2, 1)
    assert not w.get(5_000).empty
    lap = 5_000 + w.span_ms
    assert w.get(lap) == Slot(lap, -1, -1, 0, 0) and w.get(lap).empty
    assert w.raw(lap) == Slot(5_000, 0, 52, 2, 1)
    w.put(lap, 104, 104, 1, 1)
    assert w.get(5_000).empty
    w.close()


def stored(w: TimerWheel) -> list[Slot]:
    """Every slot whose num is not 0, in file order, from `columns`."""
    return [Slot(*fields) for _, cols in columns(memoryview(w.buffer)[HEADER.size:])
            for fields in zip(*cols, strict=True) if fields[3]]


def test_slots_counts_and_reset(tmp_path: Path) -> None:
    w = TimerWheel(tmp_path / "w", 10, 8)
    w.put(100, 0, 0, 1, 1)
    w.put(130, 52, 104, 2, 1)
    w.put(170 + 80, 156, 156, 1, 2)  # a later lap in slot 1
    assert sorted(s.time for s in stored(w)) == [100, 130, 250]
    assert list(w.counts(100, 180)) == [(100, 1), (130, 2)]
    w.reset()
    assert stored(w) == []
    w.flush()
    w.close()


def test_columns_across_chunks_skip_empty_ones_and_keep_damage(tmp_path: Path) -> None:
    """`columns` reads the file 65,536 slots at a time: slots in the first and the last chunk
    come out with every field, a chunk with nothing in it is skipped, and a slot whose num is
    negative (damage) is listed, so recovery's check sees it."""
    w = TimerWheel(tmp_path / "w", 10, 200_000)
    want = [Slot(0, 0, 0, 1, 1), Slot(700_000, 52, 104, 2, 0x80000001),
            Slot(1_999_990, 156, 208, 7, 2), Slot(30, 8, 8, -3, 1)]
    for s in want:
        w.put(s.time, s.first_pos, s.last_pos, s.num, s.magic)
    assert sorted(stored(w), key=lambda s: s.time) == sorted(want, key=lambda s: s.time)
    by_unpack = [Slot(*raw) for raw in SLOT.iter_unpack(w.buffer[HEADER.size:]) if raw[3]]
    assert stored(w) == by_unpack
    chunks = [first for first, _cols in columns(memoryview(w.buffer)[HEADER.size:])]
    assert chunks == [0, 65_536, 196_608]  # of 4 chunks: the third, all empty, is left out
    w.close()


def make_bad(tmp_path: Path, **change: int) -> Path:
    p = tmp_path / "-".join(f"{k}{v}" for k, v in change.items())
    TimerWheel(p, 100, 16).close()
    data = bytearray(p.read_bytes())
    fields = list(HEADER.unpack_from(data))
    order = ["magic", "version", "r", "precision", "count", "created", "crc", "r2"]
    for k, v in change.items():
        fields[order.index(k)] = v
    if "crc" not in change:
        fields[6] = zlib.crc32(HEADER.pack(*fields)[:24])
    HEADER.pack_into(data, 0, *fields)
    p.write_bytes(bytes(data))
    return p


def test_header_validation_in_bbolt_order(tmp_path: Path) -> None:
    with pytest.raises(BadMagic):
        TimerWheel(make_bad(tmp_path, magic=1, version=9, crc=0), 100, 16)
    with pytest.raises(UnsupportedVersion):
        TimerWheel(make_bad(tmp_path, version=9, crc=0), 100, 16)
    with pytest.raises(ChecksumMismatch):
        TimerWheel(make_bad(tmp_path, crc=12345), 100, 16)
    p = tmp_path / "w"
    p.write_bytes(b"short")
    with pytest.raises(BadMagic):
        TimerWheel(p, 100, 16)


def test_another_geometry_is_an_error_not_reuse(tmp_path: Path) -> None:
    TimerWheel(tmp_path / "w", 100, 16).close()
    with pytest.raises(GeometryMismatch):
        TimerWheel(tmp_path / "w", 1000, 16)
    with pytest.raises(GeometryMismatch):
        TimerWheel(tmp_path / "w", 100, 32)
    with open(tmp_path / "w", "ab") as f:
        f.write(b"\0" * 32)
    with pytest.raises(GeometryMismatch):
        TimerWheel(tmp_path / "w", 100, 16)
