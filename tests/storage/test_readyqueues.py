"""Every topic's ready queue: the per-segment figures retention decides by (lowest commit
offset, latest release), derived from the blocks of units the queues keep, against the same
figures read straight from each segment's units."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from delayd.storage.readyqueue import UNIT, UNIT_SIZE, ReadyQueue, bounds_py
from delayd.storage.readyqueues import PIN_BLOCK, ReadyQueues


def from_files(directory: Path, segment_units: int) -> list[tuple[int, int, int, int]]:
    """(first, end, lowest commit offset, latest release) of each segment holding units, from its units."""
    q = ReadyQueue(directory, segment_units, readonly=True)
    out = []
    for base in q.files.bases:
        end = q.files.segment_end(base)
        if end > base:
            lo, hi = bounds_py(bytes(q.files.read(base, end - base)))
            out.append((base // UNIT_SIZE, end // UNIT_SIZE, lo, hi))
    q.files.close()
    return out


def release(qs: ReadyQueues, rng: random.Random, count: int) -> None:
    """Append `count` units in batches of random sizes, random offsets and release times."""
    while count > 0:
        n = min(count, rng.randint(1, 3000))
        qs.append_units("t", b"".join(UNIT.pack(rng.randrange(1 << 40), 100, 0, 5, rng.randrange(1 << 41), 1)
                                      for _ in range(n)))
        count -= n


@pytest.mark.parametrize("segment_units", [3, 5_000, 10_000])
def test_segment_figures_from_blocks_match_the_units(tmp_path: Path, segment_units: int) -> None:
    # 5,000 and 10,000 units a segment are not multiples of a block: each segment's last block is shorter.
    assert segment_units < PIN_BLOCK or segment_units % PIN_BLOCK
    rng = random.Random(segment_units)
    total = 300 if segment_units == 3 else 3 * segment_units + 123
    qs = ReadyQueues(tmp_path, segment_units)
    release(qs, rng, total // 3)
    assert list(qs.segments("t")) == from_files(tmp_path / "t", segment_units)  # learnt from the files
    release(qs, rng, total - total // 3)  # kept current by the appends
    assert list(qs.segments("t")) == from_files(tmp_path / "t", segment_units)
    assert qs.delete_before("t", 2 * segment_units)
    assert list(qs.segments("t")) == from_files(tmp_path / "t", segment_units)
    assert list(qs.segments("t"))[0][0] == 2 * segment_units
    # The deleted segments' blocks went with them: what the units left pin is theirs alone.
    assert qs.pin("t", 2 * segment_units, 0) == min(lo for _f, _e, lo, _hi in from_files(tmp_path / "t", segment_units))
    qs.close()
    qs = ReadyQueues(tmp_path, segment_units)
    assert list(qs.segments("t")) == from_files(tmp_path / "t", segment_units)
    qs.close()


def test_a_changed_segment_size_keeps_figures_on_the_safe_side(tmp_path: Path) -> None:
    # Segments written 5,000 units long, read with blocks tiling 4,000-unit segments: a block
    # across two segments counts in both, so no segment looks older or further along than it is.
    rng = random.Random(7)
    qs = ReadyQueues(tmp_path, 5_000)
    release(qs, rng, 17_000)
    qs.close()
    qs = ReadyQueues(tmp_path, 4_000)
    got, want = list(qs.segments("t")), from_files(tmp_path / "t", 5_000)
    assert [(f, e) for f, e, _lo, _hi in got] == [(f, e) for f, e, _lo, _hi in want]
    for (_f, _e, lo, hi), (_wf, _we, want_lo, want_hi) in zip(got, want, strict=True):
        assert lo <= want_lo and hi >= want_hi
    assert got != want  # (the case is really one of blocks across segments)
    qs.close()


def test_a_truncate_takes_its_units_out_of_the_figures(tmp_path: Path) -> None:
    # Units cut off the end (a cut of the commit log took their RELEASE records) no longer count:
    # the lowest offset left is that of the units kept, not of the ones cut.
    qs = ReadyQueues(tmp_path, 3)
    qs.append("t", [(1000 + i, 100, 0, 5, 50 + i, i) for i in range(5)])
    qs.append("t", [(10 + i, 100, 0, 5, 90 + i, i) for i in range(2)])
    assert list(qs.segments("t"))[1][2:] == (10, 90) and qs.pin("t", 0, 0) == 10
    assert qs.truncate("t", 5) == 2
    assert list(qs.segments("t")) == from_files(tmp_path / "t", 3)
    assert list(qs.segments("t"))[-1][2:] == (1003, 54) and qs.pin("t", 0, 0) == 1000
    assert qs.pin("t", 3, 10**6) == 1003  # (block 0 acked and released before the cutoff)
    qs.close()
