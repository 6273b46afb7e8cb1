"""Pipeline building blocks: bounded links (flow control, no loss) and in-flight tracking."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from delayd.broker.pipeline import InFlight, Link


async def test_link_put_waits_while_full_and_loses_nothing():
    link: Link[list[int]] = Link("x", capacity_batches=2)
    await link.put([1, 2])
    await link.put([3])
    assert link.items == 3 and len(link) == 2
    third = asyncio.create_task(link.put([4]))
    await asyncio.sleep(0)
    assert not third.done(), "a full link makes the producer wait"
    assert await link.get() == [1, 2]
    await asyncio.wait_for(third, 1)
    got = [await link.get(), await link.get()]
    assert got == [[3], [4]] and link.items == 0


async def test_link_wait_times_out_without_taking_an_item():
    link: Link[list[str]] = Link("x", capacity_batches=1)
    await link.wait(0.01)
    assert link.get_nowait() is None
    waiter = asyncio.create_task(link.wait(5))
    await asyncio.sleep(0)
    await link.put(["a"])
    await asyncio.wait_for(waiter, 1)
    assert link.get_nowait() == ["a"], "waiting never consumes"


def test_inflight_read_time_is_the_oldest_open_slot():
    store = SimpleNamespace(load_time_ms=5000)
    f = InFlight(store)  # type: ignore[arg-type]
    assert f.read_time() == 5000, "nothing in flight: everything before the next slot is done"
    f.add(3000, 1)  # a walk holds its slot open
    f.add(4000, 2)
    assert f.read_time() == 3000
    f.done(3000)
    assert f.read_time() == 4000
    f.done(4000, 2)
    assert f.read_time() == 5000 and f.count == 0


async def test_link_get_answers_none_once_closed_and_empty():
    link: Link[list[int]] = Link("x", capacity_batches=2, producers=2)
    await link.put([1])
    link.close()
    assert await link.get() == [1]
    waiter = asyncio.create_task(link.get())
    await asyncio.sleep(0)
    assert not waiter.done(), "one producer is still open"
    link.close()
    assert await asyncio.wait_for(waiter, 1) is None


async def test_stop_drains_what_the_stages_hold_instead_of_cancelling(tmp_path):
    """Records already handed to enqueue-put are indexed and a message already due is released
    before the stages end; each stage reports END. (Cancelling them, as stop once did, left that
    work to the next start's recovery.)"""
    from delayd.broker.clock import Clock
    from delayd.broker.pipeline import DueBatch, Pipeline, RowBatch, StageState
    from delayd.storage import batch
    from delayd.storage.readyqueue import tag_hash
    from delayd.storage.recovery import open_store
    from delayd.storage.store import Due, NewMessage

    clock = Clock()
    store, _ = open_store(tmp_path / "data", clock_ms=clock.now_ms)
    released: list[int] = []
    try:
        now = clock.now_ms()
        store.append_messages([NewMessage("later", b"x%d" % i, now + 3_600_000) for i in range(100)], now)
        [due_seq] = store.append_messages([NewMessage("now", b"due", now)], now)
        _st, off, size, _r = store.state(due_seq)
        rows, end = batch.read_rows(store.commit, 0, 1000, store.commit.end)
        p = Pipeline(store, clock, lookahead_ms=300, queue_batches=4, release_capacity=1000,
                     on_release=lambda rel, _now: released.extend(u.seq for u in rel.units()))
        assert set(p.states().values()) == {StageState.INITIAL.value}
        p.enqueue_get.pos = end  # these records are already in enqueue-put's inbox
        await p.records.put(RowBatch(rows))
        p.inflight.add(now - now % 1000, 1)
        await p.dues.put(DueBatch(Due(now, due_seq, off, size, store.counters.topic_hash("now"), tag_hash(None),
                                      False, now - now % 1000).row()))
        p.start()
        assert await p.stop(timeout_s=10)
        assert set(p.states().values()) == {StageState.END.value}
        assert store.indexed == end, "the records in enqueue-put's inbox were indexed, not dropped"
        # the 100 later ones, and the due one's own unit (released here from its Due; its slot is not loaded yet)
        assert sum(n for _t, n in store.schedule_buckets(now, now + 10**10, 10**10)) == 101
        assert released == [due_seq] and store.ready.end("now") == 1
        assert len(p.records) == len(p.units) == len(p.dues) == 0
    finally:
        store.close()


async def test_indexing_reaches_the_log_end_after_a_release(tmp_path):
    """dequeue-put's RELEASE records wake enqueue-get, so the indexed offset reaches the end of
    the log with nothing else appended (a listing waits for that: it took a second after every
    delivery, and stayed so until the next produce)."""
    from delayd.broker.clock import Clock
    from delayd.broker.pipeline import Pipeline
    from delayd.storage.commitlog import RecordType
    from delayd.storage.recovery import open_store
    from delayd.storage.store import NewMessage

    clock = Clock()
    store, _ = open_store(tmp_path / "data", clock_ms=clock.now_ms)
    released: list[int] = []
    p = Pipeline(store, clock, lookahead_ms=0, queue_batches=4, release_capacity=1000,
                 on_release=lambda rel, _now: released.extend(u.seq for u in rel.units()))
    p.start()
    try:
        now = clock.now_ms()
        seqs = store.append_messages([NewMessage("t", b"due %d" % i, now) for i in range(3)], now)
        p.appended.set()  # as produce does
        deadline = asyncio.get_running_loop().time() + 10
        while sorted(released) != seqs:
            assert asyncio.get_running_loop().time() < deadline, "the three were not released"
            await asyncio.sleep(0.01)
        assert any(r.type == RecordType.RELEASE for r in store.commit.scan(0))
        while store.indexed < store.commit.end:
            assert asyncio.get_running_loop().time() < deadline, (store.indexed, store.commit.end)
            await asyncio.sleep(0.01)
    finally:
        await p.stop(timeout_s=10)
        store.close()


async def test_group_commit_through_the_compiled_fsync_thread(tmp_path, monkeypatch):
    """The group commit's fsyncs go through the compiled Syncer (tests/robustness checks the same
    with the reference, through an os.fsync hook): an answer after the fsync; a failed fsync fails
    its waiters, and the next durable() with nothing appended since fsyncs the log again."""
    import pytest
    from delayd.broker.pipeline import GroupCommit
    from delayd.storage import native, segments
    from delayd.storage.errors import NotDurable
    from delayd.storage.recovery import open_store
    from delayd.storage.store import NewMessage

    if native.compiled() is None:
        pytest.skip("the compiled batch core is built by pip install")
    fault = tmp_path / "faults"
    monkeypatch.setattr(segments, "FAULTS", segments.Faults(str(fault)))
    store, _report = open_store(tmp_path / "data")
    gc = GroupCommit(store, "always", 1000)
    task = asyncio.create_task(gc.run())
    try:
        store.append_messages([NewMessage("t", b"x", 0)], 0)
        await asyncio.wait_for(gc.durable(), 10)
        assert gc.fsyncs == 1 and isinstance(gc.fsyncer._syncer, native.compiled().Syncer)
        assert gc.durable_end == store.commit.end
        store.append_messages([NewMessage("t", b"y", 0)], 0)
        fault.write_text("fsync-eio")
        with pytest.raises(NotDurable):
            await asyncio.wait_for(gc.durable(), 10)
        fault.write_text("")
        await asyncio.wait_for(gc.durable(), 10)  # nothing appended since the failure
        assert gc.fsyncs == 2, "a durable() after a failed fsync returned without fsyncing the commit log"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()
    assert gc.fsyncer._syncer is None  # the group commit's end stopped the thread


async def test_enqueue_get_held_by_its_limit_indexes_when_the_limit_moves_unannounced(tmp_path):
    """A replicated primary indexes up to its watermark (`limit`). Once the watermark moves,
    enqueue-get indexes up to it even when nothing sets `appended` (the followers' acks came
    before the primary's own fsync, and the fsync woke nobody: the load's last produces were
    never indexed, so never released, in a 500-cycle replicated torture)."""
    from delayd.broker.clock import Clock
    from delayd.broker.pipeline import Pipeline
    from delayd.storage.recovery import open_store
    from delayd.storage.store import NewMessage

    clock = Clock()
    store, _ = open_store(tmp_path / "data", clock_ms=clock.now_ms)
    limit = [store.commit.end]
    p = Pipeline(store, clock, lookahead_ms=0, queue_batches=4, release_capacity=1000,
                 on_release=lambda _rel, _now: None, limit=lambda: limit[0])
    p.start()
    try:
        now = clock.now_ms()
        store.append_messages([NewMessage("t", b"later %d" % i, now + 3_600_000) for i in range(3)], now)
        p.appended.set()  # as produce does: the watermark is not there yet
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 0.2
        while loop.time() < deadline:
            assert store.indexed == 0, "indexed past the limit"
            await asyncio.sleep(0.01)
        limit[0] = store.commit.end  # e.g. the group commit's fsync: no one sets `appended`
        deadline = loop.time() + 10
        while store.indexed < store.commit.end:
            assert loop.time() < deadline, "enqueue-get waited for a wake that never came"
            await asyncio.sleep(0.01)
    finally:
        await p.stop(timeout_s=10)
        store.close()


async def test_group_commit_tells_each_new_durable_end(tmp_path):
    """After each fsync the group commit tells `on_durable` the end it reached (the broker wakes
    a replicated primary's enqueue-get with it: its watermark includes this end)."""
    from delayd.broker.pipeline import GroupCommit
    from delayd.storage.recovery import open_store
    from delayd.storage.store import NewMessage

    store, _report = open_store(tmp_path / "data")
    told: list[int] = []
    gc = GroupCommit(store, "always", 1000, on_durable=told.append)
    task = asyncio.create_task(gc.run())
    try:
        for body in (b"x", b"y"):
            store.append_messages([NewMessage("t", body, 0)], 0)
            await asyncio.wait_for(gc.durable(), 10)
            assert told[-1] == gc.durable_end == store.commit.end
        assert len(told) == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()
