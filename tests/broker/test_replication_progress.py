"""A follower's bookkeeping: one follow task at a time, and its dequeue cursor target
(Replication.carry_target): the primary's read time once the follower has indexed up to the log
end the primary gave with it, or once it waited PROGRESS_WAIT_S (an indexer blocked on a cursor
that stood still must not wait for ever)."""

from __future__ import annotations

import time
from collections import deque
from types import SimpleNamespace

from delayd.broker.replication import PROGRESS_WAIT_S, Replication


def follower(indexed: int) -> Replication:
    r = Replication.__new__(Replication)  # the cursor bookkeeping only: no broker, no etcd
    r.broker = SimpleNamespace(store=SimpleNamespace(indexed=indexed))  # type: ignore[assignment]
    r._progress = deque()
    r._carry_to = 0
    return r


def test_the_target_waits_for_indexing_then_for_a_while_at_most() -> None:
    r = follower(indexed=100)
    now = time.monotonic()
    r._progress.extend([(now, 80, 5_000), (now, 150, 6_000), (now, 400, 7_000)])
    assert r.carry_target() == 5_000  # indexed past 80, not past 150
    r.broker.store.indexed = 200
    assert r.carry_target() == 6_000
    assert r.carry_target() == 6_000 and len(r._progress) == 1
    r._progress[0] = (now - PROGRESS_WAIT_S - 0.1, 400, 7_000)  # heard long ago; indexing stuck at 200
    assert r.carry_target() == 7_000 and not r._progress
    r._progress.append((now, 50, 1_000))  # an older read time never moves the target back
    assert r.carry_target() == 7_000


async def test_a_superseded_follow_task_ends_and_a_cancel_is_never_lost() -> None:
    # _on_change sets "a primary is known" and cancels the follow task in one go, then starts a
    # new one. The old task must end: under Python 3.11's wait_for the cancellation could be
    # dropped when the event was set in the same turn, and two tasks then followed one primary
    # (each saw the other's frames as gaps; both cut the log at once). Seen in a 500-cycle torture.
    import asyncio

    r = Replication.__new__(Replication)
    r.primary_url = None
    r._primary_known = asyncio.Event()
    r._follow_task = asyncio.create_task(r._follow())
    old = r._follow_task
    await asyncio.sleep(0.01)
    assert not old.done()  # the current task waits for a primary
    r._primary_known.set()
    old.cancel()
    r._follow_task = asyncio.create_task(asyncio.sleep(30))
    await asyncio.wait([old], timeout=5)
    assert old.cancelled()
    # A task that is no longer the current one ends at its next look even without a cancel.
    stray = asyncio.create_task(r._follow())
    await asyncio.wait([stray], timeout=5)
    assert stray.done() and not stray.cancelled()
    r._follow_task.cancel()
