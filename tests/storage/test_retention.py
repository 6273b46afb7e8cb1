"""Retention: which segments may go. A ready unit some consumer group has not acked, or one
released within `retention_ms`, pins the commit-log segment its record is in, also when its queue
is a single segment retention does not open; an acked one does not, even in the segment still
being written (a topic gone quiet must not keep the whole log)."""

from __future__ import annotations

from pathlib import Path

from delayd.storage.recovery import open_store
from delayd.storage.store import NewMessage

from tests.storage.driver import SMALL, Driver, delivered_seqs, no_fsync

T0 = 1_000_000
KEEP = 10**9  # a retention_ms that keeps everything released


def fill(topic_of_first: str, tmp_path: Path, needed_first: int | None = None, retention_ms: int = 0,
         more_first: int = 0) -> tuple[list[int], list[int], int]:
    """One message delivered early (its record in commit segment 0), then enough traffic on
    another topic, delivered and never needed, to fill later commit segments; then time passes.
    `needed_first`: the first topic's group's floor (None: no group); `more_first`: messages of
    the first topic released after retention. Returns (commit segments before retention,
    after, where a new group of the first topic starting at the earliest begins)."""
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
        # Every noise message acked by its group.
        needed = {"noise": s.ready.end("noise")}
        if needed_first is not None:
            needed[topic_of_first] = needed_first
        s.retain(clock[0], retention_ms=retention_ms, needed=needed)
        after = s.commit.files.bases
        if more_first:
            s.append_messages([NewMessage(topic_of_first, b"later", clock[0] + 5) for _ in range(more_first)], clock[0])
            drv.advance(20 * SMALL.roll_window_ms, checkpoint_every_ms=50)
            assert s.ready.end(topic_of_first) == 1 + more_first
        earliest = s.earliest(topic_of_first)
        s.close()
    return before, after, earliest


def test_a_ready_unit_within_retention_pins_its_commit_segment(tmp_path: Path) -> None:
    before, after, earliest = fill("orders", tmp_path, retention_ms=KEEP)
    assert len(before) > 3
    assert after[0] == 0, "the commit segment of a retained ready unit was deleted"
    assert earliest == 0


def test_a_ready_unit_a_group_has_not_acked_pins_its_commit_segment(tmp_path: Path) -> None:
    before, after, earliest = fill("orders", tmp_path, needed_first=0)
    assert len(before) > 3 and after[0] == 0
    assert earliest == 0


def test_an_acked_unit_of_a_quiet_topic_does_not_pin_the_log(tmp_path: Path) -> None:
    # Its group acked it and retention_ms passed: the queue's only segment (still being written)
    # keeps the unit, but not its record; a new group starts after it, not at a record that is gone.
    before, after, earliest = fill("orders", tmp_path, needed_first=1)
    assert len(before) > 3 and after[0] > 0
    assert earliest == 1


def test_a_topic_without_groups_pins_nothing_after_retention(tmp_path: Path) -> None:
    before, after, earliest = fill("orders", tmp_path)
    assert len(before) > 3 and after[0] > 0
    assert earliest == 1


def test_a_new_group_gets_what_came_after_the_gone_records(tmp_path: Path) -> None:
    # Released after retention ran, in the same block of units: their records are all there.
    _before, after, earliest = fill("orders", tmp_path, needed_first=1, more_first=3)
    assert after[0] > 0 and earliest == 1


def test_without_that_unit_the_old_segments_go(tmp_path: Path) -> None:
    before, after, _earliest = fill("noise", tmp_path)
    assert len(before) > 3 and after[0] > 0
