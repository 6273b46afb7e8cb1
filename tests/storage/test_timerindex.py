"""TimerIndex: TimerLog + wheel. Unit tests, then a model test: whatever is scheduled and
cancelled, walking the slots in time order yields exactly the model's due sets, across
reopen, crash recovery (strip_after + truncate) and a wheel rebuilt from the TimerLog."""

from __future__ import annotations

import copy
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from delayd.storage.errors import Insane
from delayd.storage.segments import SEGMENT_HEADER_SIZE
from delayd.storage.timerindex import Entry, TimerIndex
from delayd.storage.timerlog import DAMAGED, NO_POS, UNIT_SIZE, UnitMagic
from delayd.storage.timerwheel import Slot
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.storage.driver import no_fsync

P, SLOTS = 10, 16  # precision_ms, slot_count: a span of 160 ms


def entry(fire: int, seq: int, magic: UnitMagic = UnitMagic.DEFAULT) -> Entry:
    return Entry(fire, magic, seq * 100, 100, 7, seq)


def open_index(d: Path, segment_units: int = 3) -> TimerIndex:
    return TimerIndex.open(d, P, SLOTS, segment_units)


def test_add_links_units_into_their_slot_chain(tmp_path: Path) -> None:
    ix = open_index(tmp_path)
    ix.add([entry(1005, 1), entry(1012, 2), entry(1009, 3)], now_ms=1000)
    assert ix.wheel.get(1000) == Slot(1000, 0, 2 * UNIT_SIZE, 2, UnitMagic.DEFAULT)
    assert ix.wheel.get(1010) == Slot(1010, UNIT_SIZE, UNIT_SIZE, 1, UnitMagic.DEFAULT)
    assert [u.seq for u in ix.due(1000)] == [1, 3]  # oldest first
    u = ix.due(1010)[0]
    assert (u.prev_pos, u.enqueue_time, u.delay, u.fire_time, u.commit_offset, u.commit_size,
            u.topic_hash) == (NO_POS, 1000, 12, 1012, 200, 100, 7)
    assert ix.due(1020) == []
    ix.close()


def test_batches_split_at_segment_ends_and_keep_chains(tmp_path: Path) -> None:
    ix = open_index(tmp_path, segment_units=2)
    ix.add([entry(1000 + i % 3, i) for i in range(7)], now_ms=1000)
    assert len(ix.log.files.bases) == 4
    assert [u.seq for u in ix.due(1000)] == list(range(7))
    ix.close()


def test_delete_marker_drops_the_same_seq_in_the_same_slot_only(tmp_path: Path) -> None:
    ix = open_index(tmp_path)
    ix.add([entry(1001, 1), entry(1002, 2), entry(1021, 3)], 1000)
    ix.add([entry(1003, 1, UnitMagic.DELETE), entry(1004, 3, UnitMagic.DELETE)], 1000)
    assert ix.wheel.get(1000).magic == UnitMagic.DEFAULT | UnitMagic.DELETE
    assert [u.seq for u in ix.due(1000)] == [2]
    assert [u.seq for u in ix.due(1020)] == [3]  # its marker went to another slot
    ix.close()


def test_roll_units_are_due_like_any_other(tmp_path: Path) -> None:
    ix = open_index(tmp_path)
    ix.add([entry(1001, 1, UnitMagic.ROLL), entry(1002, 2)], 1000)
    assert [(u.seq, u.magic) for u in ix.due(1000)] == [(1, UnitMagic.ROLL), (2, UnitMagic.DEFAULT)]
    ix.close()


def test_a_chain_that_leaves_its_slot_is_insane(tmp_path: Path) -> None:
    ix = open_index(tmp_path)
    ix.add([entry(1001, 1), entry(1011, 2)], 1000)
    # Damage: point slot 1000 at the unit of slot 1010.
    ix.wheel.put(1000, 0, UNIT_SIZE, 1, 1)
    with pytest.raises(Insane):
        ix.due(1000)
    ix.close()


def test_safe_to_write_guards_the_lap_not_yet_read(tmp_path: Path) -> None:
    ix = open_index(tmp_path)
    span = P * SLOTS
    assert ix.safe_to_write(1000 + span - 1, 1000)
    assert not ix.safe_to_write(1000 + span, 1000)
    ix.close()


def test_check_slots_counts_impossible_slots(tmp_path: Path) -> None:
    ix = open_index(tmp_path)
    ix.add([entry(1001, 1), entry(1011, 2), entry(1021, 3)], 1000)
    assert ix.check_slots() == 0
    ix.wheel.put(1010, 0, 10 * UNIT_SIZE, 1, 1)  # past the TimerLog end
    ix.wheel.put(1020, 0, 7, 1, 1)  # not unit-aligned
    assert ix.check_slots() == 2
    ix.wheel.put(1000, 0, 0, -1, 1)  # a negative count (read as empty: its chain would be lost)
    assert ix.check_slots() == 3
    ix.close()


def test_strip_after_unlinks_the_tail(tmp_path: Path) -> None:
    ix = open_index(tmp_path)
    ix.add([entry(1001, 1), entry(1011, 2)], 1000)
    t = ix.log.end
    ix.add([entry(1002, 3), entry(1021, 4), entry(1003, 5)], 1000)
    assert ix.strip_after(t) == 3
    ix.log.truncate(t)
    assert [u.seq for u in ix.due(1000)] == [1]
    assert [u.seq for u in ix.due(1010)] == [2]
    assert ix.due(1020) == [] and ix.wheel.raw(1020).num == 0
    ix.add([entry(1004, 6)], 1000)
    assert [u.seq for u in ix.due(1000)] == [1, 6]
    ix.close()


def test_strip_after_walks_the_tail_read_once_and_refuses_a_chain_through_damage(tmp_path: Path) -> None:
    ix = open_index(tmp_path)
    ix.add([entry(1001, 1), entry(1011, 2)], 1000)
    t = ix.log.end
    ix.add([entry(1002, 3), entry(1021, 4), entry(1003, 5)], 1000)  # across a segment's end (3 units)
    assert list(ix.log.prev_positions(t)) == [0, NO_POS, t]
    ix.log.files.write_at(t, struct.pack("<I", 0))  # seq 3's unit, in slot 1000's chain: no size
    assert list(ix.log.prev_positions(t)) == [DAMAGED, NO_POS, t]
    with pytest.raises(Insane):
        ix.strip_after(t)  # (recovery then rebuilds the wheel from the units that check out)
    ix.close()


def test_rebuild_from_the_timerlog(tmp_path: Path) -> None:
    ix = open_index(tmp_path)
    ix.add([entry(1001, 1), entry(1011, 2), entry(1002, 3)], 1000)
    ix.add([entry(1003, 1, UnitMagic.DELETE), entry(1031, 4)], 1000)
    before = {t: ix.wheel.get(t) for t in range(1000, 1040, P)}
    ix.wheel.reset()
    assert ix.rebuild(ix.log.scan(0), 1010) == 2  # slot 1000 is behind the read time
    assert ix.due(1000) == []
    for t in (1010, 1020, 1030):
        assert ix.wheel.get(t) == before[t]
    assert ix.rebuild(ix.log.scan(0), 1000) == 5
    assert [u.seq for u in ix.due(1000)] == [3]
    ix.close()


# ------------------------------------------------------------------------------ the model test

class TimerIndexModel(RuleBasedStateMachine):
    """The model: slot time -> [(seq, magic)] in write order. Reading a slot applies DELETE."""

    def __init__(self) -> None:
        super().__init__()
        self.fsync_off = no_fsync()  # durability is not what this checks; fsyncs only slow it
        self.fsync_off.__enter__()
        self.dir = Path(tempfile.mkdtemp(prefix="tix-"))
        self.ix = open_index(self.dir)
        self.cursor = 10_000  # the next slot to walk
        self.durable_cursor = self.cursor  # the read time of the last "checkpoint"
        self.now = 10_000
        self.model: dict[int, list[tuple[int, UnitMagic]]] = {}
        self.next_seq = 1
        self.saved: tuple[int, int, dict[int, list[tuple[int, UnitMagic]]]] | None = None

    def teardown(self) -> None:
        try:
            self.ix.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.fsync_off.__exit__(None, None, None)

    def _fire(self, frac: float) -> int:
        # Any time the wheel may take: from the reader up to one span past the durable read time.
        lo, hi = self.cursor, self.durable_cursor + P * SLOTS - 1
        return lo + int(frac * (hi - lo))

    @precondition(lambda self: self.cursor < self.durable_cursor + P * SLOTS)
    @rule(fracs=st.lists(st.tuples(st.floats(0, 1), st.sampled_from([UnitMagic.DEFAULT, UnitMagic.ROLL])),
                         min_size=1, max_size=12))
    def schedule(self, fracs: list[tuple[float, UnitMagic]]) -> None:
        entries = []
        for frac, magic in fracs:
            fire = self._fire(frac)
            assert self.ix.safe_to_write(fire, self.durable_cursor)
            entries.append(entry(fire, self.next_seq, magic))
            self.model.setdefault(self.ix.wheel.slot_time(fire), []).append((self.next_seq, magic))
            self.next_seq += 1
        self.ix.add(entries, self.now)

    @precondition(lambda self: self.cursor < self.durable_cursor + P * SLOTS
                  and any(t >= self.cursor and v for t, v in self.model.items()))
    @rule(pick=st.integers(0, 10_000), same_slot=st.booleans())
    def cancel(self, pick: int, same_slot: bool) -> None:
        pending = sorted((t, seq) for t, v in self.model.items() if t >= self.cursor for seq, _m in v)
        t, seq = pending[pick % len(pending)]
        fire = t + pick % P
        if not same_slot:  # a marker in another slot must not touch the message
            fire = self._fire((pick % 97) / 97)
        self.ix.add([entry(fire, seq, UnitMagic.DELETE)], self.now)
        self.model.setdefault(self.ix.wheel.slot_time(fire), []).append((seq, UnitMagic.DELETE))

    @rule(n=st.integers(1, 20))
    def walk(self, n: int) -> None:
        for _ in range(n):
            t = self.cursor
            got = [(u.seq, u.magic) for u in self.ix.due(t)]
            for u in self.ix.due(t):
                assert self.ix.wheel.slot_time(u.fire_time) == t
            units = self.model.get(t, [])
            dead = {s for s, m in units if m & UnitMagic.DELETE}
            assert got == [(s, m) for s, m in units if not m & UnitMagic.DELETE and s not in dead]
            self.cursor += P
            self.now = max(self.now, self.cursor)

    @rule()
    def checkpoint(self) -> None:
        self.ix.flush()
        self.durable_cursor = self.cursor
        self.saved = (self.ix.log.end, self.cursor, copy.deepcopy(self.model))

    @rule()
    def reopen(self) -> None:
        self.ix.flush()
        self.ix.close()
        self.ix = open_index(self.dir)

    @precondition(lambda self: self.saved is not None)
    @rule()
    def crash_and_recover(self) -> None:
        # What Store.recover does with a checkpoint: drop the units written after it.
        assert self.saved is not None
        self.ix.close()
        self.ix = open_index(self.dir)
        end, cursor, model = self.saved
        self.ix.strip_after(end)
        self.ix.log.truncate(end)
        self.cursor, self.model = cursor, copy.deepcopy(model)

    @rule()
    def rebuild_wheel(self) -> None:
        # From the durable read time: slots walked since may have to be walked again after a crash.
        self.ix.rebuild(self.ix.log.scan(self.ix.log.start), self.durable_cursor)

    @invariant()
    def slots_are_sane(self) -> None:
        assert self.ix.check_slots() == 0


TimerIndexModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_timerindex_model = TimerIndexModel.TestCase


def test_rebuild_links_around_damaged_units_and_stray_pointers(tmp_path: Path) -> None:
    ix = open_index(tmp_path, segment_units=16)
    ix.add([entry(1001, i) for i in range(5)] + [entry(1011, 9)], 1000)
    seg = tmp_path / "timerlog" / f"{0:020d}"
    ix.close()
    data = bytearray(seg.read_bytes())
    h = SEGMENT_HEADER_SIZE  # the units start after the segment's header
    data[h + 2 * UNIT_SIZE + 12:h + 2 * UNIT_SIZE + 16] = bytes(4)  # unit of seq 2: unreadable
    data[h + 4 * UNIT_SIZE + 4:h + 4 * UNIT_SIZE + 12] = (5 * UNIT_SIZE).to_bytes(8, "little", signed=True)[:8]
    seg.write_bytes(bytes(data))  # ... and seq 4's prev_pos is flipped (points past itself)
    ix = open_index(tmp_path, segment_units=16)
    with pytest.raises(Insane):
        ix.due(1000)
    damaged: list[int] = []
    assert ix.rebuild(ix.log.scan(0, damaged=damaged), 1000) == 4
    assert damaged == [2 * UNIT_SIZE, 4 * UNIT_SIZE]  # prev_pos past itself is damage too
    assert [u.seq for u in ix.due(1000)] == [0, 1, 3]
    assert [u.seq for u in ix.due(1010)] == [9]
    assert ix.check_slots() == 0
    ix.close()
