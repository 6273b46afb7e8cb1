"""kill -9 of the primary under a steady produce/cancel/consume load: a follower is primary
within 5 s, and nothing acknowledged is lost — produces, cancels, acks — and nothing is early."""

from __future__ import annotations

import time

from tests.support.daemon import wait_until
from tests.support.replicated import Cluster
from tests.support.replicated_load import Load


def test_kill9_of_the_primary_under_load_loses_nothing_acknowledged(cluster: Cluster) -> None:
    c = cluster.start()
    p = c.wait_primary()
    c.wait_isr(p, 3)
    load = Load([d.url for d in c.members.values()], seed=16).start()
    try:
        wait_until(lambda: len(load.produced) > 200 and len(load.acked) > 20, 30, 0.05, "load running")
        c.kill9(p)
        t0 = time.monotonic()
        q = c.wait_primary(10, exclude=p)
        took = time.monotonic() - t0
        assert took < 5.0, f"a follower became primary after {took:.2f}s"
        n = len(load.produced)
        wait_until(lambda: len(load.produced) > n + 100, 30, 0.05, "produces acknowledged by the new primary")
        c.restart(p)  # the old primary rejoins as a follower
        wait_until(lambda: c.role(p) == "follower", 20, 0.05, "the old primary follows")
        time.sleep(1.0)
    finally:
        load.stop()
    bad = load.violations()
    assert not bad, load.report(bad)
    assert q != p and len(load.cancel_sent) > 5, load.summary()
    wait_until(lambda: c.log_bytes(p) == c.log_bytes(q), 15, 0.1, "the old primary holds the new one's log")
