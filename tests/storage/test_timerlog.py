"""TimerLog: 52-byte units, chains through prev_pos, whole units per segment."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from delayd.storage.errors import Insane
from delayd.storage.segments import SEGMENT_HEADER_SIZE, segment_name
from delayd.storage.timerlog import NO_POS, UNIT, UNIT_SIZE, TimerLog, Unit, UnitMagic, pack_unit, unpack_unit

H = SEGMENT_HEADER_SIZE  # a segment's units start after its header


def test_every_field_sits_where_the_byte_table_says() -> None:
    data = pack_unit(104, UnitMagic.ROLL | UnitMagic.DELETE, 1_700_000_000_000, 1_700_000_090_000,
                     123_456_789_012, 4321, 0xDEADBEEF, 2**63 + 5)
    assert len(data) == UNIT_SIZE == 52 == UNIT.size
    assert struct.unpack_from("<I", data, 0)[0] == 52  # size
    assert struct.unpack_from("<q", data, 4)[0] == 104  # prev_pos
    assert struct.unpack_from("<I", data, 12)[0] == 6  # magic
    assert struct.unpack_from("<q", data, 16)[0] == 1_700_000_000_000  # enqueue_time
    assert struct.unpack_from("<i", data, 24)[0] == 90_000  # delay
    assert struct.unpack_from("<q", data, 28)[0] == 123_456_789_012  # commit_offset
    assert struct.unpack_from("<I", data, 36)[0] == 4321  # commit_size
    assert struct.unpack_from("<I", data, 40)[0] == 0xDEADBEEF  # topic_hash
    assert struct.unpack_from("<Q", data, 44)[0] == 2**63 + 5  # seq


def test_round_trip() -> None:
    data = pack_unit(NO_POS, UnitMagic.DEFAULT, 10, 7, 99, 60, 5, 3)  # negative delay: already due
    u = unpack_unit(b"pad" + data, 3, 520)
    assert u == Unit(520, NO_POS, UnitMagic.DEFAULT, 10, -3, 99, 60, 5, 3)
    assert u.fire_time == 7


@pytest.mark.parametrize("field,value", [
    (0, 51),  # size
    (4, 520),  # prev_pos not before the unit itself
    (4, -2),  # prev_pos below NO_POS
    (12, 0),  # no magic bit
    (12, 8),  # unknown magic bit
    (28, -1),  # negative commit offset
])
def test_damaged_units_are_insane(field: int, value: int) -> None:
    data = bytearray(pack_unit(0, UnitMagic.DEFAULT, 10, 20, 30, 40, 50, 60))
    fmt = {0: "<I", 4: "<q", 12: "<I", 28: "<q"}[field]
    struct.pack_into(fmt, data, field, value)
    with pytest.raises(Insane):
        unpack_unit(bytes(data), 0, 520)


def units(n: int, first_pos: int = 0, chained: bool = True) -> bytes:
    return b"".join(pack_unit(first_pos + (i - 1) * UNIT_SIZE if chained and i else NO_POS, UnitMagic.DEFAULT,
                              0, 1000 + i, i * 100, 100, 1, i) for i in range(n))


def test_append_read_chain_scan_and_reopen(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "tl", segment_units=4)
    assert log.room_units() == 4
    assert log.append(units(3)) == 0
    assert log.end == 3 * UNIT_SIZE and log.room_units() == 1
    assert log.read(UNIT_SIZE).seq == 1
    assert [u.seq for u in log.chain(2 * UNIT_SIZE)] == [2, 1, 0]
    assert [u.seq for u in log.scan(0)] == [0, 1, 2]
    log.flush()
    log.close()
    log = TimerLog(tmp_path / "tl", segment_units=4)
    assert log.end == 3 * UNIT_SIZE
    assert [u.seq for u in log.chain(2 * UNIT_SIZE)] == [2, 1, 0]
    log.close()


def test_segments_hold_whole_units_and_chains_cross_them(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "tl", segment_units=2)
    pos = NO_POS
    for i in range(5):
        assert log.room_units() >= 1
        pos = log.append(pack_unit(pos, UnitMagic.DEFAULT, 0, 5, i, 1, 1, i))
    assert log.files.bases == [0, 2 * UNIT_SIZE, 4 * UNIT_SIZE]
    assert sorted(p.name for p in (tmp_path / "tl").iterdir()) == \
        [segment_name(b) for b in (0, 104, 208)]
    assert [u.seq for u in log.chain(pos)] == [4, 3, 2, 1, 0]
    assert [u.seq for u in log.scan(0)] == [0, 1, 2, 3, 4]
    assert [u.seq for u in log.scan(UNIT_SIZE + 10, 4 * UNIT_SIZE)] == [1, 2, 3]  # start rounds down
    log.close()


def test_reading_outside_the_log_is_insane(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "tl", segment_units=4)
    log.append(units(2))
    for pos in (-UNIT_SIZE, 2 * UNIT_SIZE, 7):
        with pytest.raises(Insane):
            log.read(pos)
    log.close()


def test_a_torn_unit_is_cut_by_recovery_not_by_opening(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "tl", segment_units=8)
    log.append(units(3))
    log.close()
    seg = tmp_path / "tl" / segment_name(0)
    seg.write_bytes(seg.read_bytes()[:-5])
    size = seg.stat().st_size
    log = TimerLog(tmp_path / "tl", segment_units=8)
    assert seg.stat().st_size == size  # opening changes nothing (a newer build's data is refused first)
    assert log.cut_torn_tail() == UNIT_SIZE - 5
    assert log.end == 2 * UNIT_SIZE
    assert [u.seq for u in log.scan(0)] == [0, 1]
    log.close()


def test_truncate_and_delete_before(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "tl", segment_units=2)
    for i in range(6):
        log.room_units()
        log.append(pack_unit(NO_POS, UnitMagic.DEFAULT, 0, 5, i, 1, 1, i))
    assert log.truncate(5 * UNIT_SIZE) == UNIT_SIZE
    assert log.delete_before(2 * UNIT_SIZE) == [0]
    assert log.start == 2 * UNIT_SIZE
    assert [u.seq for u in log.scan(0)] == [2, 3, 4]
    log.close()


def test_scan_a_damaged_unit_raises(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "tl", segment_units=8)
    log.append(units(3))
    log.close()
    seg = tmp_path / "tl" / segment_name(0)
    data = bytearray(seg.read_bytes())
    data[H + UNIT_SIZE] = 0
    seg.write_bytes(bytes(data))
    log = TimerLog(tmp_path / "tl", segment_units=8)
    with pytest.raises(Insane):
        list(log.scan(0))
    log.close()


def test_tolerant_scan_and_relink(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "tl", segment_units=8)
    log.append(units(4))
    log.close()
    seg = tmp_path / "tl" / segment_name(0)
    data = bytearray(seg.read_bytes())
    struct.pack_into("<I", data, H + 2 * UNIT_SIZE + 12, 0)  # unit 2: no magic bit
    seg.write_bytes(bytes(data))
    log = TimerLog(tmp_path / "tl", segment_units=8)
    damaged: list[int] = []
    assert [u.seq for u in log.scan(0, damaged=damaged)] == [0, 1, 3]
    assert damaged == [2 * UNIT_SIZE]
    log.relink(3 * UNIT_SIZE, UNIT_SIZE)  # around the damaged one
    assert [u.seq for u in log.chain(3 * UNIT_SIZE)] == [3, 1, 0]
    log.close()
