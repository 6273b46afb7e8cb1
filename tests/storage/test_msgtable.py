"""Message table: 16-byte entries addressed by sequence number, segment files, pread/pwrite."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from delayd.storage.msgtable import (
    ENTRY,
    ENTRY_SIZE,
    MSGTABLE_FORMAT,
    MSGTABLE_VERSION,
    MessageState,
    MessageTable,
)
from delayd.storage.segments import SEGMENT_HEADER, SEGMENT_HEADER_SIZE

H = SEGMENT_HEADER_SIZE  # a segment's entries start after its header


def test_entry_fields_at_their_offsets(tmp_path: Path) -> None:
    t = MessageTable(tmp_path / "mt", segment_entries=8)
    t.set(11, MessageState.SCHEDULED, 2**40 + 3, 777, roll_count=4)
    t.flush()
    data = (tmp_path / "mt" / f"{1:020d}").read_bytes()
    assert SEGMENT_HEADER.unpack_from(data)[:5] == (MSGTABLE_FORMAT.magic, MSGTABLE_VERSION, H, 16, 1)
    raw = data[H + 3 * 16:H + 4 * 16]
    assert ENTRY_SIZE == ENTRY.size == 16
    assert raw[0] == MessageState.SCHEDULED  # state
    assert raw[1] == 0  # flags
    assert struct.unpack_from("<H", raw, 2)[0] == 4  # roll_count
    assert struct.unpack_from("<I", raw, 4)[0] == 777  # size
    assert struct.unpack_from("<q", raw, 8)[0] == 2**40 + 3  # offset
    t.close()


def test_round_trip_and_reopen(tmp_path: Path) -> None:
    t = MessageTable(tmp_path / "mt", segment_entries=8)
    for state in MessageState:
        t.set(int(state) + 1, state, 100 * int(state), 10, int(state))
    assert t.get(3) == (MessageState.DELIVERED, 200, 10, 2)
    t.close()
    t = MessageTable(tmp_path / "mt", segment_entries=8)
    assert t.get(4) == (MessageState.CANCELLED, 300, 10, 3)
    t.close()


def test_unknown_entries(tmp_path: Path) -> None:
    t = MessageTable(tmp_path / "mt", segment_entries=8)
    assert t.get(5) == (MessageState.UNKNOWN, -1, 0, 0)  # no segment
    t.set(1, MessageState.SCHEDULED, 5, 5)
    assert t.get(7) == (MessageState.UNKNOWN, -1, 0, 0)  # past the end of the file
    assert t.get(0)[0] == MessageState.UNKNOWN  # a hole
    t.set(2, MessageState.SCHEDULED, 5, 5)
    with open(tmp_path / "mt" / f"{0:020d}", "r+b") as f:  # a state this build does not know
        f.seek(H + 2 * ENTRY_SIZE)
        f.write(bytes((99,)))
    assert t.get(2) == (MessageState.UNKNOWN, -1, 0, 0)
    t.close()


def test_set_state_keeps_the_rest(tmp_path: Path) -> None:
    t = MessageTable(tmp_path / "mt", segment_entries=8)
    t.set(3, MessageState.SCHEDULED, 4096, 90, 2)
    t.set_state(3, MessageState.DELIVERED)
    assert t.get(3) == (MessageState.DELIVERED, 4096, 90, 2)
    t.close()


def test_set_run_crosses_segments(tmp_path: Path) -> None:
    t = MessageTable(tmp_path / "mt", segment_entries=4)
    entries = [(MessageState.SCHEDULED, 1000 + i, 50 + i, i % 3) for i in range(10)]
    t.set_run(3, entries)
    assert sorted(p.name for p in (tmp_path / "mt").iterdir()) == [f"{i:020d}" for i in range(4)]
    for i, (st, off, size, roll) in enumerate(entries):
        assert t.get(3 + i) == (st, off, size, roll)
    t.close()


def test_delete_before_drops_whole_segments_only(tmp_path: Path) -> None:
    t = MessageTable(tmp_path / "mt", segment_entries=4)
    t.set_run(0, [(MessageState.DELIVERED, i, 1, 0) for i in range(12)])
    assert t.delete_before(9) == 2  # segments 0 and 1; 8..11 stays
    assert t.get(7)[0] == MessageState.UNKNOWN
    assert t.get(8) == (MessageState.DELIVERED, 8, 1, 0)
    assert t.disk_bytes() == H + 4 * ENTRY_SIZE
    t.set(1, MessageState.SCHEDULED, 1, 1)  # a deleted segment comes back on write
    t.reset()
    assert list((tmp_path / "mt").iterdir()) == []
    assert t.get(8)[0] == MessageState.UNKNOWN
    t.close()


@pytest.mark.parametrize("mapped", [False, True])
def test_a_batch_reads_and_writes_like_single_calls(tmp_path: Path, mapped: bool) -> None:
    """With `mapped`, segment 0 (whose file holds every entry asked for) is one span over its
    mapping, stored into directly; segment 1 is not (entry 101 is past its file's end) and
    segment 7 is again: the same answers and the same bytes on disk as single calls."""
    a = MessageTable(tmp_path / "a", segment_entries=64)
    b = MessageTable(tmp_path / "b", segment_entries=64)
    for t in (a, b):
        t.set_run(1, [(MessageState.SCHEDULED, 100 * i, 10 + i, 0) for i in range(100)])
        t.set(500, MessageState.SCHEDULED, 7, 7)  # far away: a run of its own
    seqs = [1, 2, 3, 60, 63, 64, 65, 90, 101, 500, 700, 5000]  # across segments, past the end, no segment
    b.begin_batch(seqs, mapped=mapped)
    assert [s.mapped for s in b.spans] == ([True, False, True] if mapped else [False] * 3)
    for seq in seqs:
        assert b.get(seq) == a.get(seq), seq
        assert b.flags(seq) == a.flags(seq), seq

    def ops(t: MessageTable) -> None:
        t.set_flags(2, 1)
        t.set_state(3, MessageState.DELIVERED)
        t.set(64, MessageState.SCHEDULED, 999, 55, 3)
        t.set_flags(64, 2)
        t.set_state(500, MessageState.CANCELLED)
        t.set_flags(700, 2)  # past the end of its segment
        t.set(90, MessageState.CANCELLED, 1, 1)
        t.set_flags(33, 1)  # not in the batch: straight to the file

    ops(a)
    ops(b)
    for seq in (*seqs, 33):
        assert b.get(seq) == a.get(seq), seq
        assert b.flags(seq) == a.flags(seq), seq
    b.end_batch()
    b.end_batch()  # idempotent
    for seq in range(0, 800):
        assert b.get(seq) == a.get(seq), seq
        assert b.flags(seq) == a.flags(seq), seq
    assert a.disk_bytes() == b.disk_bytes()
    a.close()
    b.close()
    for seg in sorted(p.name for p in (tmp_path / "a").iterdir()):
        assert (tmp_path / "a" / seg).read_bytes() == (tmp_path / "b" / seg).read_bytes(), seg


def test_mapped_segments_unmapped_when_idle(tmp_path: Path) -> None:
    t = MessageTable(tmp_path / "m", segment_entries=64)
    t.set_run(0, [(MessageState.SCHEDULED, i, 1, 0) for i in range(128)])
    t.begin_batch([1, 70], mapped=True)
    t.set_state(70, MessageState.DELIVERED)
    t.end_batch()
    t.begin_batch([2], mapped=True)
    t.end_batch()
    t.unmap_idle()
    assert set(t._maps) == {0, 1}
    t.unmap_idle()
    assert not t._maps
    assert t.get(70)[0] == MessageState.DELIVERED
    t.close()
    t = MessageTable(tmp_path / "m", segment_entries=64)
    assert t.get(70)[0] == MessageState.DELIVERED and t.get(69)[0] == MessageState.SCHEDULED
    t.close()
