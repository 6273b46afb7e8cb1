"""A replicated shard's roles and data path (docs/replication.md): one primary, followers with the
same commit-log bytes, 421 from a follower, writes that wait for the in-sync set, the
min_insync refusal, and a restarted follower that catches up from where it was."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

from tests.support.daemon import wait_until
from tests.support.replicated import LEASE_TTL_MS, MAX_LAG_MS, Cluster


def produce(d: Any, n: int = 5, delay_ms: int = 60_000, topic: str = "t") -> tuple[int, Any]:
    msgs = [{"body": f"m{i}", "delay_ms": delay_ms} for i in range(n)]
    return d.request("POST", f"/v1/topics/{topic}/messages", {"messages": msgs}, timeout_s=30)


def same_logs(c: Cluster, names: list[str]) -> bool:
    logs = [c.log_bytes(n) for n in names]
    return all(x == logs[0] for x in logs)


def test_one_primary_followers_hold_its_bytes_and_answer_421(cluster: Cluster) -> None:
    c = cluster.start()
    p = c.wait_primary()
    followers = [n for n in c.members if n != p]
    c.wait_isr(p, 3)
    for i in range(5):
        status, body = produce(c.members[p], 20, delay_ms=50 * i)
        assert status == 200, body
    wait_until(lambda: same_logs(c, list(c.members)), 10, 0.05, "the same log bytes on every member")
    assert c.log_end(p) > 0
    # Releases are RELEASE records: the followers' ready queues are the same, so are the counts.
    wait_until(lambda: all(c.get(n, "/v1/stats")[1]["delivered_total"] == 100 for n in c.members), 10, 0.05,
               "every member counts the 100 deliveries")
    # The followers' dequeue cursors follow the primary's past the slots it dispatched (a cursor
    # that stood still would stop the follower indexing after about two roll windows).
    dispatched = int(time.time() * 1000)
    wait_until(lambda: all(c.cluster(n)["read_time_ms"] >= dispatched for n in c.members), 10, 0.05,
               "every member's dequeue cursor past the deliveries")
    url = c.members[p].url
    for f in followers:
        d = c.members[f]
        for method, path, body in (("POST", "/v1/topics/t/messages", {"messages": [{"body": "x"}]}),
                                   ("DELETE", "/v1/messages/s0-1", None),
                                   ("GET", "/v1/messages/s0-1", None),
                                   ("GET", "/v1/topics/t/keys/k", None),
                                   ("PUT", "/v1/topics/t/subscriptions/g", {}),
                                   ("POST", "/v1/topics/t/subscriptions/g/pull", {"max": 1})):
            status, answer = d.request(method, path, body)
            assert status == 421, (method, path, status, answer)
            assert answer["error"]["code"] == "not_primary" and answer["error"]["primary"] == url
        status, info = c.get(f, "/v1/info")
        assert info["role"] == "follower" and info["primary"] == url
        cl = c.cluster(f)
        assert cl["primary"]["member"] == p and cl["role"] == "follower"
    cl = c.cluster(p)
    assert sorted(cl["isr"]["members"]) == sorted(c.members) and cl["role"] == "primary"
    assert all(m["lag_bytes"] is not None for m in cl["members"])
    assert c.get(p, "/v1/info")[1]["role"] == "primary"
    with urllib.request.urlopen(c.members[p].url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'delayd_replication_role{role="primary"} 1.0' in text and "delayd_replication_isr_size 3.0" in text
    assert "delayd_replication_follower_lag_bytes{" in text and "delayd_replication_elections_total 1.0" in text
    # SIGTERM of the primary with its followers streaming: it steps down and exits at once (its
    # streams are closed when shutdown begins, not after aiohttp's wait for open handlers), and
    # another member is elected without waiting for the lease to run out.
    t0 = time.monotonic()
    assert c.members[p].stop(timeout_s=10) == 0
    assert time.monotonic() - t0 < 3, f"the primary took {time.monotonic() - t0:.1f}s to stop"
    c.wait_primary(timeout_s=3, exclude=p)


def test_writes_wait_for_the_in_sync_set_then_refuse_below_min_insync(cluster: Cluster) -> None:
    c = cluster.start()
    p = c.wait_primary()
    c.wait_isr(p, 3)
    f1, f2 = [n for n in c.members if n != p]
    assert produce(c.members[p])[0] == 200
    # A frozen follower holds writes up until its registration lapses (one lease) or it lags
    # max_lag_ms; then it leaves the set and the write is answered (two copies remain).
    c.stop(f1)
    t0 = time.monotonic()
    status, body = produce(c.members[p])
    waited = time.monotonic() - t0
    assert status == 200, body
    assert LEASE_TTL_MS / 1000 * 0.5 <= waited <= MAX_LAG_MS / 1000 + 1, waited
    assert sorted(c.isr(p)) == sorted([p, f2])
    # The other one killed: its stream ends, it leaves the set at once, and the write that
    # waited for it is refused (stored on the primary, not acknowledged) ...
    answers: list[tuple[int, Any]] = []
    t = threading.Thread(target=lambda: answers.append(produce(c.members[p])))
    c.kill9(f2)
    t.start()
    t.join(30)
    assert answers and answers[0][0] == 503, answers
    assert answers[0][1]["error"]["code"] in ("under_replicated", "insufficient_replicas"), answers
    # ... and every later write before anything is stored, with Retry-After.
    end = c.log_end(p)
    status, body = produce(c.members[p])
    assert status == 503 and body["error"]["code"] == "insufficient_replicas", body
    assert c.log_end(p) == end
    # Back: the followers catch up, rejoin the set, and writes are taken again.
    c.cont(f1)
    c.restart(f2)
    c.wait_isr(p, 3)
    assert produce(c.members[p])[0] == 200
    wait_until(lambda: same_logs(c, list(c.members)), 10, 0.05, "the same log bytes on every member")


def test_a_restarted_follower_catches_up_from_its_position(cluster: Cluster) -> None:
    c = cluster.start()
    p = c.wait_primary()
    c.wait_isr(p, 3)
    f = [n for n in c.members if n != p][0]
    for _ in range(3):
        assert produce(c.members[p], 50)[0] == 200
    wait_until(lambda: c.log_end(f) == c.log_end(p), 10, 0.05, "the follower caught up")
    c.kill9(f)
    had = c.log_end(f)
    assert had > 0
    for _ in range(3):
        assert produce(c.members[p], 50)[0] == 200
    c.restart(f)
    wait_until(lambda: same_logs(c, list(c.members)), 15, 0.05, "the same log bytes on every member")
    c.wait_isr(p, 3)
    starts = [line for line in c.members[p].log_tail(400).splitlines() if f"{f} streams from offset" in line]
    assert starts and f"{f} streams from offset {had} " in starts[-1], starts  # not from 0: no full copy
    assert f"{f} streams from offset 0 " in starts[0]  # (its first stream, when the log was empty)
