"""Raw HTTP access to a real daemon for the API-contract tests (test_consume, test_validation,
test_observe).

`DaemonProcess.request` speaks JSON only; these tests also need msgpack, raw bytes, odd
content types, odd paths and the response headers, so they go through `http.client` here.
"""

from __future__ import annotations

import http.client
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from tests.support.daemon import DaemonProcess, wait_until

JSON = "application/json"
MSGPACK = "application/msgpack"
SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
_UNSET: Any = object()


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    raw: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    @property
    def body(self) -> Any:
        if not self.raw:
            return None
        if self.content_type == MSGPACK:
            return msgpack.unpackb(self.raw, raw=False)
        return json.loads(self.raw)


def call(d: DaemonProcess, method: str, path: str, body: Any = _UNSET, *, fmt: str = JSON,
         raw: bytes | None = None, content_type: str | None = _UNSET, accept: str | None = None,
         timeout_s: float = 40.0) -> Resp:
    """One request. `body` is encoded in `fmt`; `raw` sends bytes as they are. `content_type`
    defaults to `fmt` when there is a body; pass None to send no Content-Type at all."""
    data: bytes | None = raw
    if data is None and body is not _UNSET:
        data = msgpack.packb(body, use_bin_type=True) if fmt == MSGPACK else json.dumps(body).encode()
    headers: dict[str, str] = {}
    ctype = (fmt if data is not None else None) if content_type is _UNSET else content_type
    if ctype is not None:
        headers["Content-Type"] = ctype
    if accept is not None:
        headers["Accept"] = accept
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=timeout_s)
    try:
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def ok(resp: Resp) -> Any:
    assert resp.status == 200, (resp.status, resp.raw[:500])
    return resp.body


def assert_error(resp: Resp, status: int | tuple[int, ...] | None = None, code: str | None = None) -> dict:
    """The API's error shape, a 4xx status, and (optionally) the exact status and code."""
    assert 400 <= resp.status < 500, (resp.status, resp.raw[:500])
    if status is not None:
        allowed = status if isinstance(status, tuple) else (status,)
        assert resp.status in allowed, (resp.status, resp.raw[:500])
    assert resp.content_type in (JSON, MSGPACK), resp.headers
    body = resp.body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err, dict) and {"code", "message"} <= set(err) <= {"code", "message", "index"}, err
    assert isinstance(err["code"], str) and SNAKE.fullmatch(err["code"]), err
    assert isinstance(err["message"], str) and err["message"], err
    if "index" in err:
        assert isinstance(err["index"], int) and not isinstance(err["index"], bool), err
    if code is not None:
        assert err["code"] == code, err
    return err


def now_ms() -> int:
    return int(time.time() * 1000)


class Api:
    """The API's operations over `call`, asserting success (200) for the happy paths."""

    def __init__(self, d: DaemonProcess) -> None:
        self.d = d

    def call(self, method: str, path: str, body: Any = _UNSET, **kw: Any) -> Resp:
        return call(self.d, method, path, body, **kw)

    def produce(self, topic: str, *messages: dict[str, Any], fmt: str = JSON) -> list[dict[str, Any]]:
        body: Any = {"messages": list(messages)} if len(messages) != 1 else messages[0]
        out = ok(self.call("POST", f"/v1/topics/{topic}/messages", body, fmt=fmt))["messages"]
        assert len(out) == len(messages)
        return out

    def subscribe(self, topic: str, group: str, **settings: Any) -> dict[str, Any]:
        return ok(self.call("PUT", f"/v1/topics/{topic}/subscriptions/{group}", settings))

    def pull(self, topic: str, group: str, fmt: str = JSON, **params: Any) -> list[dict[str, Any]]:
        wait_s = params.get("wait_ms", 0) / 1000
        resp = self.call("POST", f"/v1/topics/{topic}/subscriptions/{group}/pull", params, fmt=fmt,
                         timeout_s=wait_s + 30)
        return ok(resp)["messages"]

    def settle(self, topic: str, group: str, op: str, receipts: list[str], **extra: Any) -> dict[str, Any]:
        return ok(self.call("POST", f"/v1/topics/{topic}/subscriptions/{group}/{op}",
                            {"receipts": receipts, **extra}))

    def ack(self, topic: str, group: str, receipts: list[str]) -> dict[str, Any]:
        return self.settle(topic, group, "ack", receipts)

    def dead(self, topic: str, group: str, limit: int = 100) -> list[dict[str, Any]]:
        return ok(self.call("GET", f"/v1/topics/{topic}/subscriptions/{group}/dead?limit={limit}"))["messages"]

    def redrive(self, topic: str, group: str, ids: list[str] | None = None) -> int:
        body = {} if ids is None else {"ids": ids}
        return int(ok(self.call("POST", f"/v1/topics/{topic}/subscriptions/{group}/dead/redrive", body))
                   ["redriven"])

    def get(self, message_id: str, accept: str | None = None) -> Resp:
        return self.call("GET", f"/v1/messages/{message_id}", accept=accept)

    def state(self, message_id: str) -> str:
        return str(ok(self.get(message_id))["state"])

    def stats(self) -> dict[str, Any]:
        return ok(self.call("GET", "/v1/stats"))

    def pull_until(self, topic: str, group: str, n: int, timeout_s: float = 10.0, *, ack: bool = False,
                   **params: Any) -> list[dict[str, Any]]:
        """Pull (long-polling) until `n` messages arrived in total; fail at the deadline."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < n:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise TimeoutError(f"{topic}/{group}: {len(got)} of {n} messages after {timeout_s}s")
            # Never ask for more than is missing, so a test can tell "exactly n" from "n or more".
            limit = min(params.get("max", 100), n - len(got))
            batch = self.pull(topic, group, **{"wait_ms": min(left_ms, 1000), **params, "max": limit})
            got.extend(batch)
            if batch and ack:
                assert self.ack(topic, group, [m["receipt"] for m in batch])["acked"] == len(batch)
        return got


ALL_TIME_MS = 20 * 365 * 86_400_000  # beyond the longest allowed delay


def schedule_total(d: DaemonProcess) -> int:
    """Pending messages by GET /v1/schedule, summed over all time (from 0 to 20 years from now)."""
    end = now_ms() + ALL_TIME_MS
    step = end // 9_999 + 1  # the API's limit is 10,000 buckets
    r = call(d, "GET", f"/v1/schedule?from=0&to={end}&step_ms={step}")
    assert r.status == 200, r.raw
    return sum(n for _t, n in r.body["buckets"])


def schedule_matches_scheduled(d: DaemonProcess, timeout_s: float = 15.0) -> None:
    """Once the pipeline is idle, /v1/schedule counts exactly the pending set: its buckets over all
    time add up to stats.scheduled (issue 17: a retried enqueue-put once counted twice)."""
    def idle_and_equal() -> bool:
        stats = call(d, "GET", "/v1/stats").body
        if any(stats["pipeline"].values()):
            return False
        return schedule_total(d) == stats["scheduled"]
    try:
        wait_until(idle_and_equal, timeout_s, 0.05, "/v1/schedule to add up to stats.scheduled")
    except TimeoutError:
        stats = call(d, "GET", "/v1/stats").body
        raise AssertionError(f"/v1/schedule sums to {schedule_total(d)}, stats.scheduled is {stats['scheduled']} "
                             f"(pipeline {stats['pipeline']})") from None


def daemon_log_clean(d: DaemonProcess) -> None:
    """No request may have hit the catch-all 500 path, and nothing may have crashed."""
    text = d.log_path.read_text(errors="replace") if d.log_path.exists() else ""
    assert "unexpected failure" not in text and "Traceback" not in text, d.log_tail(80)
