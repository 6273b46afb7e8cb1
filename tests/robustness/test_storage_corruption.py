"""Damage a stopped data directory, reopen it, and check that no acknowledged message is lost,
nothing corrupt is served, recovery says what it found, and `storage.inspect.check` saw the
fault before the repair (RocketMQ's testStateAndRecover, one fault at a time).

Every test starts from the same directory: a few hundred messages, some delivered, some
pending, some rolled (due beyond the roll window), some cancelled; two checkpoints were taken
and more was produced after the last one, then the store stopped without a final checkpoint.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from delayd.storage import inspect
from delayd.storage.commitlog import CommitLog, Record, RecordFlag, RecordType
from delayd.storage.msgtable import MessageState, MessageTable
from delayd.storage.recovery import RecoveryReport
from delayd.storage.recovery import open_store as open_data_dir
from delayd.storage.segments import SEGMENT_HEADER_SIZE
from delayd.storage.store import NewMessage, StoreConfig
from delayd.storage.timerlog import UNIT_SIZE
from delayd.storage.timerwheel import HEADER as WHEEL_HEADER
from delayd.storage.timerwheel import SLOT, SLOT_SIZE

from tests.storage.driver import Driver, delivered_seqs, drain, no_fsync, ready_units, topic_of
from tests.support.daemon import files_open

T0 = 1_000_000
CFG = StoreConfig(precision_ms=10, roll_window_ms=200, commit_segment_bytes=8192, timerlog_segment_units=64,
                  ready_segment_units=32, msgtable_segment_entries=128)


@dataclass
class Scenario:
    dir: Path
    clock: list[int]
    acked: dict[int, int] = field(default_factory=dict)  # seq -> deliver_at, produce answered
    cancelled: set[int] = field(default_factory=set)  # cancel answered
    delivered_before: set[int] = field(default_factory=set)
    cp_indexed: int = 0  # C of the last checkpoint
    cp_read_time: int = 0
    unreadable: int = 0  # after recover_and_finish: records dispatch found damaged

    def records(self) -> list[Record]:
        log = CommitLog(self.dir / "commitlog", CFG.commit_segment_bytes)
        try:
            return list(log.scan(0))
        finally:
            log.close()

    def pending(self) -> set[int]:
        return set(self.acked) - self.cancelled - self.delivered_before


def build(d: Path) -> Scenario:
    rng = random.Random(43)
    sc = Scenario(d, [T0])
    s, _rep = open_data_dir(d, CFG, lambda: sc.clock[0])
    drv = Driver(s, sc.clock)

    def produce(n: int) -> None:
        msgs = [NewMessage(rng.choice(["orders", "mail"]), b"body-%d" % rng.randrange(10**9),
                           drv.now + rng.randrange(-20, 1500), tag=rng.choice([None, "a"]),
                           key=f"k{rng.randrange(10**6)}") for _ in range(n)]
        seqs = s.append_messages(msgs, drv.now)
        s.flush_commit()
        sc.acked.update({q: m.deliver_at for q, m in zip(seqs, msgs, strict=True)})

    def cancel_some(k: int) -> None:
        for seq in rng.sample(sorted(sc.acked), k):
            if s.state(seq)[0] == MessageState.SCHEDULED:
                s.append_cancel(seq, topic_of(s, seq))
                s.flush_commit()
                sc.cancelled.add(seq)

    for _ in range(25):
        produce(10)
        cancel_some(1)
        drv.advance(20)
    drv.checkpoint()
    drv.advance(30, checkpoint_every_ms=10**9)
    drv.checkpoint()
    sc.cp_indexed, sc.cp_read_time = s.indexed, drv.read_time()
    # After the last checkpoint: more produce, cancels, deliveries and rolls, then stop.
    for _ in range(4):
        produce(10)
        cancel_some(1)
        drv.advance(15, checkpoint_every_ms=10**9)
    produce(5)
    sc.delivered_before = set(delivered_seqs(s))
    s.close()  # no final checkpoint: the state a kill -9 after the last one leaves
    assert len(sc.delivered_before) > 50 and len(sc.pending()) > 100
    return sc


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    with no_fsync():
        return build(tmp_path_factory.mktemp("pristine") / "data")


@pytest.fixture
def sc(pristine: Scenario, tmp_path: Path) -> Scenario:
    d = tmp_path / "data"
    shutil.copytree(pristine.dir, d)
    return Scenario(d, list(pristine.clock), dict(pristine.acked), set(pristine.cancelled),
                    set(pristine.delivered_before), pristine.cp_indexed, pristine.cp_read_time)


def check_finds(sc: Scenario, *needles: str, config: StoreConfig = CFG) -> inspect.CheckReport:
    rep = inspect.check(sc.dir, config)
    text = rep.text()
    for n in needles:
        assert n in text, f"check() did not report {n!r}:\n{text}"
    assert not rep.ok
    return rep


def recover_and_finish(sc: Scenario, *, may_lose: frozenset[int] = frozenset(),
                       config: StoreConfig = CFG, damaged_units_left: int = 0) -> RecoveryReport:
    s, rep = open_data_dir(sc.dir, config, lambda: sc.clock[0])
    drv = Driver(s, sc.clock)
    with no_fsync():
        drain(drv, max([sc.clock[0], *sc.acked.values()]) + 4 * config.roll_window_ms)
    sc.unreadable = drv.unreadable
    counts = collections.Counter(delivered_seqs(s))
    dup = sorted(q for q, n in counts.items() if n > 1)
    assert not dup, f"delivered twice: {dup}"
    for seq in sc.acked:
        if seq in sc.cancelled:
            assert counts[seq] == 0, f"cancelled {seq} delivered"
        elif seq not in may_lose:
            assert counts[seq] == 1, f"acknowledged message {seq} lost ({rep.line()})"
    # Nothing corrupt is served: every ready unit points at an intact record of its message,
    # and none is released before its time.
    for units in ready_units(s).values():
        for u in units:
            rec = s.read_record(u.commit_offset, u.commit_size)
            assert rec.seq == u.seq and rec.deliver_at == u.deliver_at <= u.released_at
    s.close()
    after = inspect.check(sc.dir, config)
    assert after.damaged_slots == after.damaged_ready_units == 0, after.text()
    assert after.damaged_units == damaged_units_left, after.text()
    return rep


def last_segment(sc: Scenario) -> Path:
    return sorted((sc.dir / "commitlog").iterdir())[-1]


def flip(path: Path, at: int, mask: int = 0x20) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes((b ^ mask,)))


# ------------------------------------------------------------------------------ the baseline

def test_a_clean_stop_checks_ok_and_loses_nothing(sc: Scenario) -> None:
    rep = inspect.check(sc.dir, CFG)
    assert rep.ok, rep.text()
    assert rep.commit_records == len(sc.records()) and rep.wheel_units > 0 and rep.ready_units > 0
    r = recover_and_finish(sc)
    assert r.checkpoint == "ok" and r.wheel == "ok" and r.commit.truncated_bytes == 0
    assert r.units_stripped > 0  # units written after the checkpoint were redone


# ------------------------------------------------------------------------------ commit log

def last_batch(sc: Scenario) -> list[Record]:
    """The records of the last produce: one atomic write, marked CONTINUED but for the last."""
    recs = sc.records()
    batch = [recs[-1]]
    while recs[-len(batch) - 1].flags & RecordFlag.CONTINUED:
        batch.insert(0, recs[-len(batch) - 1])
    assert all(r.type == RecordType.MESSAGE for r in batch) and len(batch) == 5
    return batch


def test_torn_commit_log_tail(sc: Scenario) -> None:
    batch = last_batch(sc)
    last = batch[-1]
    seg = last_segment(sc)
    os.truncate(seg, seg.stat().st_size - last.size // 2)
    check_finds(sc, "torn or corrupt tail")
    # The torn write was never acknowledged: its whole batch goes, nothing before it.
    rep = recover_and_finish(sc, may_lose=frozenset(r.seq for r in batch))
    assert rep.commit.truncated_bytes == sum(r.size for r in batch) - last.size // 2
    assert rep.commit.skipped_records == 0


def test_flipped_byte_in_the_last_record(sc: Scenario) -> None:
    batch = last_batch(sc)
    seg = last_segment(sc)
    flip(seg, seg.stat().st_size - 3)  # in its body
    check_finds(sc, "torn or corrupt tail")
    rep = recover_and_finish(sc, may_lose=frozenset(r.seq for r in batch))
    assert rep.commit.truncated_bytes == sum(r.size for r in batch)


def pick_mid_segment(sc: Scenario, after_checkpoint: bool) -> Record:
    """A pending message's own record (not rolled since), inside a segment, due after the restart."""
    table = MessageTable(sc.dir / "msgtable", CFG.msgtable_segment_entries)
    current = {seq: table.get(seq)[1] for seq in sc.acked}
    table.close()
    recs = sc.records()
    bases = sorted(int(p.name) for p in (sc.dir / "commitlog").iterdir())
    for i, r in enumerate(recs[1:-1], 1):
        same_segment = recs[i - 1].offset >= max(b for b in bases if b <= r.offset) and \
            recs[i + 1].offset + recs[i + 1].size <= min([b for b in bases if b > r.offset] or [1 << 62])
        if (r.type == RecordType.MESSAGE and same_segment and r.seq in sc.pending() and current[r.seq] == r.offset
                and (r.offset >= sc.cp_indexed) == after_checkpoint and r.deliver_at > sc.cp_read_time + 50):
            return r
    raise AssertionError("no candidate record")


def test_flipped_byte_mid_segment_after_the_checkpoint(sc: Scenario) -> None:
    victim = pick_mid_segment(sc, after_checkpoint=True)
    base = max(int(p.name) for p in (sc.dir / "commitlog").iterdir() if int(p.name) <= victim.offset)
    flip(sc.dir / "commitlog" / f"{base:020d}", victim.offset - base + victim.size - 2)
    rep = check_finds(sc, f"damaged record at offset {victim.offset}")
    assert rep.damaged_records == 1
    r = recover_and_finish(sc, may_lose=frozenset({victim.seq}))
    assert r.commit.skipped_records == 1 and r.commit.skipped_bytes == victim.size
    assert r.commit.truncated_bytes == 0


def test_flipped_byte_mid_segment_before_the_checkpoint(sc: Scenario) -> None:
    # Indexed already, so recovery does not rescan it: dispatch finds the damage instead, and
    # must drop that one message rather than serve it or stop.
    victim = pick_mid_segment(sc, after_checkpoint=False)
    base = max(int(p.name) for p in (sc.dir / "commitlog").iterdir() if int(p.name) <= victim.offset)
    flip(sc.dir / "commitlog" / f"{base:020d}", victim.offset - base + victim.size - 2)
    check_finds(sc, f"damaged record at offset {victim.offset}")
    recover_and_finish(sc, may_lose=frozenset({victim.seq}))
    assert sc.unreadable == 1  # found and dropped at dispatch, the pipeline kept going


# ------------------------------------------------------------------------------ the wheel

def test_deleted_wheel_file(sc: Scenario) -> None:
    os.unlink(sc.dir / "timerwheel")
    check_finds(sc, "TimerWheel: file missing")
    rep = recover_and_finish(sc)
    assert rep.wheel == "rebuilt (missing)"


def pending_slots(sc: Scenario) -> list[tuple[int, int, int, int, int, int]]:
    slots = [s for s in inspect.iter_slots(sc.dir / "timerwheel", CFG.slot_count) if s[1] >= sc.cp_read_time]
    assert len(slots) > 10
    return slots


def write_slot(sc: Scenario, idx: int, *fields: int) -> None:
    with open(sc.dir / "timerwheel", "r+b") as f:
        f.seek(WHEEL_HEADER.size + idx * SLOT_SIZE)
        f.write(SLOT.pack(*fields))


def test_damaged_wheel_slot_with_impossible_fields(sc: Scenario) -> None:
    idx, t, first, last, num, magic = pending_slots(sc)[3]
    write_slot(sc, idx, t, first, last + 7, num, magic)  # not on a unit boundary
    check_finds(sc, f"slot {idx}")
    rep = recover_and_finish(sc)
    assert rep.wheel == "rebuilt (damaged slots)"


def test_damaged_wheel_slot_pointing_into_another_chain(sc: Scenario) -> None:
    slots = pending_slots(sc)
    idx, t, first, _last, num, magic = slots[2]
    other_last = slots[5][3]
    write_slot(sc, idx, t, first, other_last, num, magic)  # plausible fields, wrong chain
    check_finds(sc, f"slot {idx} (time {t})", "not in this slot")
    recover_and_finish(sc)  # found when the slot is walked; the wheel is rebuilt from the TimerLog


def test_flipped_slot_time_reads_as_another_lap(sc: Scenario) -> None:
    idx, t, first, last, num, magic = pending_slots(sc)[4]
    write_slot(sc, idx, t ^ (1 << 20), first, last, num, magic)
    check_finds(sc, f"slot {idx} is impossible")
    rep = recover_and_finish(sc)
    assert rep.wheel.startswith("rebuilt")


def test_wrong_geometry_wheel_is_rebuilt(sc: Scenario) -> None:
    other = dataclasses.replace(CFG, precision_ms=20)
    check_finds(sc, "geometry mismatch", config=other)
    rep = recover_and_finish(sc, config=other)
    assert "GeometryMismatch" in rep.wheel
    assert any(p.name.startswith("timerwheel.bad-") for p in sc.dir.iterdir())


# ------------------------------------------------------------------------------ the checkpoint

def test_corrupt_checkpoint_falls_back_to_the_previous_one(sc: Scenario) -> None:
    flip(sc.dir / "checkpoint", 40)
    check_finds(sc, "checkpoint: ChecksumMismatch")
    rep = recover_and_finish(sc)
    assert rep.checkpoint.startswith("fell back to checkpoint.prev")


def test_both_checkpoints_corrupt_means_a_full_rescan(sc: Scenario) -> None:
    flip(sc.dir / "checkpoint", 40)
    with open(sc.dir / "checkpoint.prev", "r+b") as f:
        f.write(b"JUNK")
    check_finds(sc, "checkpoint: ChecksumMismatch", "checkpoint.prev: BadMagic")
    rep = recover_and_finish(sc)
    assert rep.checkpoint.startswith("rejected") and "full rescan" in rep.checkpoint


def test_deleted_checkpoint_and_previous(sc: Scenario) -> None:
    os.unlink(sc.dir / "checkpoint")
    os.unlink(sc.dir / "checkpoint.prev")
    check_finds(sc, "no valid checkpoint")
    rep = recover_and_finish(sc)
    assert rep.checkpoint == "none" and rep.wheel == "rebuilt (no checkpoint)"


# ------------------------------------------------------------------------------ derived files

def test_deleted_msgtable_directory(sc: Scenario) -> None:
    shutil.rmtree(sc.dir / "msgtable")
    check_finds(sc, "message table: directory missing")
    rep = recover_and_finish(sc)
    assert "full rescan" in rep.checkpoint


def test_truncated_timerlog(sc: Scenario) -> None:
    segs = sorted((sc.dir / "timerlog").iterdir())
    assert len(segs) > 2
    # Cut into the middle of a unit of an older segment and drop every later one.
    for p in segs[2:]:
        p.unlink()
    os.truncate(segs[1], segs[1].stat().st_size // 2 + 3)
    check_finds(sc, "TimerLog: ends at", "not whole")
    rep = recover_and_finish(sc)
    assert "full rescan" in rep.checkpoint


def test_damaged_timerlog_unit(sc: Scenario) -> None:
    seg = sorted((sc.dir / "timerlog").iterdir())[-1]
    with open(seg, "r+b") as f:
        f.seek(SEGMENT_HEADER_SIZE + UNIT_SIZE)
        f.write(struct.pack("<I", 0xFFFFFFFF))  # the second unit's size field
    check_finds(sc, "damaged TimerLog unit")
    recover_and_finish(sc)


def test_damaged_timerlog_unit_inside_a_pending_chain(sc: Scenario) -> None:
    # A unit the checkpoint covers, in the middle of a slot's chain that is still to fire: the
    # walk finds it, the wheel is rebuilt around it, and only its own message is lost.
    from delayd.storage.timerlog import TimerLog
    cp_end = max(int(ln.split("=")[1].split()[0]) for ln in inspect.dump(sc.dir, "checkpoint")
                 if ln.startswith("timerlog_end="))
    log = TimerLog(sc.dir / "timerlog", CFG.timerlog_segment_units)
    try:
        units = [u for u in log.scan(0, cp_end)]
    finally:
        log.close()
    by_prev = {u.prev_pos: u for u in units}
    victim = next(u for u in units if u.prev_pos != -1 and u.pos in by_prev and u.magic == 1
                  and u.fire_time >= sc.cp_read_time + 30 and u.seq in sc.pending())
    base = max(int(p.name) for p in (sc.dir / "timerlog").iterdir() if int(p.name) <= victim.pos)
    with open(sc.dir / "timerlog" / f"{base:020d}", "r+b") as f:
        f.seek(SEGMENT_HEADER_SIZE + victim.pos - base + 12)
        f.write(struct.pack("<I", 0))  # no magic bit: unreadable
    check_finds(sc, f"damaged TimerLog unit at {victim.pos}")
    # The unit stays on disk (the chain now runs around it), so check() still counts it.
    recover_and_finish(sc, may_lose=frozenset({victim.seq}), damaged_units_left=1)


@pytest.mark.parametrize("fault", ["geometry", "msgtable", "both checkpoints"])
def test_a_crash_right_after_a_full_rescan_does_not_trust_the_old_checkpoint(sc: Scenario, fault: str) -> None:
    config = CFG
    if fault == "geometry":
        config = dataclasses.replace(CFG, precision_ms=20)
    elif fault == "msgtable":
        shutil.rmtree(sc.dir / "msgtable")
    else:
        for name in ("checkpoint", "checkpoint.prev"):
            flip(sc.dir / name, 20)
    s, rep = open_data_dir(sc.dir, config, lambda: sc.clock[0])
    assert "full rescan" in rep.checkpoint
    s.close()  # a crash before the first checkpoint after the rescan
    assert not (sc.dir / "checkpoint").exists() and not (sc.dir / "checkpoint.prev").exists()
    again = recover_and_finish(sc, config=config)
    assert again.checkpoint == "none"


# ------------------------------------------------------------------------------ the key index

@pytest.mark.parametrize("damage", ["pages", "header"])
def test_damaged_key_index_is_set_aside_and_rebuilt(sc: Scenario, damage: str) -> None:
    pending = sc.pending()
    keyed = {r.seq: r for r in sc.records() if r.type == RecordType.MESSAGE and r.key and r.seq in pending}
    assert len(keyed) > 100
    path = sc.dir / "keys.sqlite"
    # "pages": the header and the first page stay (it opens), every later page is garbage;
    # "header": not a database at all.
    start = 4096 if damage == "pages" else 0
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(random.Random(7).randbytes(path.stat().st_size - start))
    s, rep = open_data_dir(sc.dir, CFG, lambda: sc.clock[0])
    try:
        assert rep.keys == "rebuilt"
        assert list(sc.dir.glob("keys.bad-*.sqlite")), "the damaged index was not set aside"
        assert not [f for f in files_open("self", sc.dir) if f.startswith("keys.bad-")], "the damaged index is still open"
        for seq, rec in keyed.items():
            holder = s.key_holder(rec.topic, rec.key)
            assert holder is not None and holder[0] == seq, f"key {rec.key} of {seq}: {holder}"
    finally:
        s.close()
    recover_and_finish(sc)
