"""Listing pending messages over HTTP against a real daemon (docs/api.md, "List pending
messages"): due order across the roll window and the far future, cursors, bodies, bad input,
cancelled and delivered messages, kill -9 and restart, tokens, and the OpenAPI schemas."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.integration.test_observe import check
from tests.integration.wire import JSON, MSGPACK, Api, assert_error, daemon_log_clean, now_ms, ok
from tests.support.daemon import DaemonProcess

DAY = 86_400_000
LIST = "/v1/topics/{topic}/messages"


def listing(api: Api, path: str, limit: int = 7, **params: Any) -> list[dict[str, Any]]:
    """Every page of a listing, following next_cursor."""
    out: list[dict[str, Any]] = []
    cursor = None
    for _ in range(10_000):
        q = {"limit": limit, **params, **({"cursor": cursor} if cursor else {})}
        page = ok(api.call("GET", path + "?" + "&".join(f"{k}={v}" for k, v in q.items())))
        assert set(page) == {"messages", "next_cursor"} and len(page["messages"]) <= limit
        out += page["messages"]
        cursor = page["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("the cursor never ran out")


def keyed(m: dict[str, Any]) -> tuple[int, int]:
    return m["deliver_at"], int(m["id"].split("-")[1], 16)


def test_due_order_across_the_window_and_far_future_with_cursors(api: Api) -> None:
    rng = random.Random(2)
    now = now_ms()
    # The default roll window is 2 days: a third of these are far-future messages.
    dues = [now + rng.randrange(60_000, 6 * DAY) for _ in range(60)]
    sent = api.produce("list-a", *({"body": f"m{i}", "deliver_at": d, "key": f"k{i}", "tag": "t",
                                    "headers": {"i": str(i)}} for i, d in enumerate(dues)))
    api.produce("list-b", *({"body": "other", "deliver_at": d} for d in dues[:10]))
    got = listing(api, "/v1/topics/list-a/messages", limit=7)
    assert [m["id"] for m in got] == [s["id"] for s in sorted(sent, key=keyed)]
    assert any(m["deliver_at"] > now + 2 * DAY for m in got) and any(m["deliver_at"] < now + 2 * DAY for m in got)
    m = next(x for x in got if x["id"] == sent[5]["id"])
    assert (m["topic"], m["key"], m["tag"], m["headers"], m["deliver_at"], m["body_size"]) == \
        ("list-a", "k5", "t", {"i": "5"}, dues[5], 2)
    assert m["produced_at"] <= now_ms() and "body" not in m and "body_b64" not in m
    # Every topic at once (admin): both topics, still in due order.
    mine = [x for x in listing(api, "/v1/messages", limit=50) if x["topic"] in ("list-a", "list-b")]
    assert len(mine) == 70 and [keyed(x) for x in mine] == sorted(keyed(x) for x in mine)
    # A time range.
    lo, hi = sorted(dues)[10], sorted(dues)[40]
    ranged = listing(api, "/v1/topics/list-a/messages", limit=100, **{"from": lo, "to": hi})
    assert [x["deliver_at"] for x in ranged] == sorted(d for d in dues if lo <= d <= hi)


def test_bodies_only_when_asked_in_both_encodings(api: Api) -> None:
    api.produce("list-body", {"body": "text", "delay_ms": 600_000}, {"body_b64": "/wA=", "delay_ms": 600_001})
    plain, binary = listing(api, "/v1/topics/list-body/messages", body="true")
    assert (plain["body"], plain["body_size"]) == ("text", 4) and "body_b64" not in plain
    assert (binary["body_b64"], binary["body_size"]) == ("/wA=", 2) and "body" not in binary
    packed = ok(api.call("GET", "/v1/topics/list-body/messages?body=1", accept=MSGPACK))["messages"]
    assert [x["body"] for x in packed] == [b"text", b"\xff\x00"]


def test_bad_queries_are_400(api: Api) -> None:
    base = "/v1/topics/list-bad/messages"
    api.produce("list-bad", *({"body": "x", "delay_ms": 600_000 + i} for i in range(3)))
    cursor = ok(api.call("GET", base + "?limit=1"))["next_cursor"]
    assert cursor
    for query in ("limit=0", "limit=1001", "limit=x", "from=5&to=4", "from=-1", "cursor=nope",
                  f"cursor={cursor[:-2]}", f"cursor={cursor}x", "cursor=" + "A" * 80, "body=maybe", "to=1e9"):
        assert_error(api.call("GET", f"{base}?{query}"), 400, "invalid_parameter")
    assert_error(api.call("GET", "/v1/topics/.bad/messages"), 400, "invalid_name")
    # The cursor goes on where the page stopped.
    rest = ok(api.call("GET", f"{base}?cursor={cursor}"))
    assert len(rest["messages"]) == 2 and rest["next_cursor"] is None


def test_cancelled_and_delivered_messages_are_not_listed(api: Api) -> None:
    t = "list-gone"
    sent = api.produce(t, *({"body": str(i), "delay_ms": 600_000 + i} for i in range(6)),
                       {"body": "soon", "delay_ms": 300})
    for s in sent[:3]:
        ok(api.call("DELETE", f"/v1/messages/{s['id']}"))
    api.pull_until(t, "g", 1)  # "soon" was delivered
    assert [m["id"] for m in listing(api, f"/v1/topics/{t}/messages")] == [s["id"] for s in sent[3:6]]


def test_pages_while_messages_come_and_go(api: Api) -> None:
    """No message is listed twice; every message pending throughout is listed; none listed after
    it was cancelled."""
    t = "list-churn"
    rng = random.Random(9)
    first = api.produce(t, *({"body": "x", "delay_ms": rng.randrange(2_000, 40_000)} for _ in range(120)))
    cancelled: set[str] = set()
    seen: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = ok(api.call("GET", f"/v1/topics/{t}/messages?limit=9" + (f"&cursor={cursor}" if cursor else "")))
        assert not {m["id"] for m in page["messages"]} & cancelled
        seen += page["messages"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        api.produce(t, *({"body": "y", "delay_ms": rng.randrange(0, 40_000)} for _ in range(3)))
        victim = rng.choice(first)["id"]
        if api.call("DELETE", f"/v1/messages/{victim}").status == 200:
            cancelled.add(victim)
    ids = [m["id"] for m in seen]
    assert len(ids) == len(set(ids)), "listed twice"
    assert [keyed(m) for m in seen] == sorted(keyed(m) for m in seen)
    throughout = {s["id"] for s in first} - cancelled
    delivered = {i for i in throughout if api.state(i) == "delivered"}
    assert throughout - delivered <= set(ids)


def test_openapi_describes_the_listing(api: Api) -> None:
    spec = ok(api.call("GET", "/openapi.json"))
    api.produce("list-spec", {"body": "x", "delay_ms": 600_000, "key": "k"}, {"body_b64": "/wA=", "delay_ms": 9 * DAY})
    page = check(spec, api.call("GET", "/v1/topics/list-spec/messages?limit=1&body=true"), "GET", LIST)
    check(spec, api.call("GET", f"/v1/topics/list-spec/messages?cursor={page['next_cursor']}&body=true"), "GET", LIST)
    check(spec, api.call("GET", "/v1/messages?limit=3"), "GET", "/v1/messages")
    check(spec, api.call("GET", "/v1/messages?limit=0"), "GET", "/v1/messages")
    check(spec, api.call("GET", "/v1/topics/list-spec/messages?cursor=bad"), "GET", LIST)


def test_kill9_and_restart_rebuild_nothing_lost(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        api = Api(d)
        now = now_ms()
        far = api.produce("list-crash", *({"body": "far", "deliver_at": now + 3 * DAY + i} for i in range(30)))
        near = api.produce("list-crash", *({"body": "near", "deliver_at": now + DAY + i} for i in range(30)))
        ok(api.call("DELETE", f"/v1/messages/{far[0]['id']}"))
        expect = [s["id"] for s in near + far[1:]]
        assert [m["id"] for m in listing(api, "/v1/topics/list-crash/messages", limit=11)] == expect
        d.kill9()
        d.start()
        assert [m["id"] for m in listing(api, "/v1/topics/list-crash/messages", limit=11)] == expect
        # The far index lost: rebuilt from the commit log at start.
        d.stop()
        for f in (tmp_path / "data").glob("far.sqlite*"):
            f.unlink()
        d.start()
        assert [m["id"] for m in listing(api, "/v1/topics/list-crash/messages", limit=11)] == expect
        assert "far index rebuilt" in d.log_path.read_text()
    finally:
        d.stop()
    daemon_log_clean(d)


def test_far_produce_is_refused_for_now_while_the_far_index_is_behind(tmp_path) -> None:
    """Far-index writes not yet in its database are held in memory: above `max_unwritten_far` a
    produce holding a far message is answered 429 (nothing stored) until the writes catch up, once
    it has waited `backpressure_wait_ms` for them; messages due within the window go on, and the
    listing stays whole."""
    # No checkpoint within the test: the far rows stay unwritten until the graceful stop writes them.
    d = DaemonProcess(tmp_path / "data", config_text="checkpoint_interval_ms = 600000\nmax_unwritten_far = 1000\n"
                                                     "backpressure_wait_ms = 100\n").start()
    try:
        api = Api(d)
        now = now_ms()
        far = [m["id"] for m in api.produce("far-bp", *({"body": "far", "deliver_at": now + 3 * DAY + i}
                                                       for i in range(1500)), fmt=MSGPACK)]
        for fmt in (JSON, MSGPACK):  # the reference path and the batch core's
            r = api.call("POST", "/v1/topics/far-bp/messages",
                         {"messages": [{"body": "near", "delay_ms": 60_000}, {"body": "late", "deliver_at": now + 4 * DAY}]},
                         fmt=fmt)
            assert_error(r, 429, "backpressure")
            assert r.headers["retry-after"] == "1"
        near = [m["id"] for m in api.produce("far-bp", {"body": "near", "delay_ms": 60_000})]
        assert [m["id"] for m in listing(api, "/v1/topics/far-bp/messages", limit=1000)] == near + far
    finally:
        d.stop()
    d.start()  # the stop wrote the far rows
    try:
        late = api.produce("far-bp", {"body": "late", "deliver_at": now + 4 * DAY})
        assert [m["id"] for m in listing(api, "/v1/topics/far-bp/messages", limit=1000)] == near + far + [late[0]["id"]]
    finally:
        d.stop()
    daemon_log_clean(d)


ADMIN, PRODUCER, CONSUMER, OTHER = "adm-list-token-1", "prd-list-token-2", "cns-list-token-3", "oth-list-token-4"
TOKENS = f"""
[[auth.tokens]]
token = "{ADMIN}"
rights = ["admin"]

[[auth.tokens]]
token = "{PRODUCER}"
rights = ["produce"]
topics = ["orders"]

[[auth.tokens]]
token = "{CONSUMER}"
rights = ["consume"]
topics = ["orders"]

[[auth.tokens]]
token = "{OTHER}"
rights = ["produce", "consume"]
topics = ["mail"]
"""


def test_rights_are_those_of_get_message(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data", config_text=TOKENS).start()
    try:
        def status(path: str, token: str | None) -> int:
            return d.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})[0]

        assert d.request("POST", "/v1/topics/orders/messages", {"body": "x", "delay_ms": 60_000},
                         headers={"Authorization": f"Bearer {PRODUCER}"})[0] == 200
        topic = "/v1/topics/orders/messages"
        assert [status(topic, t) for t in (None, "wrong-token-x", ADMIN, PRODUCER, CONSUMER, OTHER)] == \
            [401, 401, 200, 200, 200, 403]
        assert [status("/v1/messages", t) for t in (None, ADMIN, PRODUCER, CONSUMER, OTHER)] == \
            [401, 200, 403, 403, 403]
        _, page = d.request("GET", topic, headers={"Authorization": f"Bearer {CONSUMER}"})
        assert [m["topic"] for m in page["messages"]] == ["orders"]
    finally:
        d.stop()


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_limit_and_default_range(api: Api, fmt: str) -> None:
    t = f"list-limit-{fmt.split('/')[1]}"
    api.produce(t, *({"body": "x", "delay_ms": 1_000_000 + i} for i in range(150)))
    # A produce answered before the listing is listed (the listing waits for indexing).
    assert len(ok(api.call("GET", f"/v1/topics/{t}/messages?limit=1000", accept=fmt))["messages"]) == 150
    page = ok(api.call("GET", f"/v1/topics/{t}/messages", accept=fmt))
    assert len(page["messages"]) == 100 and page["next_cursor"]  # the default limit
