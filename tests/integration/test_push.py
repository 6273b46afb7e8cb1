"""Push subscriptions against the real daemon: a real aiohttp endpoint in this process receives
the POSTs (docs/push.md). Delivery never before deliver_at, the envelope and headers, the
signature, ack/nack with the group's backoff and Retry-After, timeouts, dead letters and redrive,
isolation of a slow endpoint, the concurrency bound, switching back to pull, the settings across
restarts and a kill -9 while a POST is held (at-least-once).

Timing assertions are lower bounds the daemon must respect (never early, not before a backoff)
and generous upper bounds; waiting is always a poll with a deadline.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_observe import validate
from tests.integration.wire import JSON, Api, assert_error, now_ms, ok
from tests.support.daemon import DaemonProcess, free_port, wait_until
from tests.support.webhook import Hit, Receiver, Reply

CLOCK_SLACK_MS = 20  # the daemon's clock is the host clock anchored at its start (see test_consume)
SECRET = "whsec-test-0123456789abcdef"
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return ("p-" + re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name))[:128]


def push_put(api: Api, topic: str, group: str, url: str, **settings: Any) -> dict[str, Any]:
    extra = {k: settings.pop(k) for k in ("max_attempts", "start") if k in settings}
    return api.subscribe(topic, group, push={"url": url, **settings}, **extra)


def verify(secret: str, header: str, body: bytes) -> int:
    """The receiving side of docs/push.md: the signed timestamp, or AssertionError."""
    parts = dict(p.split("=", 1) for p in header.split(","))
    t = int(parts["t"])
    want = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(want, parts["v1"]), "signature does not verify"
    return t


def envelope(hit: Hit) -> dict[str, Any]:
    if hit.headers["content-type"] == "application/msgpack":
        return dict(msgpack.unpackb(hit.body, raw=False))
    return dict(json.loads(hit.body))


def group_settled(api: Api, topic: str, group: str) -> bool:
    s = api.stats()["groups"].get(f"{topic}/{group}")
    return s is not None and {k: s[k] for k in ("backlog", "inflight", "dead")} == {"backlog": 0, "inflight": 0, "dead": 0}


# -- delivery -------------------------------------------------------------------------------------
def test_push_delivers_due_messages_never_early_signed_with_envelope_and_headers(
        api: Api, receiver: Receiver, topic: str) -> None:
    settings = push_put(api, topic, "g", receiver.url(f"/{topic}"), secret=SECRET, timeout_ms=5000)
    assert settings["push"] == {"url": receiver.url(f"/{topic}"), "timeout_ms": 5000, "max_in_flight": 10,
                                "format": "json",
                                "secret_fingerprint": "sha256:" + hashlib.sha256(SECRET.encode()).hexdigest()[:16]}
    raw = api.call("PUT", f"/v1/topics/{topic}/subscriptions/g", {}).raw
    assert SECRET.encode() not in raw and json.loads(raw)["push"]["url"], "an empty PUT keeps push, hides the secret"
    sent = [{"body": "close order 42", "delay_ms": 600, "key": "order 42%", "tag": "orders",
             "headers": {"trace": "abc", "Ünï code": "a b\u00e9"}},
            {"body_b64": base64.b64encode(b"\xff\x00bin").decode(), "delay_ms": 300},
            {"body": "due now", "deliver_at": now_ms() - 60_000}]
    produced = api.produce(topic, *sent)
    hits = wait_until(lambda: len(receiver.answered(f"/{topic}")) == 3 and receiver.answered(f"/{topic}"), 10,
                      what="three pushes")
    by_id = {h.headers["delayd-id"]: h for h in hits}
    assert set(by_id) == {p["id"] for p in produced}
    for p, m in zip(produced, sent, strict=True):
        h = by_id[p["id"]]
        assert h.at_ms >= p["deliver_at"] - CLOCK_SLACK_MS, "never before deliver_at"
        assert h.int_header("Delayd-Delivered-At") >= h.int_header("Delayd-Deliver-At") == p["deliver_at"]
        assert (h.headers["delayd-topic"], h.headers["delayd-group"], h.headers["delayd-attempt"]) == (topic, "g", "1")
        assert h.headers["content-type"] == JSON and h.headers["user-agent"].startswith("delayd/")
        t = verify(SECRET, h.headers["delayd-signature"], h.body)
        assert abs(t - h.at_ms) < 5000, "the signed timestamp is the sending time"
        with pytest.raises(AssertionError):
            verify("another-secret-of-16+chars", h.headers["delayd-signature"], h.body)
        with pytest.raises(AssertionError):
            verify(SECRET, h.headers["delayd-signature"], h.body.replace(b'"attempt":1', b'"attempt":2'))
        env = envelope(h)
        assert {k: env[k] for k in ("id", "topic", "group", "deliver_at", "attempt")} == \
            {"id": p["id"], "topic": topic, "group": "g", "deliver_at": p["deliver_at"], "attempt": 1}
        assert env["delivered_at"] == h.int_header("Delayd-Delivered-At")
        assert {k: env.get(k) for k in ("body", "body_b64")} == \
            {"body": m.get("body"), "body_b64": m.get("body_b64")}, "body as in pull: text or base64"
        assert env["key"] == m.get("key") and env["tag"] == m.get("tag") and env["headers"] == m.get("headers", {})
        assert all(TOKEN.fullmatch(name) for name, _ in h.raw_headers), "every header name is an HTTP token"
    first = by_id[produced[0]["id"]]
    assert unquote(first.headers["delayd-key"]) == "order 42%" and first.headers["delayd-tag"] == "orders"
    # HTTP header names are case-insensitive (the envelope's `headers` keep the case).
    copied = {unquote(k[len("delayd-header-"):]).lower(): unquote(v) for k, v in first.headers.items()
              if k.startswith("delayd-header-")}
    assert copied == {k.lower(): v for k, v in sent[0]["headers"].items()}
    assert "delayd-key" not in by_id[produced[1]["id"]].headers
    wait_until(lambda: group_settled(api, topic, "g"), 5, what="all three acked")
    assert all(api.state(p["id"]) == "delivered" for p in produced)
    assert len(receiver.hits(f"/{topic}")) == 3, "acked on 2xx: nothing comes twice"


def test_msgpack_push_carries_the_body_as_bin(api: Api, receiver: Receiver, topic: str) -> None:
    push_put(api, topic, "g", receiver.url(f"/{topic}"), format="msgpack", secret=SECRET)
    (p,) = api.produce(topic, {"body_b64": base64.b64encode(b"\x00\xffraw").decode()})
    (h,) = wait_until(lambda: receiver.answered(f"/{topic}"), 10, what="push")
    assert h.headers["content-type"] == "application/msgpack"
    verify(SECRET, h.headers["delayd-signature"], h.body)
    env = envelope(h)
    assert env["body"] == b"\x00\xffraw" and env["id"] == p["id"] and env["attempt"] == 1


def test_without_a_secret_nothing_is_signed(api: Api, receiver: Receiver, topic: str) -> None:
    settings = push_put(api, topic, "g", receiver.url(f"/{topic}"))
    assert settings["push"]["secret_fingerprint"] is None
    api.produce(topic, {"body": "x"})
    (h,) = wait_until(lambda: receiver.answered(f"/{topic}"), 10, what="push")
    assert "delayd-signature" not in h.headers


# -- failures: nack, backoff, Retry-After, timeout, dead letters ---------------------------------
def test_non_2xx_nacks_with_the_group_backoff_and_the_attempt_grows(api: Api, receiver: Receiver, topic: str) -> None:
    path = f"/{topic}"
    # Retry-After counts only on 429/503: on a 500 the group's backoff (1 s, then 2 s) applies.
    receiver.script(path, Reply(500, {"Retry-After": "0"}), Reply(404), Reply(204))
    push_put(api, topic, "g", receiver.url(path), secret=SECRET)
    (p,) = api.produce(topic, {"body": "retry me", "delay_ms": 200})
    hits = wait_until(lambda: len(receiver.answered(path)) == 3 and receiver.answered(path), 15, what="3 attempts")
    assert [h.int_header("Delayd-Attempt") for h in hits] == [1, 2, 3]
    assert [envelope(h)["attempt"] for h in hits] == [1, 2, 3], "the signed envelope says the attempt too"
    assert {h.headers["delayd-id"] for h in hits} == {p["id"]}
    assert hits[0].at_ms >= p["deliver_at"] - CLOCK_SLACK_MS
    assert hits[1].at_ms - hits[0].at_ms >= 1000 - CLOCK_SLACK_MS, "first backoff is 1 s"
    assert hits[2].at_ms - hits[1].at_ms >= 2000 - CLOCK_SLACK_MS, "second backoff is 2 s"
    wait_until(lambda: group_settled(api, topic, "g"), 5, what="acked by the 204")
    metrics = {(s.labels.get("outcome"), s.name): s.value
               for f in text_string_to_metric_families(api.call("GET", "/metrics").raw.decode())
               for s in f.samples if s.labels.get("topic") == topic}
    assert metrics[("http_error", "delayd_push_requests_total")] == 2
    assert metrics[("ok", "delayd_push_requests_total")] == 1
    assert metrics[(None, "delayd_push_duration_seconds_count")] == 3


def test_retry_after_on_429_and_503_replaces_the_backoff(api: Api, receiver: Receiver, topic: str) -> None:
    path = f"/{topic}"
    receiver.script(path, Reply(503, {"Retry-After": "0"}), Reply(429, {"Retry-After": "0"}))
    push_put(api, topic, "g", receiver.url(path))
    api.produce(topic, {"body": "x"})
    hits = wait_until(lambda: len(receiver.answered(path)) == 3 and receiver.answered(path), 10, what="3 attempts")
    assert [h.int_header("Delayd-Attempt") for h in hits] == [1, 2, 3]
    # With the backoff these would be 1 s and 2 s apart.
    assert hits[2].at_ms - hits[0].at_ms < 900, [h.at_ms for h in hits]


def test_a_timeout_nacks(api: Api, receiver: Receiver, topic: str) -> None:
    path = f"/{topic}"
    receiver.script(path, Reply(200, delay_s=3))
    push_put(api, topic, "g", receiver.url(path), timeout_ms=300)
    api.produce(topic, {"body": "slow"})
    first, second = wait_until(lambda: len(receiver.hits(path)) == 2 and receiver.hits(path), 10, what="retry")
    assert second.int_header("Delayd-Attempt") == 2
    assert second.at_ms - first.at_ms >= 300 + 1000 - CLOCK_SLACK_MS, "timeout, then the 1 s backoff"
    wait_until(lambda: group_settled(api, topic, "g"), 5, what="second attempt acked")


def test_dead_letters_after_max_attempts_then_redrive_pushes_again(api: Api, receiver: Receiver, topic: str) -> None:
    path = f"/{topic}"
    receiver.script(path, Reply(503, {"Retry-After": "0"}), Reply(500))
    push_put(api, topic, "g", receiver.url(path), max_attempts=2)
    (p,) = api.produce(topic, {"body": "poison"})
    (dead,) = wait_until(lambda: api.dead(topic, "g"), 10, what="dead letter")
    assert (dead["id"], dead["attempt"], dead["reason"], dead["body"]) == (p["id"], 2, "push_http_500", "poison")
    assert len(receiver.hits(path)) == 2
    assert api.redrive(topic, "g") == 1
    wait_until(lambda: len(receiver.answered(path)) == 3, 10, what="redriven push")
    assert receiver.hits(path)[2].int_header("Delayd-Attempt") == 1, "redrive resets the attempts"
    wait_until(lambda: group_settled(api, topic, "g"), 5, what="redriven message acked")
    assert api.dead(topic, "g") == []


def test_an_unreachable_endpoint_is_a_connection_error(api: Api, topic: str) -> None:
    push_put(api, topic, "g", f"http://127.0.0.1:{free_port()}/nobody", max_attempts=1)
    (p,) = api.produce(topic, {"body": "x"})
    (dead,) = wait_until(lambda: api.dead(topic, "g"), 10, what="dead letter")
    assert (dead["id"], dead["reason"]) == (p["id"], "push_connection_error")


# -- isolation and bounds -------------------------------------------------------------------------
def test_a_slow_endpoint_holds_only_its_own_subscription(api: Api, receiver: Receiver, topic: str) -> None:
    slow, fast = f"/{topic}/slow", f"/{topic}/fast"
    receiver.script(slow, *[Reply(hold=True)] * 6)
    push_put(api, topic, "slow", receiver.url(slow), max_in_flight=2, timeout_ms=60_000)
    push_put(api, topic, "fast", receiver.url(fast))
    api.subscribe(topic, "puller")
    produced = api.produce(topic, *({"body": f"m{i}", "delay_ms": 300} for i in range(6)))
    try:
        fast_hits = wait_until(lambda: len(receiver.answered(fast)) == 6 and receiver.answered(fast), 10,
                               what="fast subscription served while the slow one is stuck")
        due = {p["id"]: p["deliver_at"] for p in produced}
        late = [h.at_ms - due[h.headers["delayd-id"]] for h in fast_hits]
        assert all(-CLOCK_SLACK_MS <= x < 2000 for x in late), late
        assert len(api.pull_until(topic, "puller", 6, ack=True)) == 6, "pull of the same topic goes on"
        wait_until(lambda: receiver.active[slow] == 2, 5, what="slow endpoint holding its max_in_flight")
        assert receiver.peak[slow] == 2 and len(receiver.hits(slow)) == 2, "max_in_flight bounds the POSTs"
    finally:
        receiver.release(slow)
    wait_until(lambda: len(receiver.answered(slow)) == 6, 10, what="slow subscription catches up")
    assert receiver.peak[slow] == 2
    wait_until(lambda: group_settled(api, topic, "slow"), 5, what="slow acked")


def test_total_in_flight_is_bounded_by_config(tmp_path: Path, receiver: Receiver) -> None:
    d = DaemonProcess(tmp_path / "data", config_text="push_max_in_flight = 3\n").start()
    try:
        api = Api(d)
        paths = ["/total/a", "/total/b"]
        for i, path in enumerate(paths):
            receiver.script(path, *[Reply(hold=True)] * 4)
            push_put(api, "total", f"g{i}", receiver.url(path), max_in_flight=4)
        api.produce("total", *({"body": f"m{i}"} for i in range(4)))
        wait_until(lambda: receiver.active["/total"] == 3, 10, what="three POSTs held")
        groups = api.stats()["groups"]
        assert groups["total/g0"]["inflight"] + groups["total/g1"]["inflight"] == 3
        assert groups["total/g0"]["backlog"] + groups["total/g1"]["backlog"] == 5, "the rest waits its turn"
        for path in paths:
            receiver.release(path)
        wait_until(lambda: sum(len(receiver.answered(p)) for p in paths) == 8, 10, what="all pushed")
        assert receiver.peak["/total"] == 3, "two groups of max_in_flight 4, but 3 in total"
    finally:
        for path in paths:
            receiver.release(path)
        assert d.stop() == 0


# -- settings -------------------------------------------------------------------------------------
def test_push_null_turns_it_back_into_pull(api: Api, receiver: Receiver, topic: str) -> None:
    path = f"/{topic}"
    push_put(api, topic, "g", receiver.url(path))
    r = api.call("POST", f"/v1/topics/{topic}/subscriptions/g/pull", {"wait_ms": 100})
    assert_error(r, 409, "push_subscription")
    (pushed,) = api.produce(topic, {"body": "pushed"})
    wait_until(lambda: receiver.answered(path), 10, what="push")
    wait_until(lambda: group_settled(api, topic, "g"), 5, what="acked")
    assert api.subscribe(topic, "g", push=None) == {"topic": topic, "group": "g", "start": "earliest",
                                                     "max_attempts": 16}
    (pulled,) = api.produce(topic, {"body": "pulled"})
    (m,) = api.pull_until(topic, "g", 1, ack=True)
    assert m["id"] == pulled["id"] and m["body"] == "pulled"
    assert [h.headers["delayd-id"] for h in receiver.hits(path)] == [pushed["id"]]


BAD_PUSH = [
    "http://x", {"url": "ftp://host/x"}, {"url": "http:///nohost"}, {"url": "/relative"}, {"url": ""},
    {"url": "http://user:pw@host/x"}, {"url": "http://host/x#frag"}, {"url": "http://host/a b"},
    {"url": "http://host:99999/x"}, {"url": "http://h/" + "x" * 2048}, {"timeout_ms": 1000},
    {"url": "http://h/", "timeout_ms": 99}, {"url": "http://h/", "timeout_ms": 600_001},
    {"url": "http://h/", "timeout_ms": "1000"}, {"url": "http://h/", "max_in_flight": 0},
    {"url": "http://h/", "max_in_flight": 1001}, {"url": "http://h/", "max_in_flight": True},
    {"url": "http://h/", "secret": "short"}, {"url": "http://h/", "secret": "x" * 257},
    {"url": "http://h/", "secret": 12345678901234567}, {"url": "http://h/", "format": "xml"},
    {"url": "http://h/", "retries": 3},
]
GOOD_PUSH = [None, {"url": "http://h/"}, {"url": "https://hooks.example.com:8443/delayd?x=1", "timeout_ms": 100,
                                          "max_in_flight": 1000, "secret": "s" * 16, "format": "msgpack"},
             {"url": "http://[::1]:9/x", "secret": None, "timeout_ms": 600_000}]


def test_bad_push_settings_are_400_and_the_spec_agrees(api: Api, topic: str) -> None:
    spec = ok(api.call("GET", "/openapi.json"))
    put = spec["paths"]["/v1/topics/{topic}/subscriptions/{group}"]["put"]
    schema = put["requestBody"]["content"][JSON]["schema"]
    for i, push in enumerate(BAD_PUSH):
        resp = api.call("PUT", f"/v1/topics/{topic}/subscriptions/bad{i}", {"push": push})
        err = assert_error(resp, 400, "invalid_push")
        assert "push" in err["message"], err
    schema_misses = [p for p in BAD_PUSH if validate(spec, schema, {"push": p}) == []]
    # Only what a JSON schema cannot say (a host, a port's range, credentials, bytes of UTF-8).
    assert schema_misses == [{"url": "http:///nohost"}, {"url": "http://user:pw@host/x"},
                             {"url": "http://host/x#frag"}, {"url": "http://host:99999/x"}]
    for i, push in enumerate(GOOD_PUSH):
        assert validate(spec, schema, {"push": push}) == []
        answer = api.subscribe(topic, f"good{i}", push=push)
        assert validate(spec, put["responses"]["200"]["content"][JSON]["schema"], answer) == []
        assert ("push" in answer) == (push is not None)
    assert "callbacks" in put, "the POST the daemon sends is documented"
    assert api.stats()["groups"].get(f"{topic}/bad0") is None, "a rejected PUT creates no group"


# -- restarts -------------------------------------------------------------------------------------
# A checkpoint every 10 minutes: what the daemon knows after a kill -9 comes from the commit log.
NO_CHECKPOINT = "checkpoint_interval_ms = 600000\n"


def test_push_settings_survive_kill9_and_restart_and_the_secret_is_never_logged(
        tmp_path: Path, receiver: Receiver) -> None:
    d = DaemonProcess(tmp_path / "data", config_text=NO_CHECKPOINT).start()
    path = "/survive"
    try:
        api = Api(d)
        push_put(api, "survive", "g", receiver.url(path), secret=SECRET, max_in_flight=3, max_attempts=4)
        d.kill9()  # the PUT's group event is the only record of it
        d.start()
        (p1,) = api.produce("survive", {"body": "after kill -9"})
        (h1,) = wait_until(lambda: receiver.answered(path), 10, what="push after kill -9")
        assert h1.headers["delayd-id"] == p1["id"]
        verify(SECRET, h1.headers["delayd-signature"], h1.body)
        assert d.stop() == 0  # the final checkpoint snapshots the settings
        d.start()
        (p2,) = api.produce("survive", {"body": "after stop"})
        wait_until(lambda: len(receiver.answered(path)) == 2, 10, what="push after a graceful restart")
        h2 = receiver.hits(path)[1]
        assert h2.headers["delayd-id"] == p2["id"]
        verify(SECRET, h2.headers["delayd-signature"], h2.body)
        settings = api.subscribe("survive", "g")
        assert settings["max_attempts"] == 4 and settings["push"]["max_in_flight"] == 3
        # Back to pull survives a kill -9 too.
        api.subscribe("survive", "g", push=None)
        d.kill9()
        d.start()
        assert "push" not in api.subscribe("survive", "g")
        (p3,) = api.produce("survive", {"body": "pulled"})
        assert [m["id"] for m in api.pull_until("survive", "g", 1, ack=True)] == [p3["id"]]
    finally:
        d.stop()
    log = d.log_path.read_text()
    assert SECRET not in log and "Traceback" not in log


def test_kill9_mid_delivery_delivers_again_after_restart_never_early(tmp_path: Path, receiver: Receiver) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    path = "/kill9"
    receiver.script(path, Reply(hold=True))
    try:
        api = Api(d)
        push_put(api, "crash", "g", receiver.url(path), secret=SECRET)
        (p,) = api.produce("crash", {"body": "at least once", "delay_ms": 500})
        wait_until(lambda: receiver.active[path] == 1, 10, what="the endpoint holding the POST")
        d.kill9()
        receiver.release(path)  # its answer goes nowhere: the daemon never acked
        d.start()
        first, again = wait_until(lambda: len(receiver.answered(path)) == 2 and receiver.hits(path), 10,
                                  what="the same message again after the restart")
        for h in (first, again):
            assert h.headers["delayd-id"] == p["id"]
            assert h.at_ms >= p["deliver_at"] - CLOCK_SLACK_MS, "never before deliver_at"
            assert h.int_header("Delayd-Delivered-At") >= p["deliver_at"]
            verify(SECRET, h.headers["delayd-signature"], h.body)
        assert again.int_header("Delayd-Attempt") == 1, "attempts are not durable: a restart starts at 1"
        wait_until(lambda: group_settled(api, "crash", "g"), 5, what="acked after the restart")
        # A graceful stop cuts a held POST at once (not after its 30 s timeout); it comes again.
        receiver.hold(path)
        receiver.script(path, Reply(hold=True))
        api.produce("crash", {"body": "cut by SIGTERM"})
        wait_until(lambda: receiver.active[path] == 1, 10, what="held again")
        assert d.stop(timeout_s=10) == 0
        assert "cut by the shutdown" in d.log_tail()
        receiver.release(path)
        d.start()
        wait_until(lambda: len(receiver.answered(path)) == 4, 10, what="the cut message again")
        assert receiver.hits(path)[3].headers["delayd-id"] == receiver.hits(path)[2].headers["delayd-id"]
        wait_until(lambda: group_settled(api, "crash", "g"), 5, what="acked")
    finally:
        receiver.release(path)
        d.stop()
