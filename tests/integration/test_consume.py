"""Consuming from a real daemon: subscriptions, pull/long-poll, leases, ack/nack/extend, dead
letters, tag filters, encodings, message states, and what survives a restart (API.md, Consume).

One daemon serves the module; every test works on its own topic so they cannot interfere.
Waiting is always a long-poll or a poll with a deadline; the only time measurements are
lower bounds the broker must respect (never early) and generous upper bounds.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import pytest

from tests.integration.wire import JSON, MSGPACK, Api, assert_error, daemon_log_clean, now_ms, ok
from tests.support.daemon import DaemonProcess, wait_until

# The daemon's clock and the test's clock are the same host clock; the broker anchors it at
# start and advances it monotonically, so the two agree to well under this.
CLOCK_SLACK_MS = 20


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return ("t-" + re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name))[:128]


def ids(msgs: list[dict]) -> list[str]:
    return [m["id"] for m in msgs]


def receipts(msgs: list[dict]) -> list[str]:
    return [m["receipt"] for m in msgs]


# -- subscriptions ----------------------------------------------------------------------------
def test_subscription_put_returns_settings_and_updates_max_attempts(api: Api, topic: str) -> None:
    assert api.subscribe(topic, "g", start="earliest", max_attempts=5) == \
        {"topic": topic, "group": "g", "start": "earliest", "max_attempts": 5}
    assert api.subscribe(topic, "g", max_attempts=7)["max_attempts"] == 7
    assert api.subscribe(topic, "g")["max_attempts"] == 7, "an empty PUT keeps the settings"
    assert api.subscribe(topic, "fresh")["max_attempts"] == 16, "API.md default"


def test_start_latest_skips_what_is_already_due_earliest_gets_it(api: Api, topic: str) -> None:
    old = ids(api.produce(topic, *({"body": f"old{i}"} for i in range(3))))
    wait_until(lambda: all(api.state(i) == "delivered" for i in old), 10, what="old messages released")
    api.subscribe(topic, "late", start="latest")
    api.subscribe(topic, "early", start="earliest")
    new = ids(api.produce(topic, {"body": "new"}))
    assert ids(api.pull_until(topic, "late", 1)) == new
    assert not api.pull(topic, "late", wait_ms=300)
    assert sorted(ids(api.pull_until(topic, "early", 4, ack=True))) == sorted(old + new)
    # `start` only places a new group: a PUT on an existing one does not move it.
    assert api.subscribe(topic, "late", start="earliest")["group"] == "late"
    assert api.subscribe(topic, "early", start="latest")["group"] == "early"
    assert api.pull(topic, "late", wait_ms=200) == []
    assert api.pull(topic, "early", wait_ms=200) == []


def test_first_pull_creates_group_at_earliest(api: Api, topic: str) -> None:
    sent = ids(api.produce(topic, {"body": "a"}, {"body": "b"}))
    wait_until(lambda: all(api.state(i) == "delivered" for i in sent), 10, what="released")
    assert sorted(ids(api.pull_until(topic, "implicit", 2))) == sorted(sent)


# -- never early, long-poll -------------------------------------------------------------------
def test_pull_returns_nothing_before_due_and_the_message_after(api: Api, topic: str) -> None:
    (p,) = api.produce(topic, {"body": "later", "delay_ms": 1500})
    assert api.pull(topic, "g") == []
    # A long-poll that ends well before the due time must come back empty too.
    assert api.pull(topic, "g", wait_ms=500) == []
    assert now_ms() < p["deliver_at"], "the test itself ran too slowly to check 'before due'"
    (m,) = api.pull_until(topic, "g", 1)
    received = now_ms()
    assert m["id"] == p["id"] and m["deliver_at"] == p["deliver_at"]
    assert m["delivered_at"] >= m["deliver_at"]
    assert received >= m["deliver_at"] - CLOCK_SLACK_MS
    assert m["attempt"] == 1 and m["body"] == "later" and m["topic"] == topic


def test_spread_due_times_are_never_delivered_early(api: Api, topic: str) -> None:
    base = now_ms()
    sent = api.produce(topic, *({"body": str(i), "deliver_at": base + 300 + i * 90} for i in range(20)))
    due = {p["id"]: p["deliver_at"] for p in sent}
    got: list[dict] = []
    deadline = time.monotonic() + 15
    while len(got) < len(sent) and time.monotonic() < deadline:
        batch = api.pull(topic, "g", wait_ms=200)
        received = now_ms()
        for m in batch:
            assert m["delivered_at"] >= m["deliver_at"] == due[m["id"]], m
            assert received >= m["deliver_at"] - CLOCK_SLACK_MS, (received, m)
        got.extend(batch)
    assert sorted(ids(got)) == sorted(due)


def test_long_poll_wakes_as_soon_as_the_message_is_due(api: Api, topic: str) -> None:
    api.subscribe(topic, "g")
    (p,) = api.produce(topic, {"body": "soon", "delay_ms": 1000})
    t0 = time.monotonic()
    got = api.pull(topic, "g", wait_ms=10_000)
    returned = now_ms()
    assert ids(got) == [p["id"]], "the long-poll ended without the message"
    assert returned >= p["deliver_at"] - CLOCK_SLACK_MS
    # Generous: the broker's own lateness is a few ms; allow for a loaded test machine.
    assert returned - p["deliver_at"] < 500, f"woke {returned - p['deliver_at']} ms after deliver_at"
    assert time.monotonic() - t0 < 5


def test_long_poll_wakes_on_a_produce_and_times_out_empty(api: Api, topic: str) -> None:
    api.subscribe(topic, "g")
    t0 = time.monotonic()
    assert api.pull(topic, "g", wait_ms=400) == []
    assert time.monotonic() - t0 >= 0.35, "wait_ms was not honoured"
    with ThreadPoolExecutor(1) as pool:
        # Whether the produce lands before or during the long-poll, the pull must answer at once.
        fut = pool.submit(api.pull, topic, "g", wait_ms=10_000)
        t1 = time.monotonic()
        (p,) = api.produce(topic, {"body": "now"})
        got = fut.result(timeout=15)
    assert ids(got) == [p["id"]]
    assert time.monotonic() - t1 < 2


# -- groups -----------------------------------------------------------------------------------
def test_fan_out_every_group_gets_every_message(api: Api, topic: str) -> None:
    sent = ids(api.produce(topic, *({"body": str(i)} for i in range(10))))
    for group in ("g1", "g2"):
        got = api.pull_until(topic, group, 10, ack=True)
        assert sorted(ids(got)) == sorted(sent), group
        assert not api.pull(topic, group, wait_ms=200), f"{group} got more than it should"


def test_competing_consumers_in_one_group_get_disjoint_messages(api: Api, topic: str) -> None:
    api.subscribe(topic, "g")
    with ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(api.pull, topic, "g", max=10, wait_ms=10_000) for _ in range(2)]
        sent = ids(api.produce(topic, *({"body": str(i)} for i in range(30))))
        first = [f.result(timeout=20) for f in futs]
    assert all(first), "both long-polls should have been served"
    rest = api.pull_until(topic, "g", 30 - sum(map(len, first)))
    all_ids = [i for batch in first for i in ids(batch)] + ids(rest)
    assert len(all_ids) == len(set(all_ids)) == 30, "a message went to two consumers of one group"
    assert set(all_ids) == set(sent)
    assert not api.pull(topic, "g", wait_ms=200)


# -- leases, ack, nack, extend ----------------------------------------------------------------
def test_lease_expiry_redelivers_with_the_next_attempt(api: Api, topic: str) -> None:
    (p,) = api.produce(topic, {"body": "x"})
    t_pull = time.monotonic()
    (m1,) = api.pull_until(topic, "g", 1, lease_ms=1000)
    assert m1["attempt"] == 1
    assert api.pull(topic, "g") == [], "a leased message is not handed out twice"
    # One long-poll: it must wake when the lease runs out, not at the end of wait_ms.
    (m2,) = api.pull(topic, "g", wait_ms=8000, lease_ms=1000)
    waited = time.monotonic() - t_pull
    assert 0.95 <= waited < 3.0, f"redelivered {waited:.3f} s after the pull (lease 1 s)"
    assert (m2["id"], m2["attempt"]) == (p["id"], 2)
    assert m2["receipt"] != m1["receipt"]
    assert api.ack(topic, "g", [m1["receipt"]]) == {"acked": 0, "stale": [m1["receipt"]]}
    assert api.ack(topic, "g", [m2["receipt"]]) == {"acked": 1, "stale": []}


def test_ack_prevents_redelivery_and_a_second_ack_is_stale(api: Api, topic: str) -> None:
    sent = ids(api.produce(topic, *({"body": str(i)} for i in range(3))))
    got = api.pull_until(topic, "g", 3, lease_ms=1000)
    by_id = {m["id"]: m for m in got}
    keep, drop = [by_id[sent[0]], by_id[sent[1]]], by_id[sent[2]]
    res = api.ack(topic, "g", receipts(keep) + ["d-1.0.unknown"])
    assert res == {"acked": 2, "stale": ["d-1.0.unknown"]}
    assert api.ack(topic, "g", [keep[0]["receipt"]]) == {"acked": 0, "stale": [keep[0]["receipt"]]}
    # After the 1 s lease only the unacked message comes back.
    (again,) = api.pull_until(topic, "g", 1, timeout_s=5, lease_ms=1000)
    assert (again["id"], again["attempt"]) == (drop["id"], 2)
    assert api.ack(topic, "g", [again["receipt"]])["acked"] == 1
    assert api.pull(topic, "g", wait_ms=1300) == [], "an acked message came back"



def test_msgpack_acks_of_one_pull_and_of_every_other_kind(api: Api, topic: str) -> None:
    """A msgpack ack of what one pull gave is read by the batch core in place (Broker.ack_raw);
    any other msgpack ack (two pulls' receipts, a repeat, acked ones, other shapes, too many
    receipts) answers what the decoded body answers."""
    api.produce(topic, *({"body": str(i)} for i in range(6)))
    api.pull_until(topic, "probe", 6)  # all six are ready: each pull of `g` below is one lease
    first, second = (receipts(api.pull(topic, "g", fmt=MSGPACK, max=3, lease_ms=60_000)) for _ in range(2))
    assert len(first) == len(second) == 3
    path = f"/v1/topics/{topic}/subscriptions/g/ack"

    def ack(body: Any) -> Any:
        return api.call("POST", path, body, fmt=MSGPACK)

    assert ok(ack({"receipts": first[:1] + second[:1]})) == {"acked": 2, "stale": []}, "two pulls' receipts"
    assert ok(ack({"receipts": first[1:] + first[1:2]})) == {"acked": 2, "stale": [first[1]]}, "a repeat"
    assert ok(ack({"receipts": second[:0:-1]})) == {"acked": 2, "stale": []}, "one pull's, in any order"
    assert ok(ack({"receipts": second[1:]})) == {"acked": 0, "stale": second[1:]}, "acked already"
    assert ok(ack({"receipts": []})) == {"acked": 0, "stale": []}
    for bad in ({"receipts": second, "x": 1}, {"receipts": [1]}, {"ids": second}, {"receipts": ["a"] * 10_001},
                [second], {"receipts": [s.encode() for s in second]}):
        assert_error(ack(bad), 400)
    tail = msgpack.packb({"receipts": first}) + b"\x00"
    assert_error(api.call("POST", path, raw=tail, content_type=MSGPACK), 400)
    assert api.pull(topic, "g", wait_ms=0) == [], "every message was acked"


def test_nack_with_delay_redelivers_after_the_delay_not_before(api: Api, topic: str) -> None:
    api.produce(topic, {"body": "x"})
    (m,) = api.pull_until(topic, "g", 1)
    t_nack = time.monotonic()
    assert api.settle(topic, "g", "nack", [m["receipt"]], delay_ms=1500) == {"nacked": 1, "stale": []}
    assert api.pull(topic, "g") == [], "redelivered before delay_ms"
    # One long-poll: it must wake when the delay is over, not at the end of wait_ms.
    (again,) = api.pull(topic, "g", wait_ms=8000)
    waited = time.monotonic() - t_nack
    assert 1.5 <= waited < 3.0, f"redelivered {waited:.3f} s after a nack with delay_ms=1500"
    assert (again["id"], again["attempt"]) == (m["id"], 2)
    assert api.settle(topic, "g", "nack", [m["receipt"]]) == {"nacked": 0, "stale": [m["receipt"]]}


def test_nack_without_delay_uses_backoff_of_about_one_second(api: Api, topic: str) -> None:
    api.produce(topic, {"body": "x"})
    (m,) = api.pull_until(topic, "g", 1)
    t_nack = time.monotonic()
    api.settle(topic, "g", "nack", [m["receipt"]])
    assert api.pull(topic, "g", wait_ms=600) == [], "attempt 1 backs off ~1 s"
    (again,) = api.pull_until(topic, "g", 1, timeout_s=5)
    waited = time.monotonic() - t_nack
    assert 1.0 <= waited < 3.0, waited
    assert again["attempt"] == 2


def test_nack_with_zero_delay_redelivers_at_once(api: Api, topic: str) -> None:
    api.produce(topic, {"body": "x"})
    (m,) = api.pull_until(topic, "g", 1)
    api.settle(topic, "g", "nack", [m["receipt"]], delay_ms=0)
    (again,) = api.pull_until(topic, "g", 1, timeout_s=2)
    assert again["attempt"] == 2


def test_ack_after_the_lease_expired_is_stale(api: Api, topic: str) -> None:
    api.produce(topic, {"body": "x"})
    (m,) = api.pull_until(topic, "g", 1, lease_ms=1000)
    wait_until(lambda: api.stats()["groups"][f"{topic}/g"]["inflight"] == 0, 5, 0.05, "lease expiry")
    assert api.ack(topic, "g", [m["receipt"]]) == {"acked": 0, "stale": [m["receipt"]]}
    assert api.settle(topic, "g", "extend", [m["receipt"]], lease_ms=5000) == \
        {"extended": 0, "stale": [m["receipt"]]}
    (again,) = api.pull_until(topic, "g", 1)
    assert again["attempt"] == 2 and again["id"] == m["id"]


def test_a_receipt_only_settles_in_its_own_group(api: Api, topic: str) -> None:
    api.produce(topic, {"body": "x"})
    (m1,) = api.pull_until(topic, "g1", 1)
    (m2,) = api.pull_until(topic, "g2", 1)
    assert api.ack(topic, "g2", [m1["receipt"]]) == {"acked": 0, "stale": [m1["receipt"]]}
    assert api.ack(topic, "other", [m1["receipt"]])["acked"] == 0
    assert api.ack(topic, "g1", [m1["receipt"]])["acked"] == 1
    assert api.ack(topic, "g2", [m2["receipt"]])["acked"] == 1


def test_pull_honours_max(api: Api, topic: str) -> None:
    sent = ids(api.produce(topic, *({"body": str(i)} for i in range(5))))
    wait_until(lambda: all(api.state(i) == "delivered" for i in sent), 10, what="released")
    assert len(api.pull(topic, "g", max=2)) == 2
    assert len(api.pull(topic, "g", max=2)) == 2
    assert len(api.pull(topic, "g", max=2)) == 1
    assert api.pull(topic, "g", max=2) == []


def test_extend_keeps_a_message_leased_past_its_original_lease(api: Api, topic: str) -> None:
    api.produce(topic, {"body": "x"})
    (m,) = api.pull_until(topic, "g", 1, lease_ms=1000)
    t_leased = time.monotonic()
    res = api.settle(topic, "g", "extend", [m["receipt"], "d-0.0.nope"], lease_ms=4000)
    assert res == {"extended": 1, "stale": ["d-0.0.nope"]}
    # Long-poll well past the original 1 s lease: the message must stay with its consumer.
    assert api.pull(topic, "g", wait_ms=1600) == []
    assert time.monotonic() - t_leased > 1.5
    assert api.ack(topic, "g", [m["receipt"]]) == {"acked": 1, "stale": []}


# -- dead letters -----------------------------------------------------------------------------
def test_dead_letter_after_max_attempts_of_nacks(api: Api, topic: str) -> None:
    api.subscribe(topic, "g", max_attempts=2)
    (p,) = api.produce(topic, {"body": "poison", "tag": "t1", "headers": {"h": "v"}})
    for attempt in (1, 2):
        (m,) = api.pull_until(topic, "g", 1)
        assert m["attempt"] == attempt
        api.settle(topic, "g", "nack", [m["receipt"]], delay_ms=0)
    assert api.pull(topic, "g", wait_ms=300) == [], "a dead letter must not be delivered"
    (d,) = api.dead(topic, "g")
    assert d["id"] == p["id"] and d["attempt"] == 2 and d["reason"] == "nacked"
    assert d["body"] == "poison" and d["tag"] == "t1" and d["headers"] == {"h": "v"}
    assert d["topic"] == topic and d["deliver_at"] == p["deliver_at"]
    assert api.stats()["groups"][f"{topic}/g"]["dead"] == 1


def test_dead_letter_after_max_attempts_of_lease_expiries(api: Api, topic: str) -> None:
    api.subscribe(topic, "g", max_attempts=1)
    (p,) = api.produce(topic, {"body": "slow"})
    api.pull_until(topic, "g", 1, lease_ms=1000)
    wait_until(lambda: api.pull(topic, "g") == [] and api.dead(topic, "g"), 5, 0.05, "dead letter")
    (d,) = api.dead(topic, "g")
    assert d["id"] == p["id"] and d["attempt"] == 1 and isinstance(d["reason"], str) and d["reason"]


def test_redrive_by_ids_then_all(api: Api, topic: str) -> None:
    api.subscribe(topic, "g", max_attempts=1)
    sent = ids(api.produce(topic, *({"body": str(i)} for i in range(3))))
    got = api.pull_until(topic, "g", 3)
    assert api.settle(topic, "g", "nack", receipts(got), delay_ms=0)["nacked"] == 3
    assert sorted(ids(api.dead(topic, "g"))) == sorted(sent)
    assert api.dead(topic, "g", limit=2) and len(api.dead(topic, "g", limit=2)) == 2

    assert api.redrive(topic, "g", [sent[0], "d-ffffffff", "not-an-id"]) == 1
    (m,) = api.pull_until(topic, "g", 1)
    assert (m["id"], m["attempt"]) == (sent[0], 1), "a redriven message starts over at attempt 1"
    assert api.ack(topic, "g", [m["receipt"]])["acked"] == 1
    assert sorted(ids(api.dead(topic, "g"))) == sorted(sent[1:])

    assert api.redrive(topic, "g") == 2
    assert api.dead(topic, "g") == []
    back = api.pull_until(topic, "g", 2, ack=True)
    assert sorted(ids(back)) == sorted(sent[1:]) and {m["attempt"] for m in back} == {1}
    assert api.redrive(topic, "g") == 0
    assert api.pull(topic, "g", wait_ms=200) == []


# -- tags -------------------------------------------------------------------------------------
def test_tag_filter_skips_non_matching_messages_for_that_group(api: Api, topic: str) -> None:
    """RocketMQ subscription-filter semantics, which delayd implements: a pull with `tags`
    hands out only messages whose tag is listed; every other message the group's cursor passes
    on the way (another tag, or no tag) is skipped *for that group* — it counts as consumed by
    it and is never delivered to it later, not even by a pull without `tags`. The filter is
    given per pull, so messages the cursor has not reached yet are still open to a later pull
    with another filter. Other groups are unaffected: a group without a filter gets everything."""
    tags = ["a", "b", None, "a", "c", "a", None, "b"]
    sent = api.produce(topic, *({"body": str(i), **({"tag": t} if t else {})} for i, t in enumerate(tags)))
    want_a = {p["id"] for p, t in zip(sent, tags, strict=True) if t == "a"}
    want_ab = {p["id"] for p, t in zip(sent, tags, strict=True) if t in ("a", "b")}
    got = api.pull_until(topic, "only-a", len(want_a), tags=["a"], ack=True)
    assert {m["id"] for m in got} == want_a and {m["tag"] for m in got} == {"a"}
    # This pull's cursor passes the tail (None, "b") and skips it; nothing of it comes back later.
    assert api.pull(topic, "only-a", tags=["a"], wait_ms=200) == []
    assert api.pull(topic, "only-a", wait_ms=200) == [], "skipped messages must not come back"
    got = api.pull_until(topic, "a-or-b", len(want_ab), tags=["a", "b"], ack=True)
    assert {m["id"] for m in got} == want_ab
    got = api.pull_until(topic, "everything", len(sent), ack=True)
    assert {m["id"] for m in got} == {p["id"] for p in sent}


# -- encodings --------------------------------------------------------------------------------
def test_msgpack_round_trip_of_a_binary_body(api: Api, topic: str) -> None:
    body = bytes(range(256)) * 4
    (p,) = api.produce(topic, {"body": body, "headers": {"k": "v"}, "tag": "bin"}, fmt=MSGPACK)
    resp = api.call("POST", f"/v1/topics/{topic}/subscriptions/g/pull", {"wait_ms": 5000}, fmt=MSGPACK)
    assert resp.content_type == MSGPACK
    (m,) = ok(resp)["messages"]
    assert m["id"] == p["id"] and isinstance(m["body"], bytes) and m["body"] == body
    assert m["headers"] == {"k": "v"} and m["tag"] == "bin" and "body_b64" not in m
    got = api.get(p["id"], accept=MSGPACK)
    assert got.content_type == MSGPACK and ok(got)["body"] == body
    # The same message for a JSON consumer: not UTF-8, so it comes back as body_b64.
    (j,) = api.pull_until(topic, "json", 1)
    assert "body" not in j and base64.b64decode(j["body_b64"]) == body
    j_view = ok(api.get(p["id"]))
    assert "body" not in j_view and base64.b64decode(j_view["body_b64"]) == body


def test_json_body_b64_and_text_bodies(api: Api, topic: str) -> None:
    binary = b"\xff\x00\xfe binary"
    text = "text ✓ ünïcödé"
    sent = api.produce(topic, {"body_b64": base64.b64encode(binary).decode()}, {"body": text},
                       {"body_b64": base64.b64encode(b"plain").decode()}, {"body": ""})
    got = {m["id"]: m for m in api.pull_until(topic, "g", 4)}
    bin_m, text_m, plain_m, empty_m = (got[p["id"]] for p in sent)
    assert base64.b64decode(bin_m["body_b64"]) == binary and "body" not in bin_m
    assert text_m["body"] == text and "body_b64" not in text_m
    assert plain_m["body"] == "plain", "a UTF-8 payload is returned as body to JSON clients"
    assert empty_m["body"] == ""
    (mp,) = [m for m in api.pull_until(topic, "mp", 4, fmt=MSGPACK) if m["id"] == sent[0]["id"]]
    assert mp["body"] == binary
    (tp,) = [m for m in api.pull_until(topic, "mp2", 4, fmt=MSGPACK) if m["id"] == sent[1]["id"]]
    assert tp["body"] == text.encode()


def test_fields_choose_what_a_pull_answers_and_the_receipts_still_settle(api: Api, topic: str) -> None:
    sent = api.produce(topic, {"body": "text", "key": "k", "tag": "t", "headers": {"h": "v"}},
                       {"body_b64": base64.b64encode(b"\xff\x00").decode()})
    full = {m["id"]: m for m in api.pull_until(topic, "all", 2)}
    assert all(len(m) == 10 for m in full.values()), "no `fields`: every field"
    for fmt, group in ((JSON, "j"), (MSGPACK, "m")):
        got = {m["id"]: m for m in api.pull_until(topic, group, 2, fmt=fmt, fields=["deliver_at", "body", "deliver_at"])}
        assert set(got) == {p["id"] for p in sent}
        text, binary = (got[p["id"]] for p in sent)
        assert list(text) == ["id", "receipt", "body", "deliver_at"], "the order of the full answer, each once"
        assert text["deliver_at"] == full[text["id"]]["deliver_at"]
        if fmt == JSON:
            assert text["body"] == "text" and list(binary) == ["id", "receipt", "body_b64", "deliver_at"]
        else:
            assert text["body"] == b"text" and binary["body"] == b"\xff\x00"
        assert api.ack(topic, group, receipts(got.values())) == {"acked": 2, "stale": []}
        api.produce(topic, {"body": "again"})
        (bare,) = api.pull_until(topic, group, 1, fmt=fmt, fields=[])
        assert list(bare) == ["id", "receipt"], "id and receipt come whatever is asked"
        assert api.ack(topic, group, [bare["receipt"]]) == {"acked": 1, "stale": []}
    for bad in (["bodyy"], ["id", 1], "body", {"body": 1}, ["x"] * 101):
        assert_error(api.call("POST", f"/v1/topics/{topic}/subscriptions/j/pull", {"fields": bad}), 400,
                     "invalid_parameter")


def test_msgpack_response_for_msgpack_requests_json_otherwise(api: Api, topic: str) -> None:
    r = api.call("POST", f"/v1/topics/{topic}/messages", {"body": b"x"}, fmt=MSGPACK)
    assert r.content_type == MSGPACK and r.body["messages"][0]["duplicate"] is False
    r = api.call("POST", f"/v1/topics/{topic}/messages", {"body": "x"})
    assert r.content_type == JSON
    assert api.call("GET", "/v1/stats", accept=MSGPACK).content_type == MSGPACK
    assert api.call("GET", "/v1/stats").content_type == JSON


# -- message states ---------------------------------------------------------------------------
def test_message_state_scheduled_then_delivered(api: Api, topic: str) -> None:
    before = now_ms()
    (p,) = api.produce(topic, {"body": "x", "delay_ms": 1000, "key": "k1", "tag": "t", "headers": {"a": "b"}})
    view = ok(api.get(p["id"]))
    assert view == {"id": p["id"], "topic": topic, "key": "k1", "tag": "t", "headers": {"a": "b"}, "body": "x",
                    "deliver_at": p["deliver_at"], "produced_at": view["produced_at"], "state": "scheduled"}
    assert before - CLOCK_SLACK_MS <= view["produced_at"] <= p["deliver_at"] - 1000 + CLOCK_SLACK_MS
    wait_until(lambda: api.state(p["id"]) == "delivered", 5, 0.02, "delivered")
    assert now_ms() >= p["deliver_at"] - CLOCK_SLACK_MS, "state became delivered before deliver_at"
    assert_error(api.call("DELETE", f"/v1/messages/{p['id']}"), 409, "already_delivered")


def test_message_state_cancelled_is_final_and_never_delivered(api: Api, topic: str) -> None:
    (p,) = api.produce(topic, {"body": "x", "delay_ms": 1200})
    api.subscribe(topic, "g")
    assert ok(api.call("DELETE", f"/v1/messages/{p['id']}")) == {"id": p["id"], "state": "cancelled"}
    assert ok(api.call("DELETE", f"/v1/messages/{p['id']}")) == {"id": p["id"], "state": "cancelled"}
    assert api.state(p["id"]) == "cancelled"
    # Long-poll past the due time: nothing arrives, and the state stays cancelled.
    assert api.pull(topic, "g", wait_ms=max(0, p["deliver_at"] - now_ms()) + 500) == []
    assert api.state(p["id"]) == "cancelled"
    assert_error(api.get("d-7fffffffffff"), 404, "not_found")
    assert_error(api.call("DELETE", "/v1/messages/d-7fffffffffff"), 404, "not_found")


# -- restarts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_dead_letters_and_redrives_survive_a_restart(tmp_path, how: str) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        api = Api(d)
        api.subscribe("dl", "g", max_attempts=1)
        sent = ids(api.produce("dl", *({"body": str(i)} for i in range(4))))
        got = api.pull_until("dl", "g", 4)
        api.settle("dl", "g", "nack", receipts(got), delay_ms=0)
        assert api.redrive("dl", "g", [sent[0]]) == 1
        if how == "sigterm":
            assert d.stop() == 0
        else:
            d.kill9()
        d.start()
        assert api.subscribe("dl", "g")["max_attempts"] == 1
        assert sorted(ids(api.dead("dl", "g"))) == sorted(sent[1:])
        (m,) = api.pull_until("dl", "g", 1, ack=True)
        assert (m["id"], m["attempt"]) == (sent[0], 1), "the redriven message is due again"
        assert api.redrive("dl", "g") == 3
        back = api.pull_until("dl", "g", 3, ack=True)
        assert sorted(ids(back)) == sorted(sent[1:])
        assert api.pull("dl", "g", wait_ms=200) == [] and api.dead("dl", "g") == []
    finally:
        d.stop()
    daemon_log_clean(d)


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_redelivers_only_unacked_messages_from_attempt_one(tmp_path, how: str) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        api = Api(d)
        sent = ids(api.produce("rs", *({"body": str(i)} for i in range(10))))
        later = api.produce("rs", {"body": "later", "delay_ms": 1500})
        got = api.pull_until("rs", "g", 10)
        acked = {m["id"] for m in got[::2]}
        assert api.ack("rs", "g", [m["receipt"] for m in got[::2]])["acked"] == 5
        if how == "sigterm":
            assert d.stop() == 0
        else:
            d.kill9()
        d.start()
        back = api.pull_until("rs", "g", 5)
        assert {m["id"] for m in back} == set(sent) - acked
        assert {m["attempt"] for m in back} == {1}
        (m,) = api.pull_until("rs", "g", 1, timeout_s=10)
        assert m["id"] == later[0]["id"] and m["delivered_at"] >= m["deliver_at"]
        assert api.pull("rs", "g", wait_ms=300) == []
        for i in acked:
            assert api.state(i) == "delivered"
    finally:
        d.stop()
    daemon_log_clean(d)


def test_sigterm_answers_pending_long_polls_and_stops_promptly(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        Api(d).subscribe("lp", "g")
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
        # A request answered on this connection first, so the daemon has accepted it; then the
        # long-poll is written before the signal and only its answer is awaited in a thread.
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        conn.request("POST", "/v1/topics/lp/subscriptions/g/pull", body=b'{"wait_ms": 4000}',
                     headers={"Content-Type": JSON})
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(lambda: (r := conn.getresponse(), r.status, r.read())[1:])
            t0 = time.monotonic()
            assert d.stop() == 0
            stopped_in = time.monotonic() - t0
            status, raw = fut.result(timeout=30)
        conn.close()
        assert (status, json.loads(raw)) == (200, {"messages": []}), "a pending long-poll ends empty"
        assert stopped_in < 3, f"SIGTERM took {stopped_in:.1f} s with a long-poll pending"
    finally:
        d.stop()
