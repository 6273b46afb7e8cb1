"""A follower's dequeue cursor target (Replication.carry_target): the primary's read time once the
follower has indexed up to the log end the primary gave with it, or once it waited
PROGRESS_WAIT_S (an indexer blocked on a cursor that stood still must not wait for ever)."""

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
