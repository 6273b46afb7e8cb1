"""Small synchronous helpers for integration tests that drive a DaemonProcess."""

from __future__ import annotations

import time
from typing import Any

from tests.support.daemon import DaemonProcess


def produce(d: DaemonProcess, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    status, body = d.request("POST", f"/v1/topics/{topic}/messages", {"messages": messages})
    assert status == 200, body
    return body["messages"]


def pull(d: DaemonProcess, topic: str, group: str, max_n: int = 1000, wait_ms: int = 0,
         lease_ms: int = 30_000, **extra: Any) -> list[dict[str, Any]]:
    status, body = d.request("POST", f"/v1/topics/{topic}/subscriptions/{group}/pull",
                             {"max": max_n, "wait_ms": wait_ms, "lease_ms": lease_ms, **extra})
    assert status == 200, body
    return body["messages"]


def ack(d: DaemonProcess, topic: str, group: str, receipts: list[str]) -> dict[str, Any]:
    status, body = d.request("POST", f"/v1/topics/{topic}/subscriptions/{group}/ack", {"receipts": receipts})
    assert status == 200, body
    return body


def drain(d: DaemonProcess, topic: str, group: str, expect: int, timeout_s: float = 30.0,
          ack_them: bool = True) -> list[dict[str, Any]]:
    """Pull (and ack) until `expect` messages arrived or the deadline passes."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expect and time.monotonic() < deadline:
        batch = pull(d, topic, group, wait_ms=500)
        got.extend(batch)
        if batch and ack_them:
            ack(d, topic, group, [m["receipt"] for m in batch])
    return got


def now_ms() -> int:
    return int(time.time() * 1000)


def percentile(xs: list[int], p: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))] if s else 0
