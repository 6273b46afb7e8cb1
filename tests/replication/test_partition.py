"""A primary frozen (SIGSTOP) for longer than its lease, then woken (SIGCONT): another member took
over meanwhile; the old one acknowledges nothing after its fence, cuts its log back to the new
primary's and rejoins as a follower."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.support.daemon import wait_until
from tests.support.replicated import LEASE_TTL_MS, Cluster


def test_a_primary_frozen_past_its_lease_acks_nothing_after_and_rejoins_as_follower(cluster: Cluster) -> None:
    c = cluster.start()
    p = c.wait_primary()
    c.wait_isr(p, 3)
    old = c.members[p]
    answers: list[tuple[float, int, Any]] = []  # (received, status, body) of writes sent to the old primary
    stop = threading.Event()

    def hammer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            status, body = old.request("POST", "/v1/topics/t/messages",
                                       {"messages": [{"body": f"p{i}", "delay_ms": 100}]}, timeout_s=30)
            answers.append((time.monotonic(), status, body))

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: sum(1 for a in answers if a[1] == 200) > 30, 20, 0.01, "writes acknowledged")
    c.stop(p)
    frozen = time.monotonic()
    q = c.wait_primary(15, exclude=p)
    assert q != p
    new = c.members[q]
    for i in range(5):
        r = new.request("POST", "/v1/topics/t/messages", {"messages": [{"body": f"q{i}"}]})
        assert r[0] == 200, r
    wait_until(lambda: time.monotonic() - frozen > 2 * LEASE_TTL_MS / 1000, 10, 0.05, "longer than the lease")
    c.cont(p)
    woke = time.monotonic()
    wait_until(lambda: c.role(p) == "follower", 20, 0.05, "the old primary follows")
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(40)
    # An answer the old primary had decided (fence checked, every in-sync member had the write)
    # just before it froze leaves the process when it wakes: such a write is on the new primary.
    # Nothing it decides after waking is a 200.
    late = [(at - woke, body) for at, status, body in answers if at > woke and status == 200]
    for after_s, body in late:
        assert after_s < 0.5, f"the old primary acknowledged a write {after_s:.3f}s after it woke: {body}"
        for m in body["messages"]:
            status, state = new.request("GET", f"/v1/messages/{m['id']}")
            assert status == 200, f"{m['id']}, answered by the old primary as it woke, is not on the new one"
    refused = [a for a in answers if a[0] > woke and a[1] != 200]
    assert refused and all(s in (421, 503) for _at, s, _b in refused), refused[:5]
    assert len(refused) > len(late)
    # It holds exactly the new primary's log (whatever it had beyond was cut), and follows it.
    wait_until(lambda: c.log_bytes(p) == c.log_bytes(q), 20, 0.1, "the old primary holds the new primary's log")
    assert c.cluster(p)["primary"]["member"] == q
    c.wait_isr(q, 3)
    assert new.request("POST", "/v1/topics/t/messages", {"messages": [{"body": "after"}]})[0] == 200
    wait_until(lambda: c.log_bytes(p) == c.log_bytes(q), 20, 0.1, "and goes on receiving it")
