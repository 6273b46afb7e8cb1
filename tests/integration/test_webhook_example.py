"""examples/webhook_receiver.py run as a user runs it (a subprocess) against the real daemon: it
subscribes itself with the SDK, verifies what the daemon pushes, rejects a wrong secret and a
replayed (stale) signature with 401, and acknowledges a repeat without handling it twice."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.wire import Api
from tests.support.daemon import ROOT, DaemonProcess, free_port, wait_until

SECRET = "example-secret-0123456789"


class Example:
    def __init__(self, daemon: DaemonProcess) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "webhook_receiver.py"), "--port", str(self.port),
             "--secret", SECRET, "--subscribe", daemon.url, "--topic", "example", "--group", "webhook"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass

    def find(self, **fields: Any) -> list[dict[str, Any]]:
        return [x for x in list(self.lines) if all(x.get(k) == v for k, v in fields.items())]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/delayd"


@pytest.fixture
def example(daemon: DaemonProcess) -> Iterator[Example]:
    ex = Example(daemon)
    try:
        wait_until(lambda: ex.find(subscribed="example/webhook") or ex.proc.poll() is not None, 20,
                   what="the example to start and subscribe")
        assert ex.proc.poll() is None, "".join(ex.raw)
        yield ex
    finally:
        ex.proc.terminate()
        code = ex.proc.wait(10)
        ex.reader.join(10)
        assert ex.proc.stdout is not None
        ex.proc.stdout.close()
        assert code == 0, "".join(ex.raw)


def post(url: str, body: bytes, t: int, signed: bytes | None = None) -> int:
    """POST `body` signed with the example's secret (over `signed`, if given, instead)."""
    signed = body if signed is None else signed
    mac = hmac.new(SECRET.encode(), f"{t}.".encode() + signed, hashlib.sha256).hexdigest()
    req = urllib.request.Request(url, body, method="POST", headers={
        "Content-Type": "application/json", "Delayd-Signature": f"t={t},v1={mac}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_example_receives_verifies_and_rejects(api: Api, example: Example) -> None:
    (p,) = api.produce("example", {"body": "close order 7", "delay_ms": 300})
    (line,) = wait_until(lambda: example.find(id=p["id"]), 10, what="the example printing the message")
    assert line == {"id": p["id"], "topic": "example", "group": "webhook", "attempt": 1,
                    "deliver_at": p["deliver_at"], "duplicate": False, "body": "close order 7"}

    # A subscription with another secret: every push is answered 401 and ends as a dead letter.
    api.subscribe("example", "forged", max_attempts=1, start="latest",
                  push={"url": example.url, "secret": "not-the-example-secret"})
    (forged,) = api.produce("example", {"body": "forged"})
    (dead,) = wait_until(lambda: api.dead("example", "forged"), 10, what="dead letter")
    assert (dead["id"], dead["reason"]) == (forged["id"], "push_http_401")
    wait_until(lambda: example.find(id=forged["id"], rejected="signature does not match"), 10, what="the forged one")

    # A replay of a once-valid delivery, signed 10 minutes ago, is refused; a fresh repeat is a duplicate.
    body = json.dumps({"id": p["id"], "topic": "example", "group": "webhook", "key": None, "tag": None,
                       "headers": {}, "body": "close order 7", "deliver_at": p["deliver_at"],
                       "delivered_at": p["deliver_at"], "attempt": 2}).encode()
    now = int(time.time() * 1000)
    assert post(example.url, body, now - 600_000) == 401
    # The example prints its verdict on its own output, read by a thread: wait for the line.
    wait_until(lambda: any("replay" in x.get("rejected", "") for x in example.lines), 10, what="the replay refused")
    assert post(example.url, body, now) == 204
    wait_until(lambda: example.find(id=p["id"], attempt=2, duplicate=True), 10, what="the repeat seen as a duplicate")
    assert post(example.url, body.replace(b"attempt\": 2", b"attempt\": 3"), now, signed=body) == 401, \
        "a changed body does not verify"
