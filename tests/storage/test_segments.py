"""SegmentedFile: one global offset space over files named by their 20-digit base offset."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from delayd.storage.errors import DiskFull, OffsetOutOfRange
from delayd.storage.segments import MAP_KEEP, SegmentedFile, SegmentFormat, fsync_all, segment_name

_FMT = SegmentFormat("view test", b"DLVIEWT\xff", 2, 1, legacy=lambda first: False)


def names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_segment_name_is_20_digits() -> None:
    assert segment_name(0) == "0" * 20
    assert segment_name(67108864) == "00000000000067108864"


def test_fresh_directory_has_one_empty_segment(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 100)
    assert (f.start, f.end, f.bases, f.remaining()) == (0, 0, [0], 100)
    assert names(tmp_path / "s") == [segment_name(0)]
    f.close()


def test_segment_bytes_must_hold_whole_units(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SegmentedFile(tmp_path / "s", 100, unit=52)


def test_append_returns_global_offsets_and_rolls_without_spanning(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 10)
    assert f.append(b"aaaa") == 0
    assert f.append(b"bbbb") == 4
    # 4 more bytes do not fit in the 2 left: a new segment starts at 8, no filler.
    assert f.append(b"cccc") == 8
    assert f.bases == [0, 8]
    assert names(tmp_path / "s") == [segment_name(0), segment_name(8)]
    assert f.segment_end(0) == 8 and f.segment_end(8) == 12
    assert f.read(0, 100) == b"aaaabbbb"  # a read never crosses its segment's end
    assert f.read(8, 4) == b"cccc"
    assert f.read(5, 2) == b"bb"
    assert f.segment_of(0) == 0 and f.segment_of(7) == 0 and f.segment_of(8) == 8 and f.segment_of(12) == 8
    assert f.disk_bytes() == 12
    f.close()


def test_roll_of_an_empty_segment_is_a_no_op(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 10)
    f.roll()
    assert f.bases == [0]
    f.append(b"x")
    f.roll()
    f.roll()
    assert f.bases == [0, 1]
    f.close()


def test_out_of_range(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 10)
    f.append(b"abc")
    with pytest.raises(OffsetOutOfRange):
        f.segment_of(4)
    with pytest.raises(OffsetOutOfRange):
        f.read(-1, 1)
    f.close()


def test_reopen_continues_at_the_end(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 10)
    for chunk in (b"123456", b"7890", b"abcdef"):
        f.append(chunk)
    f.close()
    g = SegmentedFile(tmp_path / "s", 10)
    assert g.bases == [0, 10] and g.end == 16
    assert g.append(b"gh") == 16
    assert g.read(0, 10) == b"1234567890" and g.read(10, 10) == b"abcdefgh"
    g.close()


def test_write_at_overwrites_in_place_in_any_segment(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 4)
    f.append(b"abcd")
    f.append(b"efgh")
    f.write_at(1, b"X")
    f.write_at(6, b"Y")
    f.flush()
    assert f.read(0, 4) == b"aXcd" and f.read(4, 4) == b"efYh"
    f.close()


def test_truncate_across_segments(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 4)
    for c in (b"aaaa", b"bbbb", b"cccc"):
        f.append(c)
    assert f.truncate(12) == 0
    assert f.truncate(6) == 6
    assert f.bases == [0, 4] and f.end == 6
    assert names(tmp_path / "s") == [segment_name(0), segment_name(4)]
    assert f.append(b"zz") == 6
    assert f.read(4, 4) == b"bbzz"
    # Back into the first segment: the second file goes and writing continues in the first.
    assert f.truncate(2) == 6
    assert f.bases == [0] and f.end == 2
    assert f.append(b"qq") == 2
    assert f.read(0, 4) == b"aaqq"
    f.close()
    g = SegmentedFile(tmp_path / "s", 4)
    assert g.end == 4 and g.read(0, 4) == b"aaqq"
    g.close()


def test_truncate_to_a_segment_boundary(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 4)
    f.append(b"aaaa")
    f.append(b"bb")
    assert f.truncate(4) == 2
    assert f.bases == [0, 4] and f.end == 4 and f.remaining() == 4
    f.close()


def test_delete_before_keeps_the_segment_being_written(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 4)
    for c in (b"aaaa", b"bbbb", b"cc"):
        f.append(c)
    assert f.delete_before(3) == []  # segment 0 still holds bytes at or after 3
    assert f.delete_before(4) == [0]
    assert f.start == 4
    assert f.delete_before(100) == [4]  # 8 is being written: kept
    assert f.bases == [8] and f.start == 8 and f.end == 10
    with pytest.raises(OffsetOutOfRange):
        f.read(0, 1)
    f.close()
    g = SegmentedFile(tmp_path / "s", 4)
    assert (g.start, g.end) == (8, 10)
    g.close()


def test_reset_deletes_everything_and_keeps_offsets_monotonic(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 8, unit=4)
    f.append(b"aaaabbbb")
    f.append(b"cc")
    f.reset(10)
    # Rounded down to the unit so positions stay unit-aligned.
    assert f.bases == [8] and f.start == 8 and f.end == 8
    assert names(tmp_path / "s") == [segment_name(8)]
    assert f.append(b"dddd") == 8
    f.close()


def test_flush_fsyncs_closed_segments_written_through_write_at(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 4)
    f.append(b"aaaa")
    f.append(b"bbbb")
    f.write_at(0, b"Z")
    f.flush()
    assert (tmp_path / "s" / segment_name(0)).read_bytes() == b"Zaaa"
    f.close()


def test_the_checkpoint_and_the_group_commit_each_take_their_own_dirty_segments(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 8, checkpoint_taker=True)
    f.append(b"aaaaaaaa")
    f.append(b"bb")  # rolled: segment 0 was fsynced then, only segment 8 is dirty
    inode = os.stat(tmp_path / "s" / segment_name(8)).st_ino

    def taken(fds: list[int]) -> list[int]:
        inodes = [os.fstat(fd).st_ino for fd in fds]
        fsync_all(fds)
        return inodes

    assert taken(f.checkpoint_handles()) == [inode]
    assert taken(f.dirty_handles()) == [inode]  # the checkpoint's take left the group commit its own
    assert f.dirty_handles() == [] and f.checkpoint_handles() == []
    f.append(b"cc")
    assert taken(f.dirty_handles()) == [inode]
    assert taken(f.checkpoint_handles()) == [inode]  # and the other way round
    f.append(b"dd")
    f.flush()  # fsyncs for both
    assert f.dirty_handles() == [] and f.checkpoint_handles() == []
    f.mark_all_dirty()  # a failed checkpoint: everything again, for both
    assert len(taken(f.checkpoint_handles())) == 2 and len(taken(f.dirty_handles())) == 2
    f.close()


def test_without_a_checkpoint_taker_both_takes_share_one_set(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 8)
    f.append(b"aaaa")
    fds = f.checkpoint_handles()
    assert len(fds) == 1
    fsync_all(fds)
    assert f.dirty_handles() == []
    f.close()


def test_a_roll_fsyncs_the_closed_segment_only_with_sync_on_roll(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit log's roll fsyncs the segment it closes (recovery trusts a closed segment);
    a derived file's (TimerLog, ready queues) leaves it dirty for the next checkpoint, so the
    writer - the event loop - does not wait for a segment's worth of dirty pages."""
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for sync_on_roll in (True, False):
        d = tmp_path / f"s{sync_on_roll}"
        f = SegmentedFile(d, 8, sync_on_roll=sync_on_roll)
        f.append(b"aaaaaaaa")
        first = os.stat(d / segment_name(0)).st_ino
        synced.clear()
        f.append(b"bb")  # rolls
        assert (first in synced) is sync_on_roll
        fds = f.dirty_handles()
        inodes = [os.fstat(fd).st_ino for fd in fds]
        fsync_all(fds)
        assert (first in inodes) is not sync_on_roll  # else the next checkpoint fsyncs it
        assert f.dirty_handles() == []
        f.close()


def test_failed_write_leaves_no_partial_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = SegmentedFile(tmp_path / "s", 100)
    f.append(b"keep")
    real = os.pwrite

    def short(fd: int, data: bytes, off: int) -> int:
        real(fd, bytes(data)[:3], off)  # half a chunk reaches the file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", short)
    with pytest.raises(DiskFull):
        f.append(b"lost-chunk")
    monkeypatch.setattr(os, "pwrite", real)
    assert f.end == 4
    assert (tmp_path / "s" / segment_name(0)).read_bytes() == b"keep"
    assert f.append(b"next") == 4
    f.close()


def test_other_write_errors_propagate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = SegmentedFile(tmp_path / "s", 100)

    def broken(fd: int, data: bytes, off: int) -> int:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "pwrite", broken)
    with pytest.raises(OSError) as e:
        f.append(b"x")
    assert not isinstance(e.value, DiskFull)
    monkeypatch.undo()
    f.close()


def test_ignores_foreign_files(tmp_path: Path) -> None:
    d = tmp_path / "s"
    d.mkdir()
    (d / "README").write_text("not a segment")
    (d / "123").write_bytes(b"short name")
    f = SegmentedFile(d, 10)
    assert f.bases == [0]
    f.close()


def test_view_is_what_read_returns_and_follows_the_segment_being_written(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 1000, fmt=_FMT)  # with a header: views start past it
    offs = [f.append(bytes([i]) * 100) for i in range(25)]  # 10 per segment: three segments
    assert f.bases == [0, 1000, 2000]
    for off in offs:
        view = f.view(off, off + 100)
        assert view is not None and view.readonly and bytes(view) == f.read(off, 100)
    assert bytes(f.view(1000, 2000)) == f.read(1000, 1000)  # a whole segment
    late = f.append(b"z" * 100)  # past the mapping of the segment being written: mapped again
    assert bytes(f.view(late, late + 100)) == b"z" * 100
    with pytest.raises(OffsetOutOfRange):
        f.view(950, 1050)  # across a segment's end
    with pytest.raises(OffsetOutOfRange):
        f.view(f.end + 1, f.end + 2)
    assert len(f._maps) <= MAP_KEEP
    f.close()
    assert not f._maps
    ro = SegmentedFile(tmp_path / "s", 1000, fmt=_FMT, readonly=True)
    assert ro.view(0, 100) is None, "next to a live daemon: read, never mapped"
    ro.close()


def test_views_of_deleted_and_cut_segments(tmp_path: Path) -> None:
    """A deleted segment is unmapped (its disk space is not held) and a view of it is an error;
    after a cut the bytes that are gone cannot be viewed, what is written again can."""
    f = SegmentedFile(tmp_path / "s", 1000)
    for i in range(12):
        f.append(bytes([i]) * 500)  # six segments of two chunks
    for base in f.bases:
        assert bytes(f.view(base, base + 10)) == bytes([base // 500]) * 10
    assert len(f._maps) == MAP_KEEP and set(f._maps) == set(f.bases[-MAP_KEEP:])
    f.view(0, 10)
    assert f.delete_before(2000) == [0, 1000]
    assert 0 not in f._maps
    with pytest.raises(OffsetOutOfRange):
        f.view(0, 10)
    f.view(4000, 4500)
    f.view(5000, 5500)
    assert f.truncate(4500) == 1500
    with pytest.raises(OffsetOutOfRange):
        f.view(4400, 4600)
    assert bytes(f.view(4000, 4500)) == bytes([8]) * 500
    f.append(b"n" * 100)
    assert bytes(f.view(4500, 4600)) == b"n" * 100
    f.close()


def test_unmap_idle_keeps_only_what_was_viewed_since(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "s", 1000)
    for i in range(6):
        f.append(bytes([i]) * 500)  # three segments
    f.view(0, 10)
    f.view(1000, 1010)
    f.unmap_idle()
    assert set(f._maps) == {0, 1000}, "both viewed since the last call"
    f.view(2000, 2010)
    f.unmap_idle()
    assert set(f._maps) == {2000}
    f.unmap_idle()
    assert not f._maps
    assert bytes(f.view(0, 10)) == bytes(10), "mapped again on demand"
    f.close()
