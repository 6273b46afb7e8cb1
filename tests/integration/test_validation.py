"""Bad input against a real daemon: every way a request can be wrong answers 4xx with the API's
error shape `{"error": {"code", "message"[, "index"]}}` — never a 5xx, never a crash, and
nothing of a rejected batch is stored (API.md, Encoding / Names / Produce / Consume).
"""

from __future__ import annotations

import base64
import json
import random
import re
import socket
from typing import Any

import msgpack
import pytest

from tests.integration.wire import JSON, MSGPACK, Api, Resp, assert_error, call, daemon_log_clean, now_ms, ok
from tests.support.daemon import DaemonProcess

DAY_MS = 86_400_000
MAX_DELAY_MS = 3650 * DAY_MS
MIB = 1024 * 1024
SUB = "/v1/topics/v/subscriptions/g"


def produced_in(api: Api, topic: str) -> int:
    return int(api.stats()["topics"].get(topic, {}).get("produced_total", 0))


# -- encoding -------------------------------------------------------------------------------------
BAD_JSON = {
    "syntax": b'{bad',
    "trailing-garbage": b'{"body": "x"} x',
    "two-documents": b'{"body": "x"}{"body": "y"}',
    "truncated": b'{"body": "x", "delay_ms": 1',
    "invalid-utf8": b'{"body": "\xff\xfe"}',
    "invalid-utf8-in-key": b'{"bo\xc3dy": "x"}',
    "overlong-utf8": b'{"body": "\xc0\xaf"}',
    "utf16": '{"body": "x"}'.encode("utf-16"),
    "deep-arrays": b"[" * 100_000 + b"]" * 100_000,
    "deep-objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "huge-int": b'{"body": "x", "delay_ms": 1' + b"0" * 5000 + b"}",
    "nul": b"\x00",
}


@pytest.mark.parametrize("raw", BAD_JSON.values(), ids=BAD_JSON.keys())
def test_bad_json_is_400(api: Api, raw: bytes) -> None:
    resp = api.call("POST", "/v1/topics/v/messages", raw=raw, content_type=JSON)
    assert_error(resp, 400)
    assert resp.content_type == JSON


def test_json_numbers_that_are_not_integers(api: Api) -> None:
    for raw in (b'{"body": "x", "delay_ms": NaN}', b'{"body": "x", "delay_ms": Infinity}',
                b'{"body": "x", "delay_ms": 1e400}', b'{"body": "x", "delay_ms": 1.0}',
                b'{"body": "x", "delay_ms": 1e3}'):
        assert_error(api.call("POST", "/v1/topics/v/messages", raw=raw, content_type=JSON), 400)


VALID_MP = msgpack.packb({"body": b"x" * 100, "delay_ms": 5}, use_bin_type=True)
BAD_MSGPACK = {
    "truncated": VALID_MP[:-10],
    "extra-data": VALID_MP + b"\x00",
    "reserved-byte": b"\xc1",
    "int-map-key": msgpack.packb({1: 2}),
    "ext-type": msgpack.packb(msgpack.ExtType(1, b"ab")),
    "invalid-utf8-str": b"\x81\xa4body\xa2\xff\xfe",
    "deep-arrays": b"\x91" * 100_000 + b"\xc0",
    "bin-length-lies": b"\x81\xa4body\xc6\xff\xff\xff\xff",
    "array-length-lies": b"\xdd\xff\xff\xff\xff",
    "json-sent-as-msgpack": b'{"body": "x"}',
}


@pytest.mark.parametrize("raw", BAD_MSGPACK.values(), ids=BAD_MSGPACK.keys())
def test_bad_msgpack_is_400_in_msgpack(api: Api, raw: bytes) -> None:
    resp = api.call("POST", "/v1/topics/v/messages", raw=raw, content_type=MSGPACK)
    assert_error(resp, 400)
    assert resp.content_type == MSGPACK, "errors answer in the request's encoding"


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "application/json+x",
                                   "multipart/form-data; boundary=x", "application/octet-stream", "", None])
@pytest.mark.parametrize("path", ["/v1/topics/v/messages", f"{SUB}/pull", f"{SUB}/ack"])
def test_wrong_content_type_is_415(api: Api, path: str, ctype: str | None) -> None:
    body = b'{"body": "x"}' if path.endswith("messages") else b'{"receipts": []}'
    assert_error(api.call("POST", path, raw=body, content_type=ctype), 415, "unsupported_media_type")


def test_wrong_content_type_on_put_is_415(api: Api) -> None:
    assert_error(api.call("PUT", SUB, raw=b"start=latest", content_type="text/plain"), 415)


@pytest.mark.parametrize("ctype", ["application/json; charset=utf-8", "Application/JSON", "application/msgpack"])
def test_content_type_parameters_and_case_are_accepted(api: Api, ctype: str) -> None:
    body = (msgpack.packb({"body": b"x"}) if "msgpack" in ctype else b'{"body": "x"}')
    assert api.call("POST", "/v1/topics/v/messages", raw=body, content_type=ctype).status == 200


def test_request_body_not_an_object(api: Api) -> None:
    for body in ([], "str", 5, None, [{"body": "x"}]):
        assert_error(api.call("POST", "/v1/topics/v/messages", body), 400)
        assert_error(api.call("POST", f"{SUB}/pull", body), 400)
        assert_error(api.call("PUT", SUB, body), 400)


# -- message fields -------------------------------------------------------------------------------
FUTURE = now_ms() + MAX_DELAY_MS + 3_600_000
BAD_MESSAGES: dict[str, tuple[dict[str, Any], str]] = {
    "no-body": ({"delay_ms": 5}, "invalid_message"),
    "body-and-body_b64": ({"body": "x", "body_b64": "eA=="}, "invalid_message"),
    "body-int": ({"body": 5}, "invalid_message"),
    "body-null": ({"body": None}, "invalid_message"),
    "body-list": ({"body": ["x"]}, "invalid_message"),
    "body-object": ({"body": {"x": 1}}, "invalid_message"),
    "body-bool": ({"body": True}, "invalid_message"),
    "body-lone-surrogate": ({"body": "\ud800"}, "invalid_message"),
    "body_b64-int": ({"body_b64": 5}, "invalid_message"),
    "body_b64-null": ({"body_b64": None}, "invalid_message"),
    "body_b64-not-base64": ({"body_b64": "not base64!"}, "invalid_message"),
    "body_b64-no-padding": ({"body_b64": "eA"}, "invalid_message"),
    "body_b64-non-ascii": ({"body_b64": "é"}, "invalid_message"),
    "delay_ms-string": ({"body": "x", "delay_ms": "10"}, "invalid_message"),
    "delay_ms-float": ({"body": "x", "delay_ms": 1.5}, "invalid_message"),
    "delay_ms-bool": ({"body": "x", "delay_ms": True}, "invalid_message"),
    "delay_ms-null": ({"body": "x", "delay_ms": None}, "invalid_message"),
    "delay_ms-list": ({"body": "x", "delay_ms": [1]}, "invalid_message"),
    "delay_ms-negative": ({"body": "x", "delay_ms": -1}, "invalid_message"),
    "delay_ms-beyond-horizon": ({"body": "x", "delay_ms": MAX_DELAY_MS + 1}, "delay_too_long"),
    "delay_ms-huge": ({"body": "x", "delay_ms": 2**80}, "delay_too_long"),
    "deliver_at-string": ({"body": "x", "deliver_at": "2030-01-01"}, "invalid_message"),
    "deliver_at-iso-without-zone": ({"body": "x", "deliver_at": "2030-01-01T08:00:00"}, "invalid_message"),
    "deliver_at-iso-bad-month": ({"body": "x", "deliver_at": "2030-13-01T08:00:00Z"}, "invalid_message"),
    "deliver_at-iso-bad-offset": ({"body": "x", "deliver_at": "2030-01-01T08:00:00+24:00"}, "invalid_message"),
    "deliver_at-iso-before-1970": ({"body": "x", "deliver_at": "1969-12-31T23:59:59Z"}, "invalid_message"),
    "deliver_at-iso-padded": ({"body": "x", "deliver_at": " 2030-01-01T08:00:00Z"}, "invalid_message"),
    "deliver_at-iso-beyond-horizon": ({"body": "x", "deliver_at": "9999-01-01T00:00:00Z"}, "delay_too_long"),
    "deliver_at-float": ({"body": "x", "deliver_at": 1.5}, "invalid_message"),
    "deliver_at-bool": ({"body": "x", "deliver_at": False}, "invalid_message"),
    "deliver_at-beyond-horizon": ({"body": "x", "deliver_at": FUTURE}, "delay_too_long"),
    "delay_ms-and-deliver_at": ({"body": "x", "delay_ms": 5, "deliver_at": 5}, "invalid_message"),
    "key-int": ({"body": "x", "key": 5}, "invalid_message"),
    "key-empty": ({"body": "x", "key": ""}, "invalid_message"),
    "key-257-bytes": ({"body": "x", "key": "k" * 257}, "invalid_message"),
    "key-257-bytes-multibyte": ({"body": "x", "key": "é" * 129}, "invalid_message"),
    "key-list": ({"body": "x", "key": ["k"]}, "invalid_message"),
    "tag-int": ({"body": "x", "tag": 5}, "invalid_message"),
    "tag-129-chars": ({"body": "x", "tag": "t" * 129}, "invalid_message"),
    "tag-list": ({"body": "x", "tag": ["a"]}, "invalid_message"),
    "headers-list": ({"body": "x", "headers": [["a", "b"]]}, "invalid_message"),
    "headers-string": ({"body": "x", "headers": "a=b"}, "invalid_message"),
    "headers-int-value": ({"body": "x", "headers": {"a": 1}}, "invalid_message"),
    "headers-null-value": ({"body": "x", "headers": {"a": None}}, "invalid_message"),
    "headers-nested": ({"body": "x", "headers": {"a": {"b": "c"}}}, "invalid_message"),
    "headers-65-entries": ({"body": "x", "headers": {f"h{i}": "v" for i in range(65)}}, "invalid_message"),
    "headers-over-8KiB": ({"body": "x", "headers": {"a": "v" * 8192}}, "invalid_message"),
    "replace-string": ({"body": "x", "replace": "yes"}, "invalid_message"),
    "replace-int": ({"body": "x", "replace": 1}, "invalid_message"),
    "unknown-field": ({"body": "x", "delay": 5}, "invalid_message"),
    "unknown-field-typo": ({"body": "x", "delay_msec": 5}, "invalid_message"),
}


@pytest.mark.parametrize("msg,code", BAD_MESSAGES.values(), ids=BAD_MESSAGES.keys())
def test_bad_message_field_is_400_with_index(api: Api, msg: dict[str, Any], code: str) -> None:
    topic = "badfield"
    before = produced_in(api, topic)
    err = assert_error(api.call("POST", f"/v1/topics/{topic}/messages", msg), 400, code)
    assert err["index"] == 0
    # The same message in a batch, behind two good ones: the index names it, nothing is stored.
    batch = {"messages": [{"body": "ok"}, {"body": "ok"}, msg]}
    err = assert_error(api.call("POST", f"/v1/topics/{topic}/messages", batch), 400, code)
    assert err["index"] == 2
    assert produced_in(api, topic) == before, "a rejected batch stored something"


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_deliver_at_as_an_iso_8601_time_with_a_zone(api: Api, fmt: str) -> None:
    at = 1_893_484_800_000  # 2030-01-01T08:00:00Z
    sent = api.produce("iso", {"body": "z", "deliver_at": "2030-01-01T08:00:00Z"},
                       {"body": "offset", "deliver_at": "2030-01-01T09:00:00+01:00"},
                       {"body": "minutes", "deliver_at": "2030-01-01T08:00Z"},
                       {"body": "fraction", "deliver_at": "2030-01-01T08:00:00.1239Z"},
                       {"body": "lower", "deliver_at": "2030-01-01t03:00:00.5-05:00"}, fmt=fmt)
    assert [m["deliver_at"] for m in sent] == [at, at, at, at + 123, at + 500]
    assert ok(api.get(sent[1]["id"]))["deliver_at"] == at, "stored as epoch ms, shown as epoch ms"
    err = assert_error(api.call("POST", "/v1/topics/iso/messages", {"body": "x", "deliver_at": "2030-01-01T08:00"},
                                fmt=fmt), 400, "invalid_message")
    assert "zone" in err["message"]
    # In the past: due now, delivered like an integer deliver_at in the past.
    (past,) = api.produce("iso-past", {"body": "p", "deliver_at": "2001-02-03T04:05:06Z"}, fmt=fmt)
    assert past["deliver_at"] == 981_173_106_000
    assert api.pull_until("iso-past", "g", 1, ack=True)[0]["id"] == past["id"]


# Every length limit in characters and in UTF-8 bytes, at the limit and one past it. The bytes
# matter where the commit log's length field is narrower than the characters allow: tag_len is one
# byte, so a tag of 128 "é" (256 bytes) used to fail inside the encoder and answer 500.
FIELD_LIMITS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "tag-chars": ({"tag": "t" * 128}, {"tag": "t" * 129}, "128 characters"),
    "tag-bytes-2": ({"tag": "é" * 127 + "a"}, {"tag": "é" * 128}, "255 UTF-8 bytes"),
    "tag-bytes-3": ({"tag": "€" * 85}, {"tag": "€" * 86}, "255 UTF-8 bytes"),
    "tag-bytes-4": ({"tag": "😀" * 63 + "abc"}, {"tag": "😀" * 64}, "255 UTF-8 bytes"),
    "key-chars": ({"key": "k" * 256}, {"key": "k" * 257}, "256 UTF-8 bytes"),
    "key-bytes": ({"key": "€" * 85 + "a"}, {"key": "€" * 85 + "ab"}, "256 UTF-8 bytes"),
    "headers-entries": ({"headers": {f"h{i}": "" for i in range(64)}},
                        {"headers": {f"h{i}": "" for i in range(65)}}, "64"),
    "headers-chars": ({"headers": {"a": "v" * 8191}}, {"headers": {"a": "v" * 8192}}, "8192 UTF-8 bytes"),
    "headers-bytes": ({"headers": {"é": "€" * 2730}}, {"headers": {"é": "€" * 2730 + "a"}}, "8192 UTF-8 bytes"),
}


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
@pytest.mark.parametrize("good,bad,limit", FIELD_LIMITS.values(), ids=FIELD_LIMITS.keys())
def test_each_field_at_its_limit_and_one_past(api: Api, fmt: str, good: dict[str, Any], bad: dict[str, Any],
                                              limit: str) -> None:
    topic = "limits"
    ok(api.call("POST", f"/v1/topics/{topic}/messages", {"body": "x", **good}, fmt=fmt))
    before = produced_in(api, topic)
    batch = {"messages": [{"body": "a"}, {"body": "b", **bad}]}
    err = assert_error(api.call("POST", f"/v1/topics/{topic}/messages", batch, fmt=fmt), 400, "invalid_message")
    assert err["index"] == 1 and limit in err["message"], err
    assert produced_in(api, topic) == before


@pytest.mark.parametrize("name", ["a" * 129, "%C3%A9", "%C3%A9" * 64])
def test_topic_limit_in_characters_and_bytes(api: Api, name: str) -> None:
    """Topic names are ASCII, so 128 characters are 128 bytes and fit topic_len (one byte)."""
    ok(api.call("POST", f"/v1/topics/{'a' * 128}/messages", {"body": "x"}))
    assert_error(api.call("POST", f"/v1/topics/{name}/messages", {"body": "x"}), 400, "invalid_name")


def test_limits_exactly_at_the_boundary_are_accepted(api: Api) -> None:
    ok(api.call("POST", "/v1/topics/edge/messages", {
        "body": "x", "key": "k" * 256, "tag": "t" * 128, "delay_ms": MAX_DELAY_MS,
        "headers": {f"h{i:02}": "v" for i in range(64)}}))
    ok(api.call("POST", "/v1/topics/edge/messages", {"body": "x", "key": "é" * 128, "headers": {"a": "v" * 8191}}))
    ok(api.call("POST", "/v1/topics/edge/messages", {"body": "x", "delay_ms": 0}))
    ok(api.call("POST", "/v1/topics/edge/messages", {"body": "x", "deliver_at": 0}))  # the past: due now
    ok(api.call("POST", "/v1/topics/edge/messages", {"body": "x", "key": None, "tag": None, "headers": None}))


def test_body_over_one_mib_is_413_too_large(api: Api) -> None:
    topic = "big"
    ok(api.call("POST", f"/v1/topics/{topic}/messages", {"body": "x" * MIB}))
    before = produced_in(api, topic)
    err = assert_error(api.call("POST", f"/v1/topics/{topic}/messages", {"body": "x" * (MIB + 1)}), 413, "too_large")
    assert err["index"] == 0
    b64 = base64.b64encode(b"\x00" * (MIB + 1)).decode()
    assert_error(api.call("POST", f"/v1/topics/{topic}/messages", {"body_b64": b64}), 413, "too_large")
    mp = api.call("POST", f"/v1/topics/{topic}/messages", {"body": b"\x00" * (MIB + 1)}, fmt=MSGPACK)
    assert_error(mp, 413, "too_large")
    batch = {"messages": [{"body": "a"}, {"body": "b"}, {"body": "x" * (MIB + 1)}]}
    err = assert_error(api.call("POST", f"/v1/topics/{topic}/messages", batch), 413, "too_large")
    assert err["index"] == 2
    assert produced_in(api, topic) == before


def test_batch_of_zero_and_of_10001_messages_is_400(api: Api) -> None:
    topic = "batch"
    assert_error(api.call("POST", f"/v1/topics/{topic}/messages", {"messages": []}), 400, "invalid_message")
    big = {"messages": [{"body": ""}] * 10_001}
    assert_error(api.call("POST", f"/v1/topics/{topic}/messages", big), 400, "invalid_message")
    assert_error(api.call("POST", f"/v1/topics/{topic}/messages", {"messages": {"body": "x"}}), 400)
    assert_error(api.call("POST", f"/v1/topics/{topic}/messages", {"messages": None}), 400)
    assert_error(api.call("POST", f"/v1/topics/{topic}/messages",
                          {"messages": [{"body": "x"}], "body": "y"}), 400, "invalid_message")
    err = assert_error(api.call("POST", f"/v1/topics/{topic}/messages",
                                {"messages": [{"body": "x"}, 5, {"body": "y"}]}), 400, "invalid_message")
    assert err["index"] == 1
    assert produced_in(api, topic) == 0
    out = ok(api.call("POST", f"/v1/topics/{topic}/messages", {"messages": [{"body": ""}] * 10_000}))
    assert len(out["messages"]) == 10_000


# -- names ----------------------------------------------------------------------------------------
BAD_NAMES = {
    "129-chars": "a" * 129,
    "leading-dot": ".hidden",
    "dotdot": "..",
    "encoded-dotdot": "%2e%2e",
    "encoded-slash": "a%2Fb",
    "path-traversal": "..%2F..",
    "path-traversal-2": "..%2F..%2Fetc",
    "unicode": "%C3%A9t%C3%A9",
    "space": "a%20b",
    "nul": "a%00",
    "newline": "a%0A",
    "star": "a*",
    "colon": "a:b",
    "invalid-percent-utf8": "%ff",
    "plus": "a+b",
}
NAME_ROUTES = [
    ("POST", "/v1/topics/{n}/messages", {"body": "x"}),
    ("PUT", "/v1/topics/{n}/subscriptions/g", {}),
    ("PUT", "/v1/topics/v/subscriptions/{n}", {}),
    ("POST", "/v1/topics/{n}/subscriptions/g/pull", {}),
    ("POST", "/v1/topics/v/subscriptions/{n}/pull", {}),
    ("POST", "/v1/topics/v/subscriptions/{n}/ack", {"receipts": []}),
    ("GET", "/v1/topics/{n}/subscriptions/g/dead", None),
    ("POST", "/v1/topics/v/subscriptions/{n}/dead/redrive", {}),
]


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
@pytest.mark.parametrize("method,path,body", NAME_ROUTES, ids=[f"{m}-{p}" for m, p, _ in NAME_ROUTES])
def test_bad_names_are_400_invalid_name(api: Api, method: str, path: str, body: Any, name: str) -> None:
    resp = api.call(method, path.format(n=name), *(() if body is None else (body,)))
    # A name the router cannot even match (a literal '/' after decoding, '..' segments that
    # resolve away) may be a 404 instead; a 5xx or a 200 never.
    err = assert_error(resp, (400, 404))
    if resp.status == 400:
        assert err["code"] == "invalid_name", err


@pytest.mark.parametrize("name", ["", "a/b", "../x"])
def test_names_that_change_the_path_are_404_or_400(api: Api, name: str) -> None:
    for method, path, body in NAME_ROUTES:
        assert_error(api.call(method, path.format(n=name), *(() if body is None else (body,))), (400, 404, 405))


@pytest.mark.parametrize("name", ["a" * 128, "-", "_", "a.b", "A-Z_0.9", "a..b"])
def test_good_names_are_accepted(api: Api, name: str) -> None:
    ok(api.call("POST", f"/v1/topics/{name}/messages", {"body": "x"}))
    assert api.subscribe(name, name)["group"] == name
    assert isinstance(api.pull(name, name), list)


# -- consume parameters ---------------------------------------------------------------------------
BAD_PULLS = {
    "max-0": {"max": 0}, "max-1001": {"max": 1001}, "max-string": {"max": "5"}, "max-float": {"max": 1.5},
    "max-bool": {"max": True}, "wait_ms-30001": {"wait_ms": 30_001}, "wait_ms-negative": {"wait_ms": -1},
    "wait_ms-string": {"wait_ms": "0"}, "lease_ms-999": {"lease_ms": 999},
    "lease_ms-over-12h": {"lease_ms": 12 * 3_600_000 + 1}, "lease_ms-list": {"lease_ms": [1000]},
    "tags-string": {"tags": "a"}, "tags-ints": {"tags": [1]}, "tags-nested": {"tags": [["a"]]},
    "tags-1001": {"tags": [f"t{i}" for i in range(1001)]}, "unknown-field": {"lease": 1000},
    "typo": {"max": 5, "wait": 100},
}


@pytest.mark.parametrize("params", BAD_PULLS.values(), ids=BAD_PULLS.keys())
def test_pull_parameters_out_of_range_are_400(api: Api, params: dict[str, Any]) -> None:
    assert_error(api.call("POST", f"{SUB}/pull", params), 400)
    assert_error(api.call("POST", f"{SUB}/pull", params, fmt=MSGPACK), 400)


def test_pull_parameters_at_the_boundary_are_accepted(api: Api) -> None:
    for params in ({"max": 1}, {"max": 1000}, {"wait_ms": 0}, {"lease_ms": 1000}, {"lease_ms": 12 * 3_600_000},
                   {"tags": []}, {"tags": ["a"] * 1000}, {}):
        assert isinstance(api.pull("v", "bounds", **params), list)
    assert ok(api.call("POST", "/v1/topics/v/subscriptions/bounds/pull", raw=b"", content_type=None)) == \
        {"messages": []}, "a pull without a body takes the defaults"


BAD_SETTLES = {
    "ack-receipts-string": ("ack", {"receipts": "r"}),
    "ack-receipts-missing": ("ack", {}),
    "ack-receipts-null": ("ack", {"receipts": None}),
    "ack-receipts-ints": ("ack", {"receipts": [1, 2]}),
    "ack-receipts-object": ("ack", {"receipts": {"r": 1}}),
    "ack-unknown-field": ("ack", {"receipts": [], "delay_ms": 5}),
    "nack-delay-negative": ("nack", {"receipts": [], "delay_ms": -1}),
    "nack-delay-string": ("nack", {"receipts": [], "delay_ms": "5"}),
    "nack-delay-float": ("nack", {"receipts": [], "delay_ms": 0.5}),
    "nack-receipts-missing": ("nack", {"delay_ms": 5}),
    "nack-unknown-field": ("nack", {"receipts": [], "delay": 5}),
    "extend-lease-missing": ("extend", {"receipts": []}),
    "extend-lease-999": ("extend", {"receipts": [], "lease_ms": 999}),
    "extend-lease-string": ("extend", {"receipts": [], "lease_ms": "5000"}),
    "extend-unknown-field": ("extend", {"receipts": [], "lease_ms": 5000, "x": 1}),
}


@pytest.mark.parametrize("op,body", BAD_SETTLES.values(), ids=BAD_SETTLES.keys())
def test_bad_ack_nack_extend_are_400(api: Api, op: str, body: dict[str, Any]) -> None:
    assert_error(api.call("POST", f"{SUB}/{op}", body), 400)


def test_too_many_receipts_is_400(api: Api) -> None:
    assert_error(api.call("POST", f"{SUB}/ack", {"receipts": ["x"] * 10_001}), 400)


def test_garbage_receipts_are_stale_not_errors(api: Api) -> None:
    junk = ["", ".", "..", "x.y.z", "d-1.zz.tok", "d-1.-1.tok", "d-1." + "f" * 40 + ".t", "é.é.é", "a" * 1000]
    assert ok(api.call("POST", f"{SUB}/ack", {"receipts": junk})) == {"acked": 0, "stale": junk}
    assert ok(api.call("POST", f"{SUB}/nack", {"receipts": junk}))["stale"] == junk
    assert ok(api.call("POST", f"{SUB}/extend", {"receipts": junk, "lease_ms": 5000}))["stale"] == junk


@pytest.mark.parametrize("body", [{"start": "middle"}, {"start": 1}, {"start": None}, {"start": ["latest"]},
                                  {"max_attempts": 0}, {"max_attempts": 1001}, {"max_attempts": "3"},
                                  {"max_attempts": True}, {"max_attempts": 2.0}, {"maxattempts": 3}],
                         ids=lambda b: json.dumps(b))
def test_bad_subscription_settings_are_400(api: Api, body: dict[str, Any]) -> None:
    assert_error(api.call("PUT", "/v1/topics/v/subscriptions/settings", body), 400)


@pytest.mark.parametrize("body", [{"ids": "d-1"}, {"ids": [1]}, {"ids": [None]}, {"id": ["d-1"]}],
                         ids=lambda b: json.dumps(b))
def test_bad_redrive_is_400(api: Api, body: dict[str, Any]) -> None:
    assert_error(api.call("POST", f"{SUB}/dead/redrive", body), 400)


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=abc", "limit=1.5", "limit=", "limit=-1",
                                   "limit=1_0", "limit=%D9%A3", "limit=%201"])
def test_bad_dead_limit_is_400(api: Api, query: str) -> None:
    assert_error(api.call("GET", f"{SUB}/dead?{query}"), 400)


# -- schedule -------------------------------------------------------------------------------------
@pytest.mark.parametrize("query", [
    "", "from=0&to=10", "from=0&step_ms=1", "to=10&step_ms=1",
    "from=x&to=10&step_ms=1", "from=0&to=10&step_ms=1.5", "from=0&to=1e3&step_ms=1",
    "from=0&to=10&step_ms=0", "from=0&to=10&step_ms=-1", "from=10&to=10&step_ms=1", "from=10&to=5&step_ms=1",
    "from=0&to=10001&step_ms=1", "from=0&to=100000000000&step_ms=1",
    "from=1_0&to=100&step_ms=1", "from=%D9%A3&to=10&step_ms=1", "from=+1&to=10&step_ms=1",
    "from=99999999999999999999999999&to=999999999999999999999999999&step_ms=1",
])
def test_bad_schedule_query_is_400(api: Api, query: str) -> None:
    assert_error(api.call("GET", f"/v1/schedule?{query}"), 400)


def test_schedule_with_exactly_10000_buckets_is_accepted(api: Api) -> None:
    buckets = ok(api.call("GET", "/v1/schedule?from=0&to=10000&step_ms=1"))["buckets"]
    assert len(buckets) == 10_000
    assert len(ok(api.call("GET", "/v1/schedule?from=0&to=20000&step_ms=2"))["buckets"]) == 10_000


# -- routes and methods ---------------------------------------------------------------------------
@pytest.mark.parametrize("method,path", [
    ("GET", "/nope"), ("GET", "/v1"), ("GET", "/v1/"), ("GET", "/v1/topics"), ("GET", "/v1/topics/t"),
    ("POST", "/v1/topics/t/subscriptions/g/unknown"), ("GET", "/v2/stats"), ("GET", "/v1/messages/"),
    ("GET", "/v1/messages/nope"), ("GET", "/v1/messages/d-zz"), ("GET", "/v1/messages/x-1"),
    ("GET", "/v1/messages/d-ffffffffffffffffff"), ("DELETE", "/v1/messages/d-fffffffff"),
    ("GET", "/v1/topics/../../etc/passwd"), ("GET", "/v1/messages/%ff"), ("GET", "/%"),
])
def test_unknown_routes_and_ids_are_404_with_the_error_shape(api: Api, method: str, path: str) -> None:
    assert_error(api.call(method, path), 404, "not_found")
    resp = api.call(method, path, accept=MSGPACK)
    assert_error(resp, 404, "not_found")
    assert resp.content_type == MSGPACK


def test_only_the_issued_id_names_a_message(api: Api) -> None:
    ids = [p["id"] for p in api.produce("ids", *({"body": str(i)} for i in range(40)))]
    mid = next(i for i in ids if any(c in "abcdef" for c in i.split("-", 1)[1]))  # has a hex letter
    node, num = mid.split("-", 1)
    assert ok(api.get(mid))["id"] == mid
    aliases = [f"{node}-0{num}", f"{node}-+{num}", f"{node}-{num.upper()}", f"{node}-%20{num}",
               f"{node}-{num}%20", f"{node}-{num[0]}_{num[1:]}" if len(num) > 1 else f"{node}-0_{num}"]
    answered = {a: api.get(a).status for a in aliases}
    assert all(s == 404 for s in answered.values()), answered
    assert all(api.call("DELETE", f"/v1/messages/{a}").status == 404 for a in aliases)


@pytest.mark.parametrize("method,path", [
    ("DELETE", "/v1/topics/t/messages"), ("PUT", "/v1/topics/t/messages"), ("DELETE", "/v1/stats"),
    ("POST", "/v1/messages"),  # (GET of both lists pending messages: docs/api.md, Additions)
    ("POST", "/v1/stats"), ("PUT", "/v1/messages/d-1"), ("POST", "/v1/messages/d-1"),
    ("POST", "/v1/topics/t/subscriptions/g"), ("GET", "/v1/topics/t/subscriptions/g/pull"),
    ("GET", "/v1/topics/t/subscriptions/g/ack"), ("POST", "/v1/topics/t/subscriptions/g/dead"),
    ("GET", "/v1/topics/t/subscriptions/g/dead/redrive"), ("POST", "/healthz"), ("DELETE", "/metrics"),
    ("POST", "/openapi.json"), ("PATCH", "/v1/schedule"), ("OPTIONS", "/v1/stats"),
])
def test_wrong_method_is_405_with_the_error_shape_and_allow(api: Api, method: str, path: str) -> None:
    resp = api.call(method, path, raw=b"{}", content_type=JSON)
    assert_error(resp, 405, "method_not_allowed")
    assert resp.headers.get("allow"), "a 405 names the allowed methods"


def test_head_on_a_get_only_route_is_405_without_a_body(api: Api) -> None:
    resp = api.call("HEAD", "/v1/stats")
    assert resp.status == 405 and resp.raw == b""


# -- limits of a whole request --------------------------------------------------------------------
def test_request_over_max_request_bytes_is_413_and_limits_are_configurable(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data", config_text="max_request_bytes = 4096\nmax_body_bytes = 100\n").start()
    try:
        a = Api(d)
        assert_error(a.call("POST", "/v1/topics/t/messages", {"body": "x" * 5000}), 413, "too_large")
        assert_error(a.call("POST", "/v1/topics/t/messages", raw=b"x" * 5000, content_type="text/plain"),
                     (413, 415))
        assert_error(a.call("POST", "/v1/topics/t/subscriptions/g/ack", {"receipts": ["r"] * 2000}), 413)
        err = assert_error(a.call("POST", "/v1/topics/t/messages", {"body": "x" * 101}), 413, "too_large")
        assert err["index"] == 0
        ok(a.call("POST", "/v1/topics/t/messages", {"body": "x" * 100}))
    finally:
        d.stop()
    daemon_log_clean(d)


# -- no 5xx, whatever comes in --------------------------------------------------------------------
def _mutations(rng: random.Random, seed_bodies: list[bytes], n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        b = bytearray(rng.choice(seed_bodies))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            if op == 0 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            elif op == 1 and b:
                del b[rng.randrange(len(b)):]
            elif op == 2:
                b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
            else:
                b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        out.append(bytes(b))
    return out


WEIRD_VALUES: list[Any] = [None, True, False, 0, -1, 2**63, -(2**63), 2**64, 1.5, float("1e308"), "", "x" * 300,
                           "\u0000", "é", [], [1], {}, {"a": "b"}, [[[]]]]


def test_mutated_and_mistyped_bodies_never_get_a_5xx(daemon: DaemonProcess) -> None:
    rng = random.Random(20240521)
    fields = {"/v1/topics/fz/messages": ["body", "body_b64", "delay_ms", "deliver_at", "key", "tag", "headers",
                                         "replace", "messages"],
              "/v1/topics/fz/subscriptions/g/pull": ["max", "wait_ms", "lease_ms", "tags"],
              "/v1/topics/fz/subscriptions/g/ack": ["receipts"],
              "/v1/topics/fz/subscriptions/g/nack": ["receipts", "delay_ms"],
              "/v1/topics/fz/subscriptions/g/extend": ["receipts", "lease_ms"],
              "/v1/topics/fz/subscriptions/g/dead/redrive": ["ids"],
              "/v1/topics/fz/subscriptions/g": ["start", "max_attempts"]}
    statuses: dict[int, int] = {}
    for path, names in fields.items():
        method = "PUT" if path.endswith("/g") else "POST"
        seeds_json, seeds_mp = [], []
        for _ in range(40):
            body = {k: rng.choice(WEIRD_VALUES) for k in rng.sample(names, rng.randint(1, len(names)))}
            if path.endswith("/pull"):
                body["wait_ms"] = 0  # keep the fuzz fast: a valid pull must not long-poll
            for fmt, seeds in ((JSON, seeds_json), (MSGPACK, seeds_mp)):
                try:
                    raw = json.dumps(body).encode() if fmt == JSON else msgpack.packb(body, use_bin_type=True)
                except (OverflowError, ValueError, TypeError):
                    continue
                seeds.append(raw)
                resp = call(daemon, method, path, raw=raw, content_type=fmt, timeout_s=10)
                _check_no_5xx(resp, statuses)
        for fmt, seeds in ((JSON, seeds_json), (MSGPACK, seeds_mp)):
            for raw in _mutations(rng, seeds, 40):
                resp = call(daemon, method, path, raw=raw, content_type=fmt, timeout_s=40)
                _check_no_5xx(resp, statuses)
    assert statuses.get(400, 0) > 100, statuses  # the fuzz did exercise the error paths


def _check_no_5xx(resp: Resp, statuses: dict[int, int]) -> None:
    statuses[resp.status] = statuses.get(resp.status, 0) + 1
    if resp.status != 200:
        assert_error(resp)


# -- below the API: broken HTTP and vanishing clients ---------------------------------------------
def _raw_exchange(d: DaemonProcess, request: bytes, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(request)
        if not read:
            return b""
        out = b""  # an error answer closes the connection, which ends this loop
        while chunk := s.recv(65536):
            out += chunk
        return out


@pytest.mark.parametrize("request_bytes", [
    b"GET /v1/messages/" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"POST /v1/topics/v/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: abc\r\n\r\n{}",
    b"POST /v1/topics/v/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"GET /v1/messages/a\x00b HTTP/1.1\r\nHost: x\r\n\r\n",
], ids=["long-url", "long-header", "no-http", "bad-content-length", "bad-chunk", "nul-in-path"])
def test_malformed_http_is_a_4xx(daemon: DaemonProcess, request_bytes: bytes) -> None:
    """aiohttp answers these itself, in text/plain, before any handler or middleware runs; the
    API's error shape cannot apply to a request that is not HTTP, but the status is a 4xx."""
    head = _raw_exchange(daemon, request_bytes).split(b"\r\n", 1)[0]
    assert re.fullmatch(rb"HTTP/1\.[01] 4\d\d .*", head), head
    assert call(daemon, "GET", "/healthz").status == 200


def test_a_client_vanishing_mid_body_is_not_an_unexpected_failure(daemon: DaemonProcess) -> None:
    for path in ("/v1/topics/v/messages", f"{SUB}/pull", f"{SUB}/ack"):
        _raw_exchange(daemon, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              f"Content-Length: 1000\r\n\r\n{{\"body\": ".encode(), read=False)
    assert call(daemon, "GET", "/healthz").status == 200
    daemon_log_clean(daemon)
