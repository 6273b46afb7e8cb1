"""Delivery guarantees against the real daemon: exactly once per group, never early, roll."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tests.integration.helpers import drain, now_ms, percentile, produce, pull
from tests.support.daemon import DaemonProcess

TINY_WINDOW = "precision_ms = 100\nroll_window_ms = 2000\ncheckpoint_interval_ms = 200\n"


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path / "data").start()
    yield d
    d.stop()


def test_ten_thousand_messages_once_per_group_never_early(daemon):
    rng = random.Random(7)
    sent = {}
    for _ in range(10):
        batch = [{"body": f"m{rng.random()}", "delay_ms": rng.randint(0, 3000)} for _ in range(1000)]
        for m in produce(daemon, "load", batch):
            sent[m["id"]] = m["deliver_at"]
    assert len(sent) == 10_000
    for group in ("g1", "g2"):
        got = drain(daemon, "load", group, 10_000, timeout_s=60)
        ids = Counter(m["id"] for m in got)
        assert set(ids) == set(sent), f"{group}: {len(set(sent) - set(ids))} missing"
        assert max(ids.values()) == 1, f"{group}: duplicates {[i for i, c in ids.items() if c > 1][:5]}"
        early = [m for m in got if m["delivered_at"] < m["deliver_at"]]
        assert not early, f"{len(early)} delivered before deliver_at"
        lateness = [m["delivered_at"] - m["deliver_at"] for m in got]
        print(f"{group}: lateness p50={percentile(lateness, .5)} ms p99={percentile(lateness, .99)} ms "
              f"max={max(lateness)} ms over {len(got)} messages")
    status, stats = daemon.request("GET", "/v1/stats")
    assert stats["delivered_total"] == 10_000 and stats["scheduled"] == 0


def test_rolled_messages_arrive_on_time(tmp_path):
    """A 2 s roll window and messages due 4-9 s out: each rolls a few times, none is early or lost."""
    d = DaemonProcess(tmp_path / "data", config_text=TINY_WINDOW).start()
    try:
        base = now_ms()
        msgs = [{"body": f"r{i}", "deliver_at": base + 4000 + i * 50} for i in range(100)]
        ids = {m["id"] for m in produce(d, "roll", msgs)}
        status, stats = d.request("GET", "/v1/stats")
        got = drain(d, "roll", "g", 100, timeout_s=30)
        assert {m["id"] for m in got} == ids
        assert all(m["delivered_at"] >= m["deliver_at"] for m in got)
        late = [m["delivered_at"] - m["deliver_at"] for m in got]
        assert percentile(late, 0.99) < 500, late
        status, stats = d.request("GET", "/v1/stats")
        assert stats["rolled_total"] >= 100, stats
    finally:
        d.stop()


def test_cancel_before_due_is_never_delivered(daemon):
    ids = [m["id"] for m in produce(daemon, "c1", [{"body": str(i), "delay_ms": 1500} for i in range(50)])]
    for i in ids[:25]:
        status, body = daemon.request("DELETE", f"/v1/messages/{i}")
        assert (status, body) == (200, {"id": i, "state": "cancelled"})
    status, body = daemon.request("DELETE", f"/v1/messages/{ids[0]}")
    assert (status, body["state"]) == (200, "cancelled"), "cancel is idempotent"
    got = drain(daemon, "c1", "g", 25, timeout_s=15)
    assert {m["id"] for m in got} == set(ids[25:])
    assert not pull(daemon, "c1", "g", wait_ms=1000)
    status, body = daemon.request("DELETE", f"/v1/messages/{ids[30]}")
    assert status == 409 and body["error"]["code"] == "already_delivered"
    assert daemon.request("DELETE", "/v1/messages/d-ffffff")[0] == 404
    assert daemon.request("GET", f"/v1/messages/{ids[0]}")[1]["state"] == "cancelled"


def test_cancel_racing_the_due_time(daemon):
    """Each cancel either wins (200 and never delivered) or loses (409 and delivered)."""
    base = now_ms() + 1500
    msgs = [{"body": str(i), "deliver_at": base + (i % 40)} for i in range(400)]
    ids = [m["id"] for m in produce(daemon, "race", msgs)]
    outcome = {}
    while now_ms() < base - 300:
        pass
    for i in ids:
        status, _ = daemon.request("DELETE", f"/v1/messages/{i}")
        assert status in (200, 409)
        outcome[i] = status
    won = {i for i, s in outcome.items() if s == 200}
    lost = {i for i, s in outcome.items() if s == 409}
    got = drain(daemon, "race", "g", len(lost), timeout_s=15)
    assert not pull(daemon, "race", "g", wait_ms=800)
    assert {m["id"] for m in got} == lost
    print(f"cancel race: {len(won)} cancelled in time, {len(lost)} too late")


def test_cancel_of_rolled_message_and_after_restart(tmp_path):
    d = DaemonProcess(tmp_path / "data", config_text=TINY_WINDOW).start()
    try:
        base = now_ms()
        ids = [m["id"] for m in produce(d, "cr", [{"body": str(i), "deliver_at": base + 5000} for i in range(20)])]
        # Let them roll at least once (window 2 s), then cancel half.
        from tests.support.daemon import wait_until
        wait_until(lambda: d.request("GET", "/v1/stats")[1]["rolled_total"] >= 20, 10, what="rolls")
        for i in ids[:10]:
            assert d.request("DELETE", f"/v1/messages/{i}")[0] == 200
        d.kill9()
        d.start()
        for i in ids[:10]:
            assert d.request("DELETE", f"/v1/messages/{i}")[0] == 200
            assert d.request("GET", f"/v1/messages/{i}")[1]["state"] == "cancelled"
        assert d.request("DELETE", f"/v1/messages/{ids[10]}")[0] == 200  # cancel after the restart
        got = drain(d, "cr", "g", 9, timeout_s=20)
        assert not pull(d, "cr", "g", wait_ms=1500)
        assert {m["id"] for m in got} == set(ids[11:])
    finally:
        d.stop()
