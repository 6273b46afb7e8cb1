"""Bad input against the real daemon: every endpoint, random bodies, raw junk, odd content
types, huge headers, truncated msgpack, deep nesting, invalid UTF-8, path traversal in names.

Never a 5xx, never a dropped connection without an answer, the daemon still answers /healthz
afterwards, and a message produced before the fuzzing is still delivered after it. Requests go
over raw sockets (rawhttp) so that nothing is cleaned up by an HTTP library on the way.
Hypothesis runs derandomized and without an example database: the same inputs on every run.

Slow and idle clients: a connection that stalls in the headers or sends nothing is closed after
`request_timeout_s`; a stalled body is answered 408 `request_timeout`; a long-poll pull longer
than that timeout is not cut.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import quote

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.wire import Api, call, now_ms
from tests.robustness.rawhttp import get, raw_request, read_all, status_of
from tests.support.daemon import DaemonProcess, wait_until

SENTINEL_TOPIC = "sentinel-topic-7f3a9c"
SETTINGS = settings(max_examples=1000, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def fuzzd(tmp_path_factory):
    d = DaemonProcess(tmp_path_factory.mktemp("fuzz") / "data",
                      config_text="request_timeout_s = 5.0\nmax_request_bytes = 4194304\n").start()
    api = Api(d)
    api.subscribe(SENTINEL_TOPIC, "keep")
    sentinel = api.produce(SENTINEL_TOPIC, {"body": "still here", "delay_ms": 2000})[0]
    d.sentinel = sentinel  # type: ignore[attr-defined]
    yield d
    # The daemon survived everything below and still delivers what it had before.
    assert call(d, "GET", "/healthz").status == 200
    assert d.proc is not None and d.proc.poll() is None
    got = api.pull_until(SENTINEL_TOPIC, "keep", 1, timeout_s=15, ack=True)
    assert [m["id"] for m in got] == [sentinel["id"]] and got[0]["body"] == "still here"
    assert got[0]["delivered_at"] >= got[0]["deliver_at"]
    text = d.log_path.read_text(errors="replace")
    assert "unexpected failure" not in text and "fatal" not in text, d.log_tail(80)
    assert "Error handling request" not in text, "malformed requests are logged with tracebacks"
    assert d.stop() == 0


# -- strategies ---------------------------------------------------------------------------------
json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True)
                | st.text(max_size=30))
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4)
                           | st.dictionaries(st.text(max_size=12), c, max_size=4), max_leaves=16)
msgpack_values = st.recursive(json_scalars.filter(lambda v: not isinstance(v, int) or -(2**63) <= v < 2**64)
                              | st.binary(max_size=40),
                              lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c,
                                                                                    max_size=4),
                              max_leaves=16)
FIELDS = ["body", "body_b64", "delay_ms", "deliver_at", "key", "tag", "headers", "replace", "messages",
          "max", "wait_ms", "lease_ms", "tags", "receipts", "ids", "start", "max_attempts"]
# Objects with the API's own field names and random values reach deeper than random keys do.
api_objects = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5)
msg_objects = st.fixed_dictionaries({"body": st.text(max_size=20)}, optional={
    "delay_ms": st.integers(-5, 10**14) | json_scalars, "deliver_at": st.integers(-5, 2**64) | json_scalars,
    "key": st.text(max_size=300) | json_scalars, "tag": st.text(max_size=200) | json_scalars,
    "headers": st.dictionaries(st.text(max_size=10), st.text(max_size=10) | json_scalars, max_size=70)
    | json_scalars, "replace": json_scalars})


def pack(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except OverflowError:  # an int beyond 64 bits: send a byte msgpack never uses instead
        return b"\xc1"


def deep(n: int, fmt: str) -> bytes:
    if fmt == "json":
        return b"[" * n + b"]" * n
    return b"\x91" * n + b"\xc0"  # msgpack fixarray(1) nested n deep


bodies = st.one_of(
    json_values.map(lambda v: ("application/json", json.dumps(v).encode())),
    api_objects.map(lambda v: ("application/json", json.dumps(v).encode())),
    msg_objects.map(lambda v: ("application/json", json.dumps(v).encode())),
    st.lists(msg_objects, max_size=3).map(lambda v: ("application/json", json.dumps({"messages": v}).encode())),
    msgpack_values.map(lambda v: ("application/msgpack", pack(v))),
    api_objects.map(lambda v: ("application/msgpack", pack(v))),
    st.tuples(msgpack_values, st.integers(0, 50)).map(lambda t: ("application/msgpack", pack(t[0])[:t[1]])),
    st.tuples(st.sampled_from(["json", "msgpack"]), st.integers(100, 200_000)).map(
        lambda t: ("application/" + t[0], deep(t[1], t[0]))),
    st.binary(max_size=300).map(lambda b: ("application/json", b)),
    st.binary(max_size=300).map(lambda b: ("application/msgpack", b)),
    st.sampled_from([
        b'{"body": "\xff\xfe\xfd"}', b'{"body": "\\ud800"}', b'{"body": "x", "delay_ms": 1' + b"0" * 5000 + b"}",
        b'{"body": "x", "delay_ms": NaN}', b'{"body": "x", "deliver_at": 1e400}', b"\xef\xbb\xbf{}",
        b'{"body": "x"', b"", b"null", b'"just a string"', b'{"messages": []}', b'{"messages": {}}',
        b'{"body_b64": "!!!"}', b'{"body": "x", "headers": {"k": 1}}', b'{"receipts": ["a.b.c", 5]}',
    ]).map(lambda b: ("application/json", b)),
)
content_types = st.sampled_from([
    None, "application/json", "application/msgpack", "text/plain", "application/x-msgpack",
    "APPLICATION/JSON", "application/json; charset=utf-16", "multipart/form-data; boundary=x", "*/*",
    "application/json\u00ff", ";;;", "",
])
names = st.one_of(
    st.sampled_from(["t", "fuzz", "a.b-c_d", "..", ".", "../../etc/passwd", "..%2f..%2fetc", "%2e%2e", ".hidden",
                     "a" * 128, "a" * 129, "ü", "a b", "%00", "%ff%fe", "con", "nul", "a%2fb", "-", "_"]),
    st.text(max_size=20).map(lambda s: quote(s, safe="")),
)
message_ids = st.one_of(
    st.sampled_from(["d-1", "d-2", "d-0", "d--1", "d-+1", "d-1_0", "d-fffffffffffffffff", "d-", "x-1",
                     "d-zz", "..", "%2e%2e%2f", "d-1%00", "d-" + "f" * 16]),
    st.text(max_size=24).map(lambda s: quote(s, safe="")),
)


@st.composite
def requests(draw: Any) -> tuple[str, str, list[tuple[str, str]], bytes]:
    t, g = draw(names), draw(names)
    mid, key = draw(message_ids), draw(names)
    routes = [
        ("POST", f"/v1/topics/{t}/messages"), ("DELETE", f"/v1/messages/{mid}"), ("GET", f"/v1/messages/{mid}"),
        ("DELETE", f"/v1/topics/{t}/keys/{key}"), ("GET", f"/v1/topics/{t}/keys/{key}"),
        ("PUT", f"/v1/topics/{t}/subscriptions/{g}"),
        ("POST", f"/v1/topics/{t}/subscriptions/{g}/pull"), ("POST", f"/v1/topics/{t}/subscriptions/{g}/ack"),
        ("POST", f"/v1/topics/{t}/subscriptions/{g}/nack"),
        ("POST", f"/v1/topics/{t}/subscriptions/{g}/extend"),
        ("GET", f"/v1/topics/{t}/subscriptions/{g}/dead?limit={draw(names)}"),
        ("POST", f"/v1/topics/{t}/subscriptions/{g}/dead/redrive"),
        ("GET", "/v1/stats"), ("GET", f"/v1/schedule?from={draw(names)}&to={draw(names)}&step_ms={draw(names)}"),
        ("GET", "/v1/schedule?from=0&to=10000000000000&step_ms=1"), ("GET", "/v1/info"), ("GET", "/metrics"),
        ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/openapi.json"), ("GET", f"/{t}/../../{g}"),
    ]
    method, path = draw(st.sampled_from(routes))
    if draw(st.integers(0, 9)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE"]))
    ctype, body = draw(bodies)
    ctype = draw(st.one_of(st.just(ctype), content_types))
    headers: list[tuple[str, str]] = []
    if ctype is not None:
        headers.append(("Content-Type", ctype))
    if draw(st.booleans()):
        headers.append(("Accept", draw(st.sampled_from(["application/msgpack", "application/json", "*/*",
                                                         "text/html", "\u00ff"]))))
    extra = draw(st.integers(0, 19))
    if extra == 0:
        headers.append(("X-Huge", "a" * 100 * 1024))
    elif extra == 1:
        headers += [(f"X-Many-{i}", "v") for i in range(200)]
    elif extra == 2:
        headers.append(("Authorization", "Bearer " + "\u00ff" * 10))
    if method in ("GET", "HEAD", "DELETE", "OPTIONS", "TRACE") and draw(st.booleans()):
        body = b""
    return method, path, headers, body


def send(port: int, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n".encode("latin-1", "replace")
    for k, v in headers:
        head += k.encode() + b": " + v.encode("utf-8", "surrogatepass") + b"\r\n"
    head += b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    return raw_request(port, head + body, timeout_s=30)


def assert_sane(resp: bytes, what: str) -> None:
    status = status_of(resp)
    assert status, f"no answer at all to {what}"
    assert status < 500, f"{status} for {what}:\n{resp[:600]!r}"
    head, _, payload = resp.partition(b"\r\n\r\n")
    if status >= 400 and payload:  # (HEAD answers have none)
        # Every error, those of aiohttp's HTTP parser included, in the API's shape.
        assert b"content-type: application/json" in head.lower() or b"application/msgpack" in head.lower(), \
            f"{status} for {what} is not in the API's error shape:\n{resp[:600]!r}"
        if b"application/json" in head.lower():
            body = json.loads(payload)
            assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body


# -- the fuzzing ----------------------------------------------------------------------------------
def test_fuzz_every_endpoint(fuzzd):
    d = fuzzd
    protect = d.sentinel["id"]

    @SETTINGS
    @given(requests())
    def one(req: tuple[str, str, list[tuple[str, str]], bytes]) -> None:
        method, path, headers, body = req
        if protect in path or SENTINEL_TOPIC in path:
            return
        assert_sane(send(d.port, method, path, headers, body), f"{method} {path[:200]} {headers[:3]!r} "
                                                                f"body {body[:200]!r}")

    one()
    assert call(d, "GET", "/healthz").status == 200


def test_fuzz_real_messages_round_trip(fuzzd):
    """Random but valid messages (JSON and msgpack) come back exactly as produced."""
    d = fuzzd
    api = Api(d)
    sent: dict[str, bytes] = {}

    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(st.binary(max_size=2000), st.sampled_from(["json", "msgpack"]),
           st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda s: s.isprintable()),
                           st.text(max_size=8), max_size=3))
    def one(body: bytes, fmt: str, hdrs: dict[str, str]) -> None:
        msg: dict[str, Any] = {"headers": hdrs} if hdrs else {}
        if fmt == "msgpack":
            resp = call(d, "POST", "/v1/topics/roundtrip/messages", {**msg, "body": body}, fmt="application/msgpack")
        else:
            import base64
            resp = call(d, "POST", "/v1/topics/roundtrip/messages",
                        {**msg, "body_b64": base64.b64encode(body).decode()})
        assert resp.status == 200, resp.raw
        sent[resp.body["messages"][0]["id"]] = body

    one()
    got = api.pull_until("roundtrip", "g", len(sent), timeout_s=20, ack=True, max=1000,
                         fmt="application/msgpack")
    assert {m["id"]: bytes(m["body"]) for m in got} == sent


def test_huge_and_odd_headers_are_4xx(fuzzd):
    d = fuzzd
    for extra in (b"X-Big: " + b"a" * 100 * 1024 + b"\r\n",
                  b"".join(b"X-%d: a\r\n" % i for i in range(1000)),
                  b"X-Bad: \xff\xfe\x00\r\n", b"\xff\xfe: y\r\n", b"Content-Length: -1\r\n",
                  b"Content-Length: 99999999999999999999\r\n", b"Transfer-Encoding: gzip, chunked, x\r\n"):
        resp = raw_request(d.port, get("/v1/stats", extra))
        assert 400 <= status_of(resp) < 500, (extra[:40], resp[:200])
        assert_sane(resp, repr(extra[:40]))
    for raw in (get("/" + "a" * 100_000), b"GARBAGE\r\n\r\n",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64)):  # a TLS hello on the plain port
        resp = raw_request(d.port, raw)
        assert status_of(resp) in range(400, 500), resp[:200]
        assert_sane(resp, repr(raw[:40]))


# -- slow and idle clients --------------------------------------------------------------------------
@pytest.fixture
def slowd(tmp_path):
    d = DaemonProcess(tmp_path / "data", config_text="request_timeout_s = 1.0\n").start()
    yield d
    assert d.stop() == 0


def closed_within(s: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Read until the daemon closes the connection; (what it sent, seconds it took)."""
    t0 = time.monotonic()
    data = read_all(s, timeout_s)
    took = time.monotonic() - t0
    s.settimeout(0.5)
    try:
        assert s.recv(1) == b"", "the connection is still open"
    except (ConnectionResetError, BrokenPipeError):
        pass
    return data, took


def test_stalled_and_idle_connections_are_closed(slowd):
    d = slowd
    conns = []
    for _ in range(20):
        idle = socket.create_connection(("127.0.0.1", d.port))
        half_line = socket.create_connection(("127.0.0.1", d.port))
        half_line.sendall(b"GET /heal")
        half_headers = socket.create_connection(("127.0.0.1", d.port))
        half_headers.sendall(b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Ty")
        conns += [idle, half_line, half_headers]
    # Meanwhile everyone else is served.
    assert call(d, "GET", "/healthz").status == 200
    for s in conns:
        data, took = closed_within(s, 10)
        assert data == b"" and took < 5, (data[:100], took)
        s.close()


def test_stalled_body_is_answered_408(slowd):
    d = slowd
    s = socket.create_connection(("127.0.0.1", d.port))
    s.sendall(b"POST /v1/topics/slow/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{\"body\": \"")
    data, took = closed_within(s, 10)
    s.close()
    assert status_of(data) == 408 and b'"request_timeout"' in data, data[:300]
    assert took < 5
    assert Api(d).stats()["produced_total"] == 0


def test_long_poll_outlives_the_request_timeout(slowd):
    """The idle timeout is for clients that do not send; a pull waiting for messages is not idle."""
    d = slowd
    api = Api(d)
    api.subscribe("lp", "g")
    deliver_at = now_ms() + 2500
    api.produce("lp", {"body": "late", "deliver_at": deliver_at})
    t0 = time.monotonic()
    got = api.pull("lp", "g", wait_ms=5000)
    assert [m["body"] for m in got] == ["late"] and time.monotonic() - t0 > 1.5
    assert got[0]["delivered_at"] >= deliver_at
    wait_until(lambda: api.stats()["scheduled"] == 0, 5, what="stats to settle")
