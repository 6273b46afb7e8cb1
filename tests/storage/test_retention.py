"""Retention: which segments may go. A delivered message kept in a ready queue pins the commit-log
segment its record is in, also when that queue is a single segment retention does not open."""

from __future__ import annotations

from pathlib import Path

from delayd.storage.recovery import open_store
from delayd.storage.store import NewMessage

from tests.storage.driver import SMALL, Driver, delivered_seqs, no_fsync

T0 = 1_000_000


def fill(topic_of_first: str, tmp_path: Path) -> tuple[list[int], list[int]]:
    """One message delivered early (its record in commit segment 0), then enough traffic on
    another topic, delivered and never needed, to fill later commit segments; then time passes.
    Returns (commit segments before retention, after)."""
    clock = [T0]
    with no_fsync():
        s, _ = open_store(tmp_path / "data", SMALL, lambda: clock[0])
        drv = Driver(s, clock)
        [first] = s.append_messages([NewMessage(topic_of_first, b"kept", T0 + 5)], T0)
        drv.advance(20)
        assert delivered_seqs(s) == [first]
        for _ in range(40):
            s.append_messages([NewMessage("noise", b"n" * 200, clock[0] + 5) for _n in range(3)], clock[0])
            drv.advance(20)
        drv.advance(20 * SMALL.roll_window_ms, checkpoint_every_ms=50)
        before = s.commit.files.bases
        # Every noise message acked by its group, and no time kept after release.
        s.retain(clock[0], retention_ms=0, needed={"noise": s.ready.end("noise")})
        after = s.commit.files.bases
        s.close()
    return before, after


def test_a_ready_unit_in_a_single_segment_queue_pins_its_commit_segment(tmp_path: Path) -> None:
    before, after = fill("orders", tmp_path)
    assert len(before) > 3
    assert after[0] == 0, "the commit segment of a retained ready unit was deleted"


def test_without_that_unit_the_old_segments_go(tmp_path: Path) -> None:
    before, after = fill("noise", tmp_path)
    assert len(before) > 3 and after[0] > 0
