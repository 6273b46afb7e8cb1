"""storage.recovery, move by move: which checkpoint it trusts, the torn commit-log tail it cuts
(and logs), the TimerLog units it strips and truncates, the wheel it rebuilds, the message-table
entries and counters it replays — each checked against what the store held before the "crash"
(close without a final checkpoint, or files damaged on purpose)."""

from __future__ import annotations

import collections
import logging
import os
import shutil
from pathlib import Path

import pytest
from delayd.storage.commitlog import RecordType
from delayd.storage.msgtable import ENTRY_SIZE, MessageState
from delayd.storage.recovery import open_store
from delayd.storage.segments import SEGMENT_HEADER_SIZE, list_segments, segment_name
from delayd.storage.store import NewMessage, Store
from delayd.storage.timerlog import UNIT_SIZE
from delayd.storage.timerwheel import HEADER as WHEEL_HEADER
from delayd.storage.timerwheel import SLOT, SLOT_SIZE

from tests.storage.driver import (
    SMALL,
    Driver,
    delivered_seqs,
    drain,
    no_fsync,
    restore_files,
    save_files,
    topic_of,
)

T0 = 1_000_000


@pytest.fixture(autouse=True)
def _no_fsync():
    with no_fsync():
        yield


def stats(s: Store) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    return dict(s.totals), {t: dict(c) for t, c in s.topic_counts.items()}


def produce(s: Store, now: int, dues: list[int], topic: str = "orders") -> list[int]:
    seqs = s.append_messages([NewMessage(topic, b"m%d" % i, now + d) for i, d in enumerate(dues)], now)
    s.flush_commit()
    return seqs


def deliver_all(s: Store, clock: list[int], until: int) -> collections.Counter[int]:
    drain(Driver(s, clock), until)
    return collections.Counter(delivered_seqs(s))


@pytest.fixture
def clock() -> list[int]:
    return [T0]


@pytest.fixture
def crashed(tmp_path: Path, clock: list[int]) -> tuple[Path, dict]:
    """A directory as a crash leaves it: a checkpoint, then more produce, cancels, deliveries and
    units written after it, and no final checkpoint. Returns what the store held at the crash."""
    d = tmp_path / "data"
    s, _ = open_store(d, SMALL, lambda: clock[0])
    drv = Driver(s, clock)
    produce(s, T0, [20 * i for i in range(10)])
    drv.checkpoint()  # becomes checkpoint.prev
    produce(s, T0, [5 + 20 * i for i in range(5)], topic="mail")
    drv.advance(60)
    drv.checkpoint()
    cp_timerlog_end = s.timers.log.end
    late = produce(s, clock[0], [100 + 10 * i for i in range(8)])
    s.append_cancel(late[0], "orders")
    s.flush_commit()
    drv.advance(50, checkpoint_every_ms=10**9)  # indexes and delivers more; no checkpoint
    state = {"totals": dict(s.totals), "topics": {t: dict(c) for t, c in s.topic_counts.items()},
             "delivered": sorted(delivered_seqs(s)), "cp_timerlog_end": cp_timerlog_end,
             "timerlog_end": s.timers.log.end, "cancelled": late[0], "next_seq": s.next_seq,
             "all": list(range(1, s.next_seq))}
    assert state["timerlog_end"] > cp_timerlog_end, "units were written after the checkpoint"
    s.close()
    return d, state


# ------------------------------------------------------------------------------ checkpoint choice

def test_a_damaged_checkpoint_falls_back_to_the_previous_one(crashed: tuple[Path, dict], clock: list[int]) -> None:
    d, _ = crashed
    raw = bytearray((d / "checkpoint").read_bytes())
    raw[-1] ^= 0xFF
    (d / "checkpoint").write_bytes(bytes(raw))
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.checkpoint.startswith("fell back to checkpoint.prev (checkpoint: ChecksumMismatch")
    s.close()


def test_no_usable_checkpoint_means_a_full_rescan_and_the_old_ones_set_aside(crashed: tuple[Path, dict],
                                                                             clock: list[int]) -> None:
    d, before = crashed
    for name in ("checkpoint", "checkpoint.prev"):
        (d / name).write_bytes(b"JUNKJUNKJUNKJUNKJUNK")
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.checkpoint.startswith("rejected") and "full rescan" in rep.checkpoint
    assert rep.wheel == "rebuilt (no checkpoint)"
    assert not (d / "checkpoint").exists() and any(p.name.startswith("checkpoint.bad-") for p in d.iterdir())
    # A full rescan counts from the log and the ready queues alone, and agrees.
    assert s.totals["produced"] == before["totals"]["produced"]
    assert s.totals["delivered"] == before["totals"]["delivered"]
    assert s.scheduled == sum(c["scheduled"] for c in before["topics"].values())
    s.close()


def test_a_checkpoint_the_files_contradict_is_not_trusted(crashed: tuple[Path, dict], clock: list[int]) -> None:
    d, _ = crashed
    shutil.rmtree(d / "msgtable")  # the checkpoint counts on entries that are gone
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert "the message table" in rep.checkpoint and "full rescan" in rep.checkpoint
    s.close()


# ------------------------------------------------------------------------------ the commit log tail

def test_a_torn_tail_is_cut_counted_and_logged(crashed: tuple[Path, dict], clock: list[int],
                                               caplog: pytest.LogCaptureFixture) -> None:
    d, before = crashed
    seg = d / "commitlog" / segment_name(list_segments(d / "commitlog")[-1])
    with open(seg, "ab") as f:
        f.write(b"\x80\x00\x00\x00" + b"\x42" * 20)  # a record header cut short
    size = seg.stat().st_size
    caplog.set_level(logging.WARNING, "delayd.storage")
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.commit.truncated_bytes == 24 and "24 bytes truncated" in rep.line()
    assert seg.stat().st_size == size - 24
    cut = [r for r in caplog.records if r.levelno == logging.WARNING and "cut 24 bytes" in r.getMessage()]
    assert cut and seg.name in cut[0].getMessage() and "commit log" in cut[0].getMessage()
    assert s.next_seq == before["next_seq"]
    s.close()


# ------------------------------------------------------------------------------ TimerLog and wheel

def test_units_after_the_checkpoint_are_stripped_truncated_and_redone_once(crashed: tuple[Path, dict],
                                                                          clock: list[int]) -> None:
    d, before = crashed
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.checkpoint == "ok" and rep.wheel == "ok"
    assert rep.units_stripped > 0
    assert rep.timerlog_truncated == before["timerlog_end"] - before["cp_timerlog_end"]
    assert rep.replayed_records > 0
    counts = deliver_all(s, clock, T0 + 2_000)
    assert all(n == 1 for n in counts.values()), "a redone unit must not deliver twice"
    assert set(counts) == set(before["all"]) - {before["cancelled"]}
    s.close()


def test_a_missing_wheel_is_rebuilt_from_the_timerlog(crashed: tuple[Path, dict], clock: list[int]) -> None:
    d, before = crashed
    os.unlink(d / "timerwheel")
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.wheel == "rebuilt (missing)" and rep.checkpoint == "ok"
    counts = deliver_all(s, clock, T0 + 2_000)
    assert set(counts) == set(before["all"]) - {before["cancelled"]} and max(counts.values()) == 1
    s.close()


def test_a_wheel_slot_with_a_negative_count_makes_the_wheel_rebuilt(crashed: tuple[Path, dict],
                                                                    clock: list[int]) -> None:
    """A negative num reads as an empty slot: trusted, its chain would never be walked."""
    d, before = crashed
    raw = bytearray((d / "timerwheel").read_bytes())
    at = next(WHEEL_HEADER.size + k * SLOT_SIZE for k in range((len(raw) - WHEEL_HEADER.size) // SLOT_SIZE)
              if SLOT.unpack_from(raw, WHEEL_HEADER.size + k * SLOT_SIZE)[3] > 0)
    fields = list(SLOT.unpack_from(raw, at))
    fields[3] = -fields[3]
    SLOT.pack_into(raw, at, *fields)
    (d / "timerwheel").write_bytes(raw)
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.wheel == "rebuilt (damaged slots)" and rep.checkpoint == "ok"
    counts = deliver_all(s, clock, T0 + 2_000)
    assert set(counts) == set(before["all"]) - {before["cancelled"]} and max(counts.values()) == 1
    s.close()


def test_a_torn_timerlog_unit_is_cut(crashed: tuple[Path, dict], clock: list[int],
                                     caplog: pytest.LogCaptureFixture) -> None:
    d, before = crashed
    last = d / "timerlog" / segment_name(list_segments(d / "timerlog")[-1])
    with open(last, "ab") as f:
        f.write(b"\x34\x00\x00\x00\x01\x02")  # six bytes of a unit
    caplog.set_level(logging.WARNING, "delayd.storage")
    s, _rep = open_store(d, SMALL, lambda: clock[0])
    assert s.timers.log.end % UNIT_SIZE == 0
    assert any("TimerLog: torn unit" in r.getMessage() for r in caplog.records)
    assert any("units past the checkpoint" in r.getMessage() for r in caplog.records)
    s.close()


# ------------------------------------------------------------------------------ message table and counters

def test_lost_message_table_writes_are_replayed_from_the_log(crashed: tuple[Path, dict], clock: list[int]) -> None:
    """A power cut loses message-table writes after the checkpoint (they were never fsynced): the
    log says what they were. Zero the entries of every message produced after it."""
    d, before = crashed
    s, _ = open_store(d, SMALL, lambda: clock[0])
    s.close()
    per = SMALL.msgtable_segment_entries
    cancelled = before["cancelled"]
    for seq in range(cancelled, before["next_seq"]):
        seg, idx = divmod(seq, per)
        with open(d / "msgtable" / segment_name(seg), "r+b") as f:
            f.seek(SEGMENT_HEADER_SIZE + idx * ENTRY_SIZE)
            f.write(bytes(ENTRY_SIZE))
    s, _ = open_store(d, SMALL, lambda: clock[0])
    assert s.state(cancelled)[0] == MessageState.CANCELLED
    assert s.state(cancelled + 1)[0] in (MessageState.SCHEDULED, MessageState.DELIVERED)
    counts = deliver_all(s, clock, T0 + 2_000)
    assert counts[cancelled] == 0 and set(counts) == set(before["all"]) - {cancelled}
    s.close()


def test_counters_after_replay_equal_those_at_the_crash(crashed: tuple[Path, dict], clock: list[int]) -> None:
    d, before = crashed
    s, _ = open_store(d, SMALL, lambda: clock[0])
    assert s.totals["produced"] == before["totals"]["produced"]
    assert s.totals["cancelled"] == before["totals"]["cancelled"]
    assert s.totals["delivered"] == before["totals"]["delivered"]
    for topic, c in before["topics"].items():
        assert s.topic_counts[topic] == c, topic
    assert sorted(delivered_seqs(s)) == before["delivered"]
    # And the schedule agrees with the pending count once dequeue-get caught up with the clock:
    # what it holds (loaded, not yet due) plus what the histogram counts.
    drv = Driver(s, clock)
    drv.step()
    counted = sum(n for _t, n in s.schedule_buckets(s.load_time_ms, s.load_time_ms + 10**8, 10**8))
    assert counted + len({d.seq for d in drv.pending}) == s.scheduled
    s.close()


def test_group_records_and_the_sequence_come_back(crashed: tuple[Path, dict], clock: list[int]) -> None:
    d, before = crashed
    s, _ = open_store(d, SMALL, lambda: clock[0])
    s.append_group_event("orders", "g", b"\x81\xa2op\xa6create")
    s.flush_commit()
    s.close()
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert [(r.type, r.key) for r in rep.group_events] == [(RecordType.GROUP, "g")]
    assert s.next_seq == before["next_seq"]
    assert topic_of(s, 1) == "orders"
    s.close()


# ------------------------------------------------------------------------------ a long stop

def test_after_a_stop_longer_than_the_wheel_replay_waits_for_the_wheel_instead_of_dropping(
        tmp_path: Path, clock: list[int]) -> None:
    """Records appended after the last checkpoint whose units would land a lap ahead of the
    durable read time cannot be indexed at recovery (the slot's previous lap is not dispatched
    yet): re-indexing pauses there, and enqueue picks up from that record once the wheel turned.
    (Before, recovery skipped them: those messages were never delivered.)"""
    d = tmp_path / "data"
    s, _ = open_store(d, SMALL, lambda: clock[0])
    drv = Driver(s, clock)
    drv.checkpoint()
    span = s.timers.wheel.span_ms
    clock[0] = T0 + 5 * span  # a long stop: the log got records the wheel cannot take yet
    seqs = produce(s, clock[0], [30, 60, 90])
    s.close()  # no checkpoint since T0
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.replayed_records == 0 and s.indexed < s.commit.end
    counts = deliver_all(s, clock, clock[0] + 300)
    assert [counts[q] for q in seqs] == [1, 1, 1]
    assert s.scheduled == 0
    s.close()


def test_a_damaged_timerlog_or_message_table_header_means_a_rebuild(crashed: tuple[Path, dict],
                                                                   clock: list[int]) -> None:
    """Both are derived from the commit log: a segment whose header is damaged sets the
    directory aside (kept, renamed) and recovery rebuilds it with a full rescan."""
    d, before = crashed
    for name in ("timerlog", "msgtable"):
        seg = d / name / segment_name(list_segments(d / name)[0])
        raw = bytearray(seg.read_bytes())
        raw[20] ^= 0xFF  # inside the header: its CRC no longer matches
        seg.write_bytes(bytes(raw))
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert "full rescan" in rep.checkpoint
    assert any(p.name.startswith("timerlog.bad-") for p in d.iterdir())
    assert any(p.name.startswith("msgtable.bad-") for p in d.iterdir())
    counts = deliver_all(s, clock, T0 + 2_000)
    assert set(counts) == set(before["all"]) - {before["cancelled"]} and max(counts.values()) == 1
    s.close()


def test_a_damaged_ready_queue_header_stops_recovery_with_the_file_named(crashed: tuple[Path, dict],
                                                                         clock: list[int]) -> None:
    """A ready queue records deliveries: nothing to rebuild it from, so it is not guessed at."""
    d, _ = crashed
    seg = d / "ready" / "orders" / segment_name(list_segments(d / "ready" / "orders")[-1])
    raw = bytearray(seg.read_bytes())
    raw[20] ^= 0xFF
    seg.write_bytes(bytes(raw))
    from delayd.storage.errors import ChecksumMismatch
    with pytest.raises(ChecksumMismatch, match=str(seg)):
        open_store(d, SMALL, lambda: clock[0])


# ------------------------------------------------------------------------------ the key index

def keyed(s: Store, now: int, n: int, first: int, topic: str = "orders", key_every: int = 1) -> dict[str, int]:
    """n messages, every `key_every`-th with a key k<first+i>: {key: seq}."""
    msgs = [NewMessage(topic, b"k", now + 10_000 + i, key=f"k{first + i}" if i % key_every == 0 else None)
            for i in range(n)]
    seqs = s.append_messages(msgs, now)
    s.flush_commit()
    return {m.key: q for m, q in zip(msgs, seqs, strict=True) if m.key is not None}


def test_keys_after_the_checkpoint_come_back_from_the_log_and_ride_the_first_checkpoint(
        tmp_path: Path, clock: list[int]) -> None:
    d = tmp_path / "data"
    s, _ = open_store(d, SMALL, lambda: clock[0])
    drv = Driver(s, clock)
    before = keyed(s, T0, 30, 0)
    drv.checkpoint()
    saved = save_files(d, "keys.sqlite*")  # the key index as the checkpoint wrote it
    after = keyed(s, T0, 40, 100, key_every=3)  # keyless ones between: the keys go as runs
    after.update(keyed(s, T0, 5, 200, topic="mail"))
    s.append_cancel(after["k103"], "orders", "k103")
    s.flush_commit()
    drv.enqueue()
    s.close()  # (its close writes the queued keys: a kill -9 would not)
    restore_files(d, "keys.sqlite*", saved)

    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.keys == "ok" and rep.keys_replayed == len(after) + 1  # (and the cancel's key)
    # Not written by recovery: held for the first checkpoint, answered from memory meanwhile.
    assert s.keys.unwritten == len(after)
    def answers() -> None:
        for topic, held in (("orders", before), ("orders", {k: q for k, q in after.items() if k < "k2"}),
                            ("mail", {k: q for k, q in after.items() if k >= "k2"})):
            for key, seq in held.items():
                got = s.keys.lookup(topic, key)
                assert (got is None) if key == "k103" else (got is not None and got[0] == seq), (topic, key, got)
    answers()
    Driver(s, clock).checkpoint()
    assert s.keys.unwritten == 0
    s.close()
    s, rep = open_store(d, SMALL, lambda: clock[0])
    answers()
    s.close()


def test_a_key_cancelled_and_produced_again_after_the_checkpoint_comes_back_with_its_new_message(
        tmp_path: Path, clock: list[int]) -> None:
    """The replay releases a cancel's key where the cancel lies in the log, between the runs of
    keys it queues: a key cancelled and then produced again is held by the new message; one
    cancelled and not produced again is free."""
    d = tmp_path / "data"
    s, _ = open_store(d, SMALL, lambda: clock[0])
    drv = Driver(s, clock)
    drv.checkpoint()
    saved = save_files(d, "keys.sqlite*")
    first = keyed(s, T0, 10, 0)
    for key in ("k3", "k4"):
        s.append_cancel(first[key], "orders", key)
    again = keyed(s, T0, 1, 3)  # k3 again, a new message
    later = keyed(s, T0, 5, 100)
    s.flush_commit()
    drv.enqueue()
    s.close()
    restore_files(d, "keys.sqlite*", saved)

    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.keys_replayed == 10 + 2 + 1 + 5
    for store_state in ("held in memory", "written"):
        assert s.keys.lookup("orders", "k3")[0] == again["k3"], store_state  # type: ignore[index]
        assert s.keys.lookup("orders", "k4") is None, store_state
        for key, seq in {**{k: q for k, q in first.items() if k not in ("k3", "k4")}, **later}.items():
            assert s.keys.lookup("orders", key)[0] == seq, (store_state, key)  # type: ignore[index]
        Driver(s, clock).checkpoint()
    s.close()


def test_a_rebuilt_key_index_is_written_as_the_replay_goes(tmp_path: Path, clock: list[int],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from delayd.storage import recovery
    monkeypatch.setattr(recovery, "REPLAY_BATCH", 16)
    monkeypatch.setattr(recovery, "REPLAY_KEYS_HELD", 20)
    d = tmp_path / "data"
    s, _ = open_store(d, SMALL, lambda: clock[0])
    held = keyed(s, T0, 100, 0)
    Driver(s, clock).checkpoint()
    s.close()
    for f in d.glob("keys.sqlite*"):
        f.unlink()
    s, rep = open_store(d, SMALL, lambda: clock[0])
    assert rep.keys == "rebuilt" and rep.keys_replayed == 100
    assert s.keys.unwritten < 20 + 16 and s.keys.count() >= 100 - 20 - 16  # written along the way
    assert 0 < s.keys.commit_pos <= s.commit.end
    for key, seq in held.items():
        assert s.keys.lookup("orders", key)[0] == seq  # type: ignore[index]
    s.close()
