"""Ready queue: 40-byte units pointing at commit-log records, indexed 0, 1, 2, ..."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from delayd.storage.readyqueue import (
    READY_FORMAT,
    READY_VERSION,
    UNIT,
    UNIT_SIZE,
    ReadyQueue,
    ReadyUnit,
    tag_hash,
)
from delayd.storage.segments import SEGMENT_HEADER, SEGMENT_HEADER_SIZE, segment_name

H = SEGMENT_HEADER_SIZE  # a segment's units start after its header


def u(i: int) -> tuple[int, int, int, int, int, int]:
    return (1000 * i, 60 + i, tag_hash(f"t{i % 2}"), 5_000 + i, 5_010 + i, i + 1)


def test_unit_fields_at_their_offsets(tmp_path: Path) -> None:
    q = ReadyQueue(tmp_path / "q", segment_units=4)
    q.append([(2**40, 4321, 0xCAFEBABE, 1_700_000_000_001, 1_700_000_000_002, 2**63 + 1)])
    q.flush()
    raw = (tmp_path / "q" / segment_name(0)).read_bytes()
    assert SEGMENT_HEADER.unpack_from(raw)[:5] == (READY_FORMAT.magic, READY_VERSION, H, 40, 0)
    data = raw[H:]
    assert len(data) == UNIT_SIZE == UNIT.size == 40
    assert struct.unpack_from("<q", data, 0)[0] == 2**40  # commit_offset
    assert struct.unpack_from("<I", data, 8)[0] == 4321  # commit_size
    assert struct.unpack_from("<I", data, 12)[0] == 0xCAFEBABE  # tag_hash
    assert struct.unpack_from("<q", data, 16)[0] == 1_700_000_000_001  # deliver_at
    assert struct.unpack_from("<q", data, 24)[0] == 1_700_000_000_002  # released_at
    assert struct.unpack_from("<Q", data, 32)[0] == 2**63 + 1  # seq
    q.close()


def test_tag_hash() -> None:
    assert tag_hash(None) == 0 and tag_hash("") == 0
    assert tag_hash("paid") == zlib.crc32(b"paid")
    assert all(tag_hash(f"t{i}") != 0 for i in range(1000))  # 0 means no tag


def test_append_read_scan_across_segments_and_reopen(tmp_path: Path) -> None:
    q = ReadyQueue(tmp_path / "q", segment_units=3)
    assert q.append([u(i) for i in range(2)]) == 0
    assert q.append([u(i) for i in range(2, 8)]) == 2
    assert q.end == 8 and q.start == 0
    assert len(q.files.bases) == 3
    assert q.read(1, 1) == [ReadyUnit(1, *u(1))]
    assert [x.index for x in q.read(2, 100)] == [2]  # a read stops at its segment's end
    assert q.read(8, 5) == [] and q.read(0, 0) == []
    assert [x.seq for x in q.scan(0)] == [i + 1 for i in range(8)]
    q.close()
    q = ReadyQueue(tmp_path / "q", segment_units=3)
    assert q.end == 8
    assert [x.deliver_at for x in q.scan(5)] == [5005, 5006, 5007]
    q.close()


def test_torn_unit_cut_on_open_truncate_and_delete_before(tmp_path: Path) -> None:
    q = ReadyQueue(tmp_path / "q", segment_units=3)
    q.append([u(i) for i in range(8)])
    q.close()
    last = tmp_path / "q" / segment_name(6 * UNIT_SIZE)
    last.write_bytes(last.read_bytes()[:-3])
    q = ReadyQueue(tmp_path / "q", segment_units=3)
    assert q.end == 7
    assert q.truncate(5) == 2 and q.end == 5
    assert q.delete_before(3) == [0]
    assert q.start == 3
    assert [x.index for x in q.read(0, 10)] == [3, 4]
    assert q.disk_bytes() == H + 2 * UNIT_SIZE
    q.close()
