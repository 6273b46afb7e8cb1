"""The storage side of replication: RELEASE records and the ready queues derived from them,
CommitLog.append_raw/read_raw, the epoch file, and cutting a log back with its derived files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from delayd.storage import epochs
from delayd.storage.commitlog import CommitLog, Record, RecordType, encode, release_parts
from delayd.storage.cut import cut
from delayd.storage.datadir import META_HEADER, META_MAGIC, META_VERSION, DataDir, read_meta
from delayd.storage.epochs import EpochFile
from delayd.storage.errors import BadMagic, ChecksumMismatch, CorruptData, UnsupportedVersion
from delayd.storage.msgtable import MessageState
from delayd.storage.store import NewMessage, Store

from tests.storage.driver import (
    SMALL,
    TOPICS,
    Driver,
    delivered_seqs,
    drain,
    no_fsync,
    open_store,
    ready_units,
)

T0 = 1_700_000_000_000


@pytest.fixture(autouse=True)
def _fast_fsync() -> object:
    with no_fsync():
        yield


@pytest.fixture
def clock() -> list[int]:
    return [T0]


def produce(s: Store, now: int, n: int, first_due: int, step: int = 7, key: str | None = None) -> list[int]:
    return s.append_messages([NewMessage(TOPICS[i % 2], b"m%d" % i, first_due + step * i,
                                         key=f"{key}{i}" if key else None) for i in range(n)], now)


def replicate(src: Store, dst: Store, chunk: int = 700) -> int:
    """Ship src's log to dst as a primary streams it; returns the frames sent."""
    frames = 0
    while dst.commit.end < src.commit.end:
        data = src.commit.read_raw(dst.commit.end, chunk)
        assert data, "read_raw must always make progress"
        dst.apply_replicated(dst.commit.end, data)
        frames += 1
    return frames


def states(s: Store) -> list[tuple[int, MessageState]]:
    return [(seq, s.state(seq)[0]) for seq in range(1, s.next_seq)]


# ------------------------------------------------------------------------------------ RELEASE

def test_release_appends_one_release_record_per_topic_naming_the_units(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    produce(s, T0, 10, T0 + 50, step=0)
    drain(drv, T0 + 100)
    rels = [r for r in s.commit.scan(0) if r.type == RecordType.RELEASE]
    assert sorted(r.topic for r in rels) == sorted(TOPICS)  # one per topic: the ten were one batch
    for r in rels:
        first, units = release_parts(r.body)
        assert first == 0 and units == s.ready.read_packed(r.topic, 0, 5)[1]
    s.close()


def test_ready_queues_lost_past_the_checkpoint_come_back_from_release_records(tmp_path: Path,
                                                                            clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    produce(s, T0, 6, T0 + 20, step=20)
    drv.checkpoint()
    drv.advance(300, checkpoint_every_ms=10**9)  # released after the last checkpoint
    want = ready_units(s)
    assert sum(map(len, want.values())) == 6
    s.close()
    # A crash between the RELEASE record and the units (or a replica that has only the log):
    for topic in TOPICS:
        shutil.rmtree(tmp_path / "ready" / topic)
    s = open_store(tmp_path, clock)
    assert ready_units(s) == want
    assert s.totals["delivered"] == 6 and all(st == MessageState.DELIVERED for _seq, st in states(s))
    s.close()


def test_a_replica_fed_the_log_derives_the_same_ready_queues(tmp_path: Path, clock: list[int]) -> None:
    a = open_store(tmp_path / "a", clock)
    b = open_store(tmp_path / "b", clock)
    drv = Driver(a, clock)
    produce(a, T0, 30, T0 + 15, step=11, key="k")
    seqs = produce(a, T0, 4, T0 + 400)
    a.append_cancel(seqs[1], TOPICS[1])
    drain(drv, T0 + 500)
    assert replicate(a, b) > 1
    Driver(b, clock).enqueue()  # the enqueue side only: a follower releases nothing itself
    assert b.commit.files.read(0, b.commit.end) == a.commit.files.read(0, a.commit.end)
    assert ready_units(b) == ready_units(a) and len(delivered_seqs(a)) == 33
    assert states(b) == states(a) and b.next_seq == a.next_seq
    assert b.key_holder(TOPICS[0], "k0") is not None
    a.close()
    b.close()


def test_append_raw_refuses_a_gap_an_overlap_and_damage(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "a", 4096)
    recs = [encode(Record(RecordType.MESSAGE, i, "t", b"x" * i)) for i in range(1, 4)]
    log.append(recs)
    other = CommitLog(tmp_path / "b", 4096)
    data = log.read_raw(0, 1 << 20)
    with pytest.raises(ValueError):
        other.append_raw(len(recs[0]), data)  # a gap
    bad = bytearray(data)
    bad[60] ^= 1
    with pytest.raises(CorruptData):
        other.append_raw(0, bytes(bad))
    with pytest.raises(CorruptData):
        other.append_raw(0, data[:-1])  # a torn record
    assert other.end == 0
    assert other.append_raw(0, data) == log.end
    with pytest.raises(ValueError):
        other.append_raw(0, data)  # an overlap
    log.close()
    other.close()


def test_read_raw_never_splits_a_batch_and_crosses_segments(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "a", 1024)
    from delayd.storage.commitlog import RecordFlag
    for b in range(12):
        batch = [encode(Record(RecordType.MESSAGE, 3 * b + i, "t", b"y" * 40), RecordFlag.CONTINUED if i < 2 else 0)
                 for i in range(3)]
        log.append(batch)
    assert len(log.files.bases) > 2
    pos, batch_len = 0, 3 * (48 + 1 + 40)
    while pos < log.end:
        data = log.read_raw(pos, 100)  # smaller than a batch: one whole batch
        assert len(data) % batch_len == 0 and data
        pos += len(data)
    log.close()


# ------------------------------------------------------------------------------------ epochs

def test_epoch_file_begin_adopt_end_of_and_cut(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs")
    assert f.entries == [] and f.end_of(3, 500) == 500
    f.begin(1, 0)
    f.begin(3, 100)
    with pytest.raises(ValueError):
        f.begin(3, 200)  # epochs only grow
    assert EpochFile(tmp_path / "epochs").entries == [(1, 0), (3, 100)]
    assert f.end_of(1, 900) == 100 and f.end_of(2, 900) == 100 and f.end_of(3, 900) == 900
    f.adopt([(3, 100), (4, 300), (6, 800)], log_end=400)  # 6 starts beyond this member's log
    assert EpochFile(tmp_path / "epochs").entries == [(1, 0), (3, 100), (4, 300)]
    f.cut(250)
    assert EpochFile(tmp_path / "epochs").entries == [(1, 0), (3, 100)]


def test_epoch_file_is_validated_magic_version_crc(tmp_path: Path) -> None:
    p = tmp_path / "epochs"
    epochs.save(p, [(2, 0), (5, 70)])
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(ChecksumMismatch):
        epochs.load(p)
    raw = bytearray(p.read_bytes())
    raw[4] = epochs.EPOCHS_VERSION + 1
    p.write_bytes(bytes(raw))
    with pytest.raises(UnsupportedVersion):
        epochs.load(p)
    with pytest.raises(UnsupportedVersion):  # a data directory with a newer epoch file is refused
        DataDir.open(tmp_path)
    raw[0] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(BadMagic):
        epochs.load(p)


# ------------------------------------------------------------------------------------ format 3

def test_a_format_2_directory_is_upgraded_and_a_newer_one_refused(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    produce(s, T0, 3, T0 + 10)
    s.close()
    meta = tmp_path / "meta"
    raw = bytearray(meta.read_bytes())
    raw[4:6] = (2).to_bytes(2, "little")  # as a format-2 build wrote it
    meta.write_bytes(bytes(raw))
    s = open_store(tmp_path, clock)
    assert s.next_seq == 4
    s.close()
    m = read_meta(meta)
    assert m is not None and m.version == META_VERSION == 3
    raw = bytearray(meta.read_bytes())
    assert META_HEADER.unpack_from(raw)[:2] == (META_MAGIC, 3)
    raw[4:6] = (META_VERSION + 1).to_bytes(2, "little")
    meta.write_bytes(bytes(raw))
    with pytest.raises(UnsupportedVersion):
        DataDir.open(tmp_path)


# ------------------------------------------------------------------------------------ cut

def test_cut_makes_every_derived_file_agree_with_the_shorter_log(tmp_path: Path, clock: list[int]) -> None:
    a = open_store(tmp_path / "a", clock)
    drv = Driver(a, clock)
    produce(a, T0, 12, T0 + 20, step=15, key="early")
    far = produce(a, T0, 2, T0 + 5000)  # beyond the roll window: in the far index
    drain(drv, T0 + 120)
    drv.checkpoint()
    at = a.commit.end
    want_ready = ready_units(a)
    want_states = states(a)
    want_next = a.next_seq
    # What the shared history ends with: copy it as the member that never saw the rest.
    a.close()
    shutil.copytree(tmp_path / "a", tmp_path / "ref")
    a = open_store(tmp_path / "a", clock)
    drv = Driver(a, clock)
    # ... then the tail to cut: new messages (keyed), a cancel, releases, rolls, checkpoints.
    late = produce(a, clock[0], 8, clock[0] + 10, step=9, key="late")
    a.append_cancel(far[0], TOPICS[0])
    drain(drv, T0 + 400)
    drv.checkpoint()
    assert a.commit.end > at and ready_units(a) != want_ready
    a.close()

    rep = cut(tmp_path / "a", at, SMALL)
    assert rep.bytes_cut > 0 and rep.ready_cut
    a = open_store(tmp_path / "a", clock)
    clock2 = [clock[0]]  # the reference's own clock, from the same time
    ref = open_store(tmp_path / "ref", clock2)
    assert a.commit.end == at == ref.commit.end
    assert ready_units(a) == want_ready  # the ready queues: the units of the cut RELEASE records gone
    assert states(a) == want_states and a.next_seq == want_next  # the message table
    for seq in late:
        assert a.state(seq)[0] == MessageState.UNKNOWN
    assert a.key_holder(TOPICS[0], "late0") is None and a.key_holder(TOPICS[0], "early0") is not None  # keys
    assert a.far.count() == ref.far.count() == 2  # the far index: the cancel was cut
    # TimerLog and wheel: from here both deliver the same messages, each once, never early.
    da, dr = Driver(a, clock), Driver(ref, clock2)
    drain(da, T0 + 7000)
    drain(dr, T0 + 7000)
    assert sorted(delivered_seqs(a)) == sorted(delivered_seqs(ref)) == list(range(1, want_next))
    for u in da.released:
        assert u.released_at >= u.deliver_at
    a.close()
    ref.close()


# ------------------------------------------------------------------------------------ a follower's cursor

def follow(a: Store, b: Store, drv_b: Driver) -> int:
    """One round of a follower: the primary's log shipped and indexed, then the cursor carried
    to the primary's durable read time and checkpointed (as pipeline.Carry and the broker's
    checkpoint loop do). Returns the units carried."""
    replicate(a, b)
    drv_b.enqueue()
    moved = b.dispatch.carry(a.read_time_ms)
    b.checkpoint(b.load_time_ms, {})
    return moved


def test_a_follower_cursor_follows_the_primary_and_keeps_indexing(tmp_path: Path, clock: list[int]) -> None:
    # Three wheel spans of traffic (SMALL: 1,040 ms a span). A follower whose cursor stood still
    # blocks once a unit would land a span past it, and stops indexing.
    a = open_store(tmp_path / "a", clock)
    b = open_store(tmp_path / "b", clock)
    drv_a, drv_b = Driver(a, clock), Driver(b, clock)
    start = b.load_time_ms
    moved = 0
    for i in range(35):
        produce(a, clock[0], 6, clock[0] + 20, step=13)
        produce(a, clock[0], 1, clock[0] + 500)  # beyond the roll window: a ROLL unit, rolled by a
        seq = produce(a, clock[0], 1, clock[0] + 60)[0]
        a.append_cancel(seq, TOPICS[0])
        drain(drv_a, clock[0] + 100)
        moved += follow(a, b, drv_b)
        assert b.indexed == b.commit.end and drv_b.blocked == 0, f"round {i}: the follower stopped indexing"
        assert b.load_time_ms == a.read_time_ms - a.read_time_ms % SMALL.precision_ms
    assert b.load_time_ms - start >= 3 * b.timers.wheel.span_ms
    # The primary had released, rolled or cancelled everything passed. Only a far message's
    # unit may move: each member places a roll copy from its own clock when it indexes it.
    assert moved <= 35
    assert states(b) == states(a) and ready_units(b) == ready_units(a)
    # Promoted, it releases nothing again and everything still due, once each.
    drain(drv_a, clock[0] + 700)
    before = set(delivered_seqs(b))
    drain(drv_b, clock[0] + 700)
    late = [s for s in delivered_seqs(b) if s not in before]
    assert len(late) == len(set(late)) and sorted(before | set(late)) == sorted(delivered_seqs(a))
    a.close()
    b.close()


def test_a_follower_carries_what_its_primary_never_released(tmp_path: Path, clock: list[int]) -> None:
    # The primary dies with messages of the slots its follower's cursor passes unreleased (their
    # RELEASE never written): the follower keeps them and, promoted, delivers each once.
    a = open_store(tmp_path / "a", clock)
    b = open_store(tmp_path / "b", clock)
    drv_b = Driver(b, clock)
    seqs = produce(a, T0, 10, T0 + 30, step=17)
    gone = produce(a, T0, 2, T0 + 40)
    for seq in gone:
        a.append_cancel(seq, TOPICS[0])
    replicate(a, b)
    drv_b.enqueue()
    assert b.dispatch.carry(T0 + 400) == len(seqs)
    assert b.load_time_ms == T0 + 400
    assert b.dispatch.carry(T0 + 400) == 0  # idempotent at the target
    clock[0] = T0 + 300
    assert drv_b.step() == []  # the moved units fire at the cursor, not before
    clock[0] = T0 + 400
    drv_b.step()
    assert sorted(u.seq for u in drv_b.released) == seqs  # each once, none of the cancelled
    assert all(u.deliver_at < u.released_at for u in drv_b.released)  # never early
    a.close()
    b.close()


def test_a_follower_back_after_more_than_a_wheel_span_catches_up(tmp_path: Path, clock: list[int]) -> None:
    # A follower that heard nothing for three wheel spans: indexing what it missed blocks (units
    # more than a span past its cursor), so its cursor must move before indexing completes
    # (Replication.carry_target stops waiting for the indexer after a while).
    a = open_store(tmp_path / "a", clock)
    b = open_store(tmp_path / "b", clock)
    drv_a, drv_b = Driver(a, clock), Driver(b, clock)
    for _ in range(30):
        produce(a, clock[0], 5, clock[0] + 30, step=11)
        drain(drv_a, clock[0] + 100)
    replicate(a, b)
    drv_b.enqueue()
    assert drv_b.blocked and b.indexed < b.commit.end
    for _ in range(50):
        if b.indexed == b.commit.end:
            break
        b.dispatch.carry(a.read_time_ms)
        b.checkpoint(b.load_time_ms, {})
        drv_b.enqueue()
    assert b.indexed == b.commit.end, "the follower never caught up"
    assert states(b) == states(a) and ready_units(b) == ready_units(a)
    a.close()
    b.close()
