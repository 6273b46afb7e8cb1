"""Indexer (enqueue-put): one call indexes a batch and returns what it did; a batch that fails
(a full disk) and is retried counts once in the schedule (issue 17, item 4): a write that fails
before anything was indexed raises and changes nothing that counts; one that fails half way
reports the part done (indexed and counted) and the retry goes on from there."""

from __future__ import annotations

from pathlib import Path

import pytest
from delayd.storage import segments
from delayd.storage.errors import DiskFull
from delayd.storage.msgtable import MessageState
from delayd.storage.recovery import open_store
from delayd.storage.schedule import Placed
from delayd.storage.store import Due, NewMessage, Store

from tests.storage.driver import SMALL, Driver

T0 = 1_000_000


def counted(s: Store) -> int:
    return sum(n for _t, n in s.schedule_buckets(s.load_time_ms, s.load_time_ms + 10**9, 10**9))


@pytest.mark.parametrize("fault_at", ["first write", "second segment"])
def test_a_batch_retried_after_a_full_disk_counts_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       fault_at: str) -> None:
    fault = tmp_path / "faults"
    monkeypatch.setattr(segments, "FAULTS", segments.Faults(str(fault)))
    s, _ = open_store(tmp_path / "data", SMALL, lambda: T0)
    try:
        near = s.append_messages([NewMessage("t", b"n%d" % i, T0 + 20 + i) for i in range(30)], T0)
        far = s.append_messages([NewMessage("t", b"f%d" % i, T0 + 10 * SMALL.roll_window_ms + i)
                                 for i in range(20)], T0)
        s.append_cancel(near[0], "t")
        recs, _pos = s.commit.read_records(s.indexed, 1000)
        if fault_at == "first write":
            fault.write_text("enospc")
            with pytest.raises(DiskFull):
                s.indexer.index(recs, T0)
            fault.write_text("")
        else:
            # The batch spans TimerLog segments (16 units each here): the first chunk is written,
            # the disk fills on the second. The retry writes the first chunk's units again.
            real, calls = s.timers.log.append, []

            def append(units: bytes) -> int:
                calls.append(len(units))
                if len(calls) == 2:
                    raise DiskFull("injected: the disk filled between two TimerLog segments")
                return real(units)

            monkeypatch.setattr(s.timers.log, "append", append)
            part = s.indexer.index(recs, T0)
            assert calls[0] > 0 and len(calls) == 2
            monkeypatch.setattr(s.timers.log, "append", real)
            assert 0 < part.consumed < len(recs) and not part.blocked
            assert s.indexed == recs[part.consumed].offset, "indexed up to the part done, no further"
            # The part done counts, once: each message in its slot, but near[0], cancelled before it
            # was indexed (no unit, not counted).
            assert counted(s) == part.consumed - 1
            recs = recs[part.consumed:]  # the retry goes on from there
        if fault_at == "first write":
            assert counted(s) == 0 and s.indexed == 0, "a failed batch changed nothing that counts"
        result = s.indexer.index(recs, T0)  # the retry
        assert result.consumed == len(recs) and not result.blocked
        assert s.scheduled == 49 == counted(s)
        assert s.msgs.flags(near[1]) == Placed.SLOT and s.msgs.flags(far[0]) == Placed.FAR
        # Dispatch everything: every message once, and the schedule empties as it goes.
        clock = [T0]
        drv = Driver(s, clock)
        drv.advance(20 * SMALL.roll_window_ms, checkpoint_every_ms=50)
        assert sorted(d.seq for d in drv.released) == near[1:] + far
        assert s.state(near[0])[0] == MessageState.CANCELLED
        assert s.scheduled == 0 == counted(s)
    finally:
        s.close()


def test_index_result_reports_late_and_blocked(tmp_path: Path) -> None:
    clock = [T0]
    s, _ = open_store(tmp_path / "data", SMALL, lambda: clock[0])
    try:
        drv = Driver(s, clock)
        drv.now = T0 + 100
        drv.dequeue()  # slots up to T0 + 100 are loaded
        [seq] = s.append_messages([NewMessage("t", b"late", T0 + 30)], drv.now)
        recs, _ = s.commit.read_records(s.indexed, 10)
        result = s.indexer.index(recs, drv.now)
        assert (result.consumed, result.blocked, [d.seq for d in Due.rows(result.late)]) == (1, False, [seq])
        assert s.msgs.flags(seq) == Placed.NOWHERE  # in flight, not in the schedule
    finally:
        s.close()
