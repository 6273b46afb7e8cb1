"""Showing and deleting a subscription group on a real daemon (docs/api.md, Additions)."""

from __future__ import annotations

import threading

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.wire import Api, assert_error, daemon_log_clean, ok
from tests.support.daemon import DaemonProcess, wait_until


def group_series(api: Api, topic: str, group: str) -> list[str]:
    text = api.call("GET", "/metrics").raw.decode()
    return sorted({s.name for f in text_string_to_metric_families(text) for s in f.samples
                   if s.labels.get("topic") == topic and s.labels.get("group") == group})


def test_show_does_not_create_and_reports_counts(api: Api) -> None:
    t = "show-t"
    assert_error(api.call("GET", f"/v1/topics/{t}/subscriptions/g"), 404, "not_found")
    assert_error(api.call("GET", f"/v1/topics/{t}/subscriptions/g"), 404, "not_found"), "looking created it"
    api.subscribe(t, "g", max_attempts=4)
    api.produce(t, {"body": "a"}, {"body": "b"}, {"body": "c"})
    (m,) = api.pull_until(t, "g", 1)
    wait_until(lambda: ok(api.call("GET", f"/v1/topics/{t}/subscriptions/g"))["backlog"] == 2, 10,
               what="backlog 2")
    shown = ok(api.call("GET", f"/v1/topics/{t}/subscriptions/g"))
    assert shown["topic"] == t and shown["group"] == "g" and shown["max_attempts"] == 4
    assert (shown["inflight"], shown["dead"]) == (1, 0)
    assert shown["oldest_unacked_age_ms"] >= 0
    api.ack(t, "g", [m["receipt"]])
    assert ok(api.call("GET", f"/v1/topics/{t}/subscriptions/g"))["inflight"] == 0


def test_delete_removes_the_group_its_state_and_its_metrics(api: Api) -> None:
    t = "del-t"
    api.produce(t, {"body": "a"}, {"body": "b"})
    got = api.pull_until(t, "typo", 2)
    api.ack(t, "typo", [got[0]["receipt"]])
    assert "delayd_group_backlog" in group_series(api, t, "typo")
    assert f"{t}/typo" in api.stats()["groups"]
    assert ok(api.call("DELETE", f"/v1/topics/{t}/subscriptions/typo")) == {
        "topic": t, "group": "typo", "deleted": True}
    assert group_series(api, t, "typo") == [], "every series of the group is gone from /metrics"
    assert f"{t}/typo" not in api.stats()["groups"]
    assert_error(api.call("GET", f"/v1/topics/{t}/subscriptions/typo"), 404, "not_found")
    assert_error(api.call("DELETE", f"/v1/topics/{t}/subscriptions/typo"), 404, "not_found")
    # The old lease died with the group: its receipt is stale for a group of the same name.
    assert api.ack(t, "typo", [got[1]["receipt"]]) == {"acked": 0, "stale": [got[1]["receipt"]]}
    # Used again, the name is a new group from the earliest message: both come back.
    assert len(api.pull_until(t, "typo", 2)) == 2


def test_delete_ends_a_waiting_long_poll(api: Api) -> None:
    t = "del-poll"
    api.subscribe(t, "g")
    answer: list[int] = []
    poller = threading.Thread(target=lambda: answer.append(len(api.pull(t, "g", wait_ms=20_000))))
    poller.start()

    def poll_ended() -> bool:
        # Delete until the 20 s long-poll ends: a poll that arrived after a delete re-created
        # the group, and the next delete must end it just the same.
        assert api.call("DELETE", f"/v1/topics/{t}/subscriptions/g").status in (200, 404)
        return not poller.is_alive()
    wait_until(poll_ended, 5, 0.2, "the long-poll to end")
    assert answer == [0], "it returned empty"


def test_delete_survives_kill_9_and_restart(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        api = Api(d)
        api.produce("dur", {"body": "a"})
        api.pull_until("dur", "keep", 1, ack=True)
        api.pull_until("dur", "gone", 1, ack=True)
        ok(api.call("DELETE", "/v1/topics/dur/subscriptions/gone"))
        d.restart()  # kill -9: the delete was answered, so it is durable
        assert_error(api.call("GET", "/v1/topics/dur/subscriptions/gone"), 404, "not_found")
        assert ok(api.call("GET", "/v1/topics/dur/subscriptions/keep"))["backlog"] == 0, "the other kept its acks"
        assert set(api.stats()["groups"]) == {"dur/keep"}
        d.stop()
        d.start()  # and after a graceful stop, which checkpoints without the group
        assert set(api.stats()["groups"]) == {"dur/keep"}
        assert len(api.pull_until("dur", "gone", 1)) == 1, "re-created from the earliest message"
    finally:
        d.stop()
    daemon_log_clean(d)
