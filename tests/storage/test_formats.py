"""Format versions: data a newer build wrote is refused — with the versions named and nothing on
disk changed — never treated as damage; data an older build wrote (version 1: no `meta`, no segment
headers) opens and keeps working. One test per kind of file, and the upgrade of a real version-1
data directory (tests/storage/data/v1-datadir.tar.gz, written by the last header-less build)."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import sqlite3
import struct
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from delayd.storage import checkpoint as ckpt
from delayd.storage import inspect
from delayd.storage.commitlog import CommitLog, RecordType, decode, find_record, scan_buffer
from delayd.storage.datadir import LEGACY_NODE_ID, META_HEADER, META_VERSION, check_formats, read_meta
from delayd.storage.errors import (
    BadMagic,
    ChecksumMismatch,
    CorruptData,
    Insane,
    StorageError,
    UnsupportedVersion,
)
from delayd.storage.keyindex import KEYINDEX_VERSION
from delayd.storage.msgtable import MSGTABLE_FORMAT, MessageTable
from delayd.storage.readyqueue import READY_FORMAT, ReadyQueue
from delayd.storage.recovery import open_store
from delayd.storage.segments import (
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    SegmentFormat,
    list_segments,
    parse_header,
    segment_name,
)
from delayd.storage.store import NewMessage
from delayd.storage.timerlog import TIMERLOG_FORMAT, TimerLog, UnitMagic, pack_unit

from tests.storage.driver import SMALL, Driver, delivered_seqs, drain, no_fsync

T0 = 1_000_000
FIXTURE = Path(__file__).parent / "data" / "v1-datadir.tar.gz"


def checksums(d: Path) -> dict[str, str]:
    """Every file under `d` (name -> sha256): what "nothing changed on disk" is checked against."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """A stopped data directory with something in every structure: messages delivered (ready
    queues), pending (TimerLog, wheel), a checkpoint, keys."""
    d = tmp_path / "data"
    clock = [T0]
    with no_fsync():
        s, _rep = open_store(d, SMALL, lambda: clock[0])
        drv = Driver(s, clock)
        s.append_messages([NewMessage("orders", b"m%d" % i, T0 + 30 * i, key=f"k{i}") for i in range(12)], T0)
        s.flush_commit()
        drain(drv, T0 + 150)
        drv.checkpoint()
        s.close()
    return d


# ------------------------------------------------------------------------------ the rule

def test_a_newer_version_is_not_damage() -> None:
    assert not issubclass(UnsupportedVersion, CorruptData)
    e = UnsupportedVersion("commit-log record at offset 7", 3, 1)
    assert isinstance(e, StorageError) and (e.found, e.supported) == (3, 1)
    assert "format version 3" in str(e) and "up to 1" in str(e) and "offset 7" in str(e)


def with_version(record: bytes, version: int, *, fix_crc: bool = True) -> bytes:
    raw = bytearray(record)
    raw[8] = version
    if fix_crc:
        struct.pack_into("<I", raw, 4, zlib.crc32(raw[8:]))
    return bytes(raw)


def test_the_decoder_tells_a_newer_record_from_a_damaged_one(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "cl", 1 << 20)
    log.append([b"" + r for r in _records(3)])
    good = log.files.read(0, log.end)
    log.close()
    first = decode(good).size
    newer = with_version(good[:first], 2) + good[first:]
    with pytest.raises(UnsupportedVersion, match="format version 2"):
        decode(newer)
    with pytest.raises(UnsupportedVersion):
        scan_buffer(newer)
    with pytest.raises(ChecksumMismatch):  # the same byte changed without a matching CRC: damage
        decode(with_version(good[:first], 2, fix_crc=False))
    assert scan_buffer(with_version(good[:first], 2, fix_crc=False) + good[first:]).stop.name == "DAMAGED"
    # After damage, the next intact frame of a newer version is not skipped either.
    second = decode(good, first).size
    damaged_then_newer = b"\xee" * 17 + with_version(good[first:first + second], 5)
    with pytest.raises(UnsupportedVersion, match="format version 5"):
        find_record(damaged_then_newer, 1)
    assert find_record(b"\xee" * 17 + good[first:], 1) == 17


def _records(n: int) -> list[bytes]:
    from delayd.storage.commitlog import encode_messages
    return encode_messages([NewMessage("t", b"x%d" % i, T0) for i in range(n)], 1, T0)


# ------------------------------------------------------------------------------ refused, untouched

def bump_commitlog(d: Path) -> None:
    """The defect of issue 13: the last two records carry version 2 with a correct CRC, and no
    checkpoint points past them (so recovery scans them)."""
    seg = d / "commitlog" / segment_name(list_segments(d / "commitlog")[-1])
    log = CommitLog(d / "commitlog", SMALL.commit_segment_bytes, readonly=True)
    recs = [r for r in log.scan(0) if r.offset >= list_segments(d / "commitlog")[-1]]
    log.close()
    base = list_segments(d / "commitlog")[-1]
    raw = bytearray(seg.read_bytes())
    for r in recs[-2:]:
        at = r.offset - base
        raw[at:at + r.size] = with_version(bytes(raw[at:at + r.size]), 2)
    seg.write_bytes(bytes(raw))
    for name in ("checkpoint", "checkpoint.prev"):
        (d / name).unlink(missing_ok=True)


def bump_checkpoint(d: Path, name: str = "checkpoint") -> None:
    p = d / name
    raw = bytearray(p.read_bytes())
    struct.pack_into("<H", raw, 4, ckpt.CHECKPOINT_VERSION + 1)  # the CRC covers the body only
    p.write_bytes(bytes(raw))


def bump_wheel(d: Path) -> None:
    p = d / "timerwheel"
    raw = bytearray(p.read_bytes())
    struct.pack_into("<H", raw, 4, 2)
    struct.pack_into("<I", raw, 24, zlib.crc32(bytes(raw[:24])))
    p.write_bytes(bytes(raw))


def bump_segment(directory: Path, fmt: SegmentFormat) -> None:
    base = list_segments(directory)[0]
    p = directory / segment_name(base)
    raw = bytearray(p.read_bytes())
    head = SEGMENT_HEADER.pack(fmt.magic, fmt.version + 1, SEGMENT_HEADER_SIZE, fmt.unit_size, base, 0, 0)
    raw[:SEGMENT_HEADER_SIZE] = head[:28] + struct.pack("<I", zlib.crc32(head[:28]))
    p.write_bytes(bytes(raw))


def bump_meta(d: Path) -> None:
    p = d / "meta"
    raw = bytearray(p.read_bytes())
    struct.pack_into("<H", raw, 4, META_VERSION + 1)
    p.write_bytes(bytes(raw))


def bump_sqlite(p: Path, version: int) -> None:
    """Mark the SQLite index `p` as written by a newer version, `version`."""
    assert p.exists()
    db = sqlite3.connect(p)
    db.execute(f"PRAGMA user_version={version}")
    db.commit()
    db.close()


BUMPS: dict[str, tuple[Callable[[Path], None], str]] = {
    "commit-log record": (bump_commitlog, "commit-log record at offset"),
    "checkpoint": (bump_checkpoint, "checkpoint: format version 2"),
    "checkpoint.prev": (lambda d: bump_checkpoint(d, "checkpoint.prev"), "checkpoint.prev: format version 2"),
    "timerwheel": (bump_wheel, "timerwheel: format version 2"),
    "TimerLog segment": (lambda d: bump_segment(d / "timerlog", TIMERLOG_FORMAT), "format version 3"),
    "ready-queue segment": (lambda d: bump_segment(d / "ready" / "orders", READY_FORMAT), "format version 3"),
    "message-table segment": (lambda d: bump_segment(d / "msgtable", MSGTABLE_FORMAT), "format version 3"),
    "meta": (bump_meta, f"meta: format version {META_VERSION + 1}"),
    "key index": (lambda d: bump_sqlite(d / "keys.sqlite", KEYINDEX_VERSION + 1),
                  f"keys.sqlite: format version {KEYINDEX_VERSION + 1}"),
    "far index": (lambda d: bump_sqlite(d / "far.sqlite", 2), "far.sqlite: format version 2"),
}


@pytest.mark.parametrize("kind", list(BUMPS))
def test_a_newer_file_is_refused_and_nothing_changes(built: Path, kind: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    bump, says = BUMPS[kind]
    bump(built)
    (built / "LOCK").touch()
    before = checksums(built)
    with pytest.raises(UnsupportedVersion, match=says) as e:
        open_store(built, SMALL, lambda: T0 + 10_000)
    assert e.value.found > e.value.supported
    assert checksums(built) == before, "refusing must not change any file"
    assert not [r for r in caplog.records if "cut" in r.getMessage()], "nothing may be truncated"
    # `delayd check` says so too, and reads nothing it cannot.
    report = inspect.check(built, SMALL)
    assert not report.ok and "newer delayd" in report.text()
    assert checksums(built) == before


# ------------------------------------------------------------------------------ headers

@pytest.mark.parametrize("fmt", [TIMERLOG_FORMAT, READY_FORMAT, MSGTABLE_FORMAT])
def test_segment_header_validation_order(fmt: SegmentFormat) -> None:
    good = fmt.pack(4096)
    assert parse_header(fmt, good, 4096, "f") == SEGMENT_HEADER_SIZE
    assert SEGMENT_HEADER.unpack(good)[:6] == (fmt.magic, fmt.version, 32, fmt.unit_size, 4096, 0)
    assert fmt.magic[7] & 0x80, "byte 7's top bit: no version-1 file starts like this"
    newer = bytearray(good)
    struct.pack_into("<H", newer, 8, fmt.version + 1)  # a newer version wins over a CRC mismatch
    with pytest.raises(UnsupportedVersion):
        parse_header(fmt, bytes(newer), 4096, "f")
    bad_crc = bytearray(good)
    bad_crc[20] ^= 1
    with pytest.raises(ChecksumMismatch):
        parse_header(fmt, bytes(bad_crc), 4096, "f")
    with pytest.raises(Insane):  # another base: a segment file renamed or copied
        parse_header(fmt, good, 8192, "f")
    with pytest.raises(BadMagic):
        parse_header(fmt, b"\xff" * 32, 4096, "f")


def strip_headers(directory: Path) -> None:
    """Turn a version-2 segment directory into what the version-1 build wrote: no headers."""
    for base in list_segments(directory):
        p = directory / segment_name(base)
        data = p.read_bytes()
        p.write_bytes(data[SEGMENT_HEADER_SIZE:])


def test_version_1_segments_are_read_and_new_ones_get_a_header(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "tl", segment_units=2)
    for i in range(3):
        log.room_units()
        log.append(pack_unit(-1, UnitMagic.DEFAULT, 0, 5, i, 1, 1, i))
    log.close()
    strip_headers(tmp_path / "tl")
    log = TimerLog(tmp_path / "tl", segment_units=2)
    assert [u.seq for u in log.scan(0)] == [0, 1, 2]
    assert [log.files.header_len(b) for b in log.files.bases] == [0, 0]
    for i in range(3, 5):
        log.room_units()
        log.append(pack_unit(-1, UnitMagic.DEFAULT, 0, 5, i, 1, 1, i))
    assert [u.seq for u in log.scan(0)] == [0, 1, 2, 3, 4]
    assert [log.files.header_len(b) for b in log.files.bases] == [0, 0, SEGMENT_HEADER_SIZE]
    log.close()

    q = ReadyQueue(tmp_path / "q", segment_units=4)
    q.append([(10 * i, 50, 0, 5, 6, i + 1) for i in range(3)])
    q.close()
    strip_headers(tmp_path / "q")
    q = ReadyQueue(tmp_path / "q", segment_units=4)
    assert [u.seq for u in q.scan(0)] == [1, 2, 3] and q.files.header_len(0) == 0
    q.close()

    t = MessageTable(tmp_path / "mt", segment_entries=4)
    t.set_run(1, [(1, 100 + i, 10, 0) for i in range(6)])
    t.close()
    strip_headers(tmp_path / "mt")
    t = MessageTable(tmp_path / "mt", segment_entries=4)
    assert [t.get(i)[1] for i in range(1, 7)] == [100, 101, 102, 103, 104, 105]
    t.set(9, 1, 999, 1)  # a new segment: with a header
    t.close()
    assert (tmp_path / "mt" / segment_name(2)).read_bytes()[:8] == MSGTABLE_FORMAT.magic
    assert (tmp_path / "mt" / segment_name(0)).read_bytes()[:1] != b"D"


def test_a_damaged_segment_header_is_damage_not_version_1(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "tl", segment_units=4)
    log.append(pack_unit(-1, UnitMagic.DEFAULT, 0, 5, 1, 1, 1, 1))
    log.close()
    p = tmp_path / "tl" / segment_name(0)
    raw = bytearray(p.read_bytes())
    raw[0] ^= 0x01  # the magic: no longer ours, and not a version-1 unit either
    p.write_bytes(bytes(raw))
    with pytest.raises(BadMagic):
        TimerLog(tmp_path / "tl", segment_units=4)


# ------------------------------------------------------------------------------ the upgrade

@pytest.fixture
def v1(tmp_path: Path) -> tuple[Path, dict]:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data", json.loads((tmp_path / "expected.json").read_text())


def test_a_version_1_data_directory_opens_and_delivers_everything(v1: tuple[Path, dict],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    d, expected = v1
    assert check_formats(d) is None, "a version-1 directory has no meta file"
    assert inspect.check(d, SMALL).ok
    # Segments recovery keeps (below the checkpoint's TimerLog end, and the message table's).
    old = {p: p.read_bytes()[:8] for p in (d / "timerlog" / segment_name(0), d / "msgtable" / segment_name(0))}
    clock = [expected["clock"]]
    acked = {int(k): v for k, v in expected["acked"].items()}
    cancelled = set(expected["cancelled"])
    caplog.set_level(logging.INFO)
    with no_fsync():
        s, rep = open_store(d, SMALL, lambda: clock[0])
        assert rep.checkpoint == "ok", rep.line()
        assert s.node_id == LEGACY_NODE_ID, "a directory with data from before keeps its ids valid"
        assert s.next_seq == expected["next_seq"]
        assert sorted(delivered_seqs(s)) == expected["delivered"]
        drv = Driver(s, clock)
        drain(drv, max(acked.values()) + 4 * SMALL.roll_window_ms)
        counts = collections.Counter(delivered_seqs(s))
        assert all(n == 1 for n in counts.values())
        assert {q for q in acked if q not in cancelled} == set(counts) and not cancelled & set(counts)
        assert s.scheduled == 0
        more = s.append_messages([NewMessage("orders", b"after the upgrade", clock[0] + 10)], clock[0])
        drain(drv, clock[0] + 100)
        assert more[0] in delivered_seqs(s)
        drv.checkpoint()
        s.close()
    meta = read_meta(d / "meta")
    assert meta is not None and meta.node_id == LEGACY_NODE_ID and meta.version == META_VERSION
    assert META_HEADER.unpack_from((d / "meta").read_bytes())[1] == META_VERSION
    # Old segments are left as they were written (version 1); new ones carry a header.
    for p, head in old.items():
        assert p.read_bytes()[:8] == head and head[:8] != TIMERLOG_FORMAT.magic
    heads = [(d / "timerlog" / segment_name(b)).read_bytes()[:8] for b in list_segments(d / "timerlog")]
    v1_first = struct.pack("<I", 52)
    assert all(h == TIMERLOG_FORMAT.magic or h[:4] == v1_first for h in heads)
    assert heads[0][:4] == v1_first and heads[-1] == TIMERLOG_FORMAT.magic
    assert inspect.check(d, SMALL).ok
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.checkpoint == "ok" and s.node_id == LEGACY_NODE_ID
    s.close()


def test_a_version_1_directory_with_records_of_every_type(v1: tuple[Path, dict]) -> None:
    d, expected = v1
    log = CommitLog(d / "commitlog", SMALL.commit_segment_bytes, readonly=True)
    types = {r.type for r in log.scan(0)}
    log.close()
    assert {RecordType.MESSAGE, RecordType.CANCEL, RecordType.ROLL} <= types
    assert len(expected["cancelled"]) > 0 and len(expected["delivered"]) > 0


def test_a_fresh_directory_gets_a_generated_node_id_and_keeps_it(tmp_path: Path) -> None:
    s, _ = open_store(tmp_path / "a", SMALL)
    generated = s.node_id
    s.close()
    assert generated != LEGACY_NODE_ID and generated.isalnum()
    s, _ = open_store(tmp_path / "a", SMALL)
    assert s.node_id == generated
    s.close()
    s, _ = open_store(tmp_path / "a", SMALL, node_id=generated)  # configured as recorded: fine
    s.close()
    from delayd.storage.errors import NodeIdMismatch
    before = checksums(tmp_path / "a")
    with pytest.raises(NodeIdMismatch, match=generated):
        open_store(tmp_path / "a", SMALL, node_id="other")
    assert checksums(tmp_path / "a") == before
    s, _ = open_store(tmp_path / "b", SMALL, node_id="s1")
    assert s.node_id == "s1"
    s.close()
    other = open_store(tmp_path / "c", SMALL)[0]
    assert other.node_id != generated, "two fresh directories are two shards"
    other.close()
