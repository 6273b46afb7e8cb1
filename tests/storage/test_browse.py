"""Listing pending messages in due order (storage.browse + storage.farindex), on the storage
driver's fake clock: order across the window/far boundary, paging while messages are produced,
cancelled and delivered, the far index through restarts and its loss, big slots, late units,
topic filters and the per-page work bound."""

from __future__ import annotations

import random
import shutil
import tempfile
import zlib
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from delayd.storage import browse
from delayd.storage.browse import Page, Position, Query
from delayd.storage.msgtable import MessageState
from delayd.storage.recovery import open_store as open_data_dir
from delayd.storage.store import NewMessage, Store, StoreConfig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.driver import (
    SMALL,
    TOPICS,
    Driver,
    drain,
    no_fsync,
    open_store,
    restore_files,
    save_files,
    topic_of,
)
from tests.support.daemon import files_open

T0 = 1_000_000
WINDOW = SMALL.roll_window_ms


@pytest.fixture
def clock() -> list[int]:
    return [T0]


def run(gen: Generator[None, None, Page]) -> tuple[Page, int]:
    """Step a page generator to its end: (the page, how often it yielded)."""
    steps = 0
    while True:
        try:
            next(gen)
            steps += 1
        except StopIteration as e:
            return e.value, steps


def page(drv: Driver, **kw: Any) -> Page:
    return run(drv.store.browse(Query(**kw), drv.read_time()))[0]


def listed(drv: Driver, limit: int = 7, **kw: Any) -> list[tuple[int, int]]:
    """Every page until the cursor runs out: (deliver_at, seq) in the order listed."""
    out: list[tuple[int, int]] = []
    after = None
    for _ in range(100_000):
        p = page(drv, limit=limit, after=after, **kw)
        assert len(p.items) <= limit
        out += [(i.deliver_at, i.seq) for i in p.items]
        if p.next is None:
            return out
        after = p.next
    raise AssertionError("the cursor never ran out")


def pending(s: Store, produced: dict[int, int]) -> list[tuple[int, int]]:
    return sorted((d, q) for q, d in produced.items() if s.state(q)[0] == MessageState.SCHEDULED)


def produce(s: Store, drv: Driver, dues: list[int], topic: str = "orders") -> dict[int, int]:
    seqs = s.append_messages([NewMessage(topic, b"m%d" % i, d) for i, d in enumerate(dues)], drv.now)
    return dict(zip(seqs, dues, strict=True))


def test_order_across_the_window_and_far_boundary(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    rng = random.Random(7)
    produced = produce(s, drv, [T0 + rng.randrange(0, 30 * WINDOW) for _ in range(400)])
    drv.enqueue()
    expected = sorted((d, q) for q, d in produced.items())
    assert any(d > T0 + WINDOW for d, _ in expected) and any(d <= T0 + WINDOW for d, _ in expected)
    assert listed(drv, limit=7) == expected
    assert listed(drv, limit=1000) == expected
    drv.checkpoint()  # the far rows move from the overlay into SQLite: same answer
    assert s.far.count() == sum(d > T0 + WINDOW for d, _ in expected)
    assert listed(drv, limit=13) == expected
    # Time passes: the near ones are delivered, far ones roll inside the window and are listed
    # from their slots now; the order is the same.
    drain(drv, T0 + 12 * WINDOW)
    now_pending = pending(s, produced)
    assert 0 < len(now_pending) < len(expected)
    assert listed(drv, limit=9) == now_pending
    assert [x for x in expected if x in set(now_pending)] == now_pending
    s.close()


def test_range_limit_and_cursor(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    produced = produce(s, drv, [T0 + 50 + 37 * i for i in range(60)])  # both sides of the window
    drv.enqueue()
    expected = sorted((d, q) for q, d in produced.items())
    lo, hi = expected[10][0], expected[40][0]
    assert listed(drv, start_ms=lo, end_ms=hi) == [x for x in expected if lo <= x[0] <= hi]
    first = page(drv, limit=5)
    assert [(i.deliver_at, i.seq) for i in first.items] == expected[:5]
    assert first.next == Position(*expected[4])
    rest = page(drv, limit=1000, after=first.next)
    assert [(i.deliver_at, i.seq) for i in rest.items] == expected[5:] and rest.next is None
    item = first.items[0]
    assert (item.commit_offset, item.commit_size) == s.state(item.seq)[1:3]
    assert item.topic_hash == zlib.crc32(b"orders")
    s.close()


def test_cancelled_and_delivered_messages_are_never_listed(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    produced = produce(s, drv, [T0 + 20 + 13 * i for i in range(80)])
    cancelled = list(produced)[::3]
    s.append_cancel(cancelled[0], "orders")  # before it was indexed
    drv.enqueue()
    for seq in cancelled[1:]:
        s.append_cancel(seq, "orders")  # near ones and far ones
    got = listed(drv)
    assert not {q for _d, q in got} & set(cancelled)
    drv.enqueue()  # the cancel records reach the index: far rows go too
    assert listed(drv) == got
    drain(drv, T0 + 400)
    delivered = {d.seq for d in drv.released}
    assert delivered and not {q for _d, q in listed(drv)} & delivered
    assert listed(drv) == pending(s, produced)
    s.close()


def test_paging_while_messages_come_and_go(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    rng = random.Random(3)
    produced = produce(s, drv, [T0 + rng.randrange(0, 8 * WINDOW) for _ in range(300)])
    drv.enqueue()
    initial = set(produced)
    cancelled: set[int] = set()
    seen: list[tuple[int, int]] = []
    after = None
    while True:
        p = page(drv, limit=6, after=after)
        delivered = {d.seq for d in drv.released}
        for i in p.items:
            assert i.seq not in cancelled and i.seq not in delivered, "listed but no longer pending"
        seen += [(i.deliver_at, i.seq) for i in p.items]
        if p.next is None:
            break
        after = p.next
        # Meanwhile: new messages, cancels, and the clock moves (deliveries, rolls, checkpoints).
        produced.update(produce(s, drv, [drv.now + rng.randrange(-5, 8 * WINDOW) for _ in range(4)]))
        for seq in rng.sample(sorted(produced), 2):
            if s.state(seq)[0] == MessageState.SCHEDULED:
                s.append_cancel(seq, "orders")
                cancelled.add(seq)
        drv.advance(3, checkpoint_every_ms=20)
    assert seen == sorted(set(seen)), "out of order, or listed twice"
    delivered = {d.seq for d in drv.released}
    throughout = initial - cancelled - delivered
    assert throughout <= {q for _d, q in seen}, "a message pending throughout was skipped"
    s.close()


def test_far_rows_of_what_recovery_indexes_again_come_from_the_indexing(tmp_path: Path, clock: list[int]) -> None:
    """Far messages produced after the last checkpoint, the far index as that checkpoint left
    it (a kill -9): re-indexing them queues their rows, and the far index's replay, which ends
    where re-indexing starts, replays nothing."""
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    produced = produce(s, drv, [T0 + 3 * WINDOW + 11 * i for i in range(20)])
    drv.checkpoint()
    saved = save_files(tmp_path, "far.sqlite*")
    produced.update(produce(s, drv, [T0 + 4 * WINDOW + 7 * i for i in range(30)]))
    drv.enqueue()
    expected = pending(s, produced)
    s.close()
    restore_files(tmp_path, "far.sqlite*", saved)
    s, report = open_data_dir(tmp_path, SMALL, lambda: clock[0])
    assert report.far == "ok" and report.far_replayed == 0 and report.replayed_records >= 30
    drv = Driver(s, clock)
    assert listed(drv) == expected
    drv.checkpoint()
    s.close()
    s = open_store(tmp_path, clock)  # and written by the first checkpoint
    assert listed(Driver(s, clock)) == expected
    s.close()


def test_restart_replays_the_far_index_and_rebuilds_a_lost_one(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    produced = produce(s, drv, [T0 + 3 * WINDOW + 11 * i for i in range(50)])
    drv.enqueue()
    drv.checkpoint()
    saved = save_files(tmp_path, "far.sqlite*")
    produced.update(produce(s, drv, [T0 + 2 * WINDOW + 7 * i for i in range(50)]))
    drv.enqueue()
    s.append_cancel(next(iter(produced)), "orders")
    drv.enqueue()
    drv.checkpoint()
    expected = pending(s, produced)
    s.close()

    # The far index lost everything after the first checkpoint (as if its commits had not
    # reached the disk): recovery replays it from its own commit position.
    restore_files(tmp_path, "far.sqlite*", saved)
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    assert listed(drv) == expected
    s.close()

    # Deleted: rebuilt from the commit log.
    for f in tmp_path.glob("far.sqlite*"):
        f.unlink()
    s, report = open_data_dir(tmp_path, SMALL, lambda: clock[0])
    assert report.far == "rebuilt" and report.far_replayed == len(expected)
    assert "far index rebuilt" in report.line()
    drv = Driver(s, clock)
    assert listed(drv) == expected
    s.close()

    # Damaged: set aside and rebuilt.
    (tmp_path / "far.sqlite").write_bytes(b"this is not a database" * 100)
    for f in tmp_path.glob("far.sqlite-*"):
        f.unlink()
    s, report = open_data_dir(tmp_path, SMALL, lambda: clock[0])
    assert report.far == "rebuilt"
    assert list(tmp_path.glob("far.bad-*"))
    assert not [f for f in files_open("self", tmp_path) if f.startswith("far.bad-")], "the damaged index is still open"
    assert listed(Driver(s, clock)) == expected
    drain(Driver(s, clock), T0 + 6 * WINDOW)
    assert listed(Driver(s, clock)) == []
    s.close()


def test_topic_filter_skips_other_topics_without_reading_them(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    mail = produce(s, drv, [T0 + 100 + 50 * i for i in range(10)], "mail")  # near and far
    orders = produce(s, drv, [T0 + 30 + i for i in range(3000)], "orders")
    drv.enqueue()
    th = zlib.crc32(b"mail")
    assert listed(drv, topic_hash=th) == sorted((d, q) for q, d in mail.items())
    assert listed(drv, topic_hash=zlib.crc32(b"orders"), limit=500) == sorted((d, q) for q, d in orders.items())
    # The work bound: a page examines at most `budget` candidates and says where to go on.
    p = page(drv, topic_hash=th, budget=100)
    assert p.examined == 100 and p.next is not None and len(p.items) < 10
    got, after = [], None
    for _ in range(1000):
        p = page(drv, topic_hash=th, budget=100, after=after)
        assert p.examined <= 100
        got += [(i.deliver_at, i.seq) for i in p.items]
        if p.next is None:
            break
        after = p.next
    assert got == sorted((d, q) for q, d in mail.items())
    s.close()


def test_a_big_slot_is_walked_once_and_its_view_reused(tmp_path: Path, clock: list[int]) -> None:
    cfg = StoreConfig(precision_ms=1000, roll_window_ms=60_000, msgtable_segment_entries=1 << 16)
    s = open_store(tmp_path, clock, cfg)
    drv = Driver(s, clock)
    rng = random.Random(5)
    n = browse.STEP_UNITS + browse.CACHE_MIN_UNITS
    base = T0 - T0 % 1000 + 10_000
    produced = produce(s, drv, [base + rng.randrange(1000) for _ in range(n)])  # one slot
    produced.update(produce(s, drv, [base + 1000 + i for i in range(10)]))  # the next one
    drv.enqueue()
    expected = sorted((d, q) for q, d in produced.items())
    first, steps = run(s.browse(Query(limit=50), drv.read_time()))
    assert steps >= 1, "a big slot is built in steps the caller can interleave"
    assert first.walked_units == n and [(i.deliver_at, i.seq) for i in first.items] == expected[:50]
    second, steps = run(s.browse(Query(limit=50, after=first.next), drv.read_time()))
    assert steps == 0 and second.walked_units == 0, "the second page reuses the view"
    assert [(i.deliver_at, i.seq) for i in second.items] == expected[50:100]
    # Units added to the slot later extend the view instead of rebuilding it.
    produced.update(produce(s, drv, [base + 500 + i for i in range(20)]))
    drv.enqueue()
    third = page(drv, limit=100_000, budget=100_000, after=second.next)
    assert third.walked_units == 20 + 10  # the extension, and the small next slot (never cached)
    expected = sorted((d, q) for q, d in produced.items())
    assert [(i.deliver_at, i.seq) for i in third.items] == [x for x in expected if x > expected[99]]
    assert listed(drv, limit=997) == expected
    s.close()


def test_late_units_are_listed_at_their_own_due_time(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    drv.now = T0 + 100
    drv.dequeue()  # slots up to T0+100 are loaded: what is due before lands in the next slot
    assert s.load_time_ms == T0 + 110
    late = produce(s, drv, [T0 + 30, T0 + 95, T0 + 100, T0 + 103])  # their units fire at T0+110
    normal = produce(s, drv, [T0 + 110, T0 + 115])  # T0+110: due at that very slot start
    drv.enqueue()
    assert {d.seq for d in drv.pending} == set(late)  # handed to dequeue-put; not released here
    assert listed(drv, limit=2) == sorted((d, q) for q, d in {**late, **normal}.items())
    assert listed(drv, start_ms=T0 + 96) == sorted((d, q) for q, d in {**late, **normal}.items() if d >= T0 + 96)
    s.close()


def test_stale_far_rows_are_pruned_when_read(tmp_path: Path, clock: list[int]) -> None:
    s = open_store(tmp_path, clock)
    drv = Driver(s, clock)
    produced = produce(s, drv, [T0 + 5 * WINDOW + i for i in range(20)])
    drv.enqueue()
    drv.checkpoint()
    assert s.far.count() == 20
    # A row that survived its message (as after a crash between the two): read, skipped, dropped.
    victim = sorted(produced)[3]
    s.msgs.set_state(victim, MessageState.CANCELLED)
    assert victim not in {q for _d, q in listed(drv)}
    drv.checkpoint()
    assert s.far.count() == 19
    s.close()


@pytest.mark.parametrize("big", [False, True])
def test_a_damaged_chain_skips_its_slot_not_the_listing(tmp_path: Path, clock: list[int],
                                                        caplog: pytest.LogCaptureFixture, big: bool) -> None:
    cfg = StoreConfig(precision_ms=1000, roll_window_ms=60_000)
    s = open_store(tmp_path, clock, cfg)
    drv = Driver(s, clock)
    base = T0 - T0 % 1000 + 10_000
    n = browse.CACHE_MIN_UNITS if big else 3
    before = produce(s, drv, [base + i for i in range(3)])
    hit = produce(s, drv, [base + 2000 + i % 1000 for i in range(n)])
    after = produce(s, drv, [base + 4000 + i for i in range(3)])
    drv.enqueue()
    slot = s.timers.wheel.get(base + 2000)
    s.timers.log.files.write_at(slot.last_pos, b"\xff\xff\xff\xff")  # the newest unit's size field
    with caplog.at_level("WARNING", logger="delayd.storage"):
        got = listed(drv, limit=4)
    assert got == sorted((d, q) for q, d in {**before, **after}.items())
    assert f"listing skips TimerWheel slot {base + 2000}" in caplog.text
    assert hit  # (they are the dispatcher's to repair when their slot is due)
    s.close()


# ------------------------------------------------------------------------------ model test

OPS = st.one_of(
    st.tuples(st.just("produce"), st.sampled_from(TOPICS), st.lists(st.integers(-30, 1500), min_size=1, max_size=6)),
    st.tuples(st.just("cancel"), st.integers(0, 10**6)),
    st.tuples(st.just("advance"), st.integers(1, 150)),
    st.tuples(st.just("list"), st.integers(1, 9), st.sampled_from([None, *TOPICS])),
    st.tuples(st.just("restart")),
)


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=st.lists(OPS, max_size=30))
def test_listing_model(ops: list[tuple[Any, ...]]) -> None:
    """After any sequence of produce, cancel, time, restart: a listing is exactly the pending
    messages (per the message table's own answer for each id) in due order."""
    with no_fsync():
        d = Path(tempfile.mkdtemp(prefix="browse-model-"))
        clock = [T0]
        s = open_store(d, clock)
        try:
            drv = Driver(s, clock)
            produced: dict[int, tuple[int, str]] = {}
            for op in ops:
                if op[0] == "produce":
                    msgs = [NewMessage(op[1], b"x", drv.now + delay) for delay in op[2]]
                    seqs = s.append_messages(msgs, drv.now)
                    produced.update({q: (m.deliver_at, m.topic) for q, m in zip(seqs, msgs, strict=True)})
                    drv.enqueue()
                elif op[0] == "cancel" and produced:
                    seq = sorted(produced)[op[1] % len(produced)]
                    if s.state(seq)[0] == MessageState.SCHEDULED:
                        s.append_cancel(seq, topic_of(s, seq))
                elif op[0] == "advance":
                    drv.advance(op[1])
                elif op[0] == "restart":
                    drv.checkpoint()
                    s.close()
                    s = open_store(d, clock)
                    drv = Driver(s, clock)
                elif op[0] == "list":
                    th = None if op[2] is None else zlib.crc32(op[2].encode())
                    want = sorted((dl, q) for q, (dl, t) in produced.items()
                                  if s.state(q)[0] == MessageState.SCHEDULED and (op[2] is None or t == op[2]))
                    assert listed(drv, limit=op[1], topic_hash=th) == want
        finally:
            s.close()
            shutil.rmtree(d, ignore_errors=True)
