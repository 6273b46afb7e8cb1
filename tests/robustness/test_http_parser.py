"""Requests aiohttp's HTTP parser refuses are answered in the API's error shape (JSON), over raw
sockets since no HTTP library sends them (broker.httpserver; docs/api.md, "Requests the HTTP
parser refuses"). They used to be answered text/plain."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.robustness.rawhttp import get, raw_request, read_all, status_of
from tests.support.daemon import DaemonProcess

POST_HEAD = (b"POST /v1/topics/p/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Connection: close\r\n")
REFUSED = {
    "nul-in-header": get("/v1/stats", b"X-A: a\x00b\r\n"),
    "content-length-and-transfer-encoding": POST_HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                                                        b"0\r\n\r\n",
    "header-over-8KiB": get("/v1/stats", b"X-Big: " + b"a" * 8200 + b"\r\n"),
    "header-of-100KiB": get("/v1/stats", b"X-Big: " + b"a" * 100 * 1024 + b"\r\n"),
    "request-line-over-8KiB": get("/" + "a" * 9000),
    "too-many-headers": get("/v1/stats", b"".join(b"X-%d: v\r\n" % i for i in range(200))),
    "not-http": b"HELLO WORLD\r\n\r\n",
    "tls-hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
    "bad-http-version": b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n",
    "negative-content-length": POST_HEAD + b"Content-Length: -1\r\n\r\n",
    "bad-chunk-size": POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "asks-for-msgpack": get("/v1/stats", b"Accept: application/msgpack\r\nX-A: \x00\r\n"),
}


@pytest.fixture(scope="module")
def parserd(tmp_path_factory):
    d = DaemonProcess(tmp_path_factory.mktemp("parser") / "data", config_text="request_timeout_s = 1.0\n").start()
    yield d
    assert d.stop() == 0


def json_error(resp: bytes) -> tuple[int, dict]:
    head, _, payload = resp.partition(b"\r\n\r\n")
    headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert headers.get(b"Content-Type", b"").split(b";")[0] == b"application/json", resp[:300]
    assert int(headers[b"Content-Length"]) == len(payload), resp[:300]
    return status_of(resp), json.loads(payload)


@pytest.mark.parametrize("data", REFUSED.values(), ids=REFUSED.keys())
def test_a_request_the_parser_refuses_is_a_json_400(parserd: DaemonProcess, data: bytes) -> None:
    t0 = time.monotonic()
    status, body = json_error(raw_request(parserd.port, data, timeout_s=5))
    assert status == 400
    assert body["error"]["code"] == "bad_request" and set(body) == {"error"}
    assert body["error"]["message"].startswith("the request could not be parsed as HTTP: "), body
    assert time.monotonic() - t0 < 2  # answered, not left to a timeout
    assert raw_request(parserd.port, get("/healthz")).startswith(b"HTTP/1.1 200")


def test_the_answer_names_what_is_wrong_in_one_line(parserd: DaemonProcess) -> None:
    _, body = json_error(raw_request(parserd.port, REFUSED["content-length-and-transfer-encoding"]))
    assert body["error"]["message"].endswith("Transfer-Encoding can't be present with Content-Length")
    _, body = json_error(raw_request(parserd.port, REFUSED["header-of-100KiB"]))
    assert "8190 bytes" in body["error"]["message"] and len(body["error"]["message"]) < 300


def test_a_chunk_framing_error_after_the_request_started_is_a_408(parserd: DaemonProcess) -> None:
    """What aiohttp does not let us change: once the handler is reading the body, a broken chunk
    leaves the body stream waiting (the parser drops it without an error), so the request ends
    as a stalled body does: 408 after request_timeout_s (1 s here). Had the handler not started
    yet, it is the 400 above; either way a JSON answer, within the timeout."""
    s = socket.create_connection(("127.0.0.1", parserd.port), timeout=10)
    try:
        s.sendall(POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        time.sleep(0.3)  # ordering, not waiting for a result: the handler should be reading the body
        s.sendall(b"zz\r\n{}\r\n0\r\n\r\n")
        t0 = time.monotonic()
        status, body = json_error(read_all(s, 10))
    finally:
        s.close()
    assert (status, body["error"]["code"]) in ((408, "request_timeout"), (400, "bad_request")), body
    assert time.monotonic() - t0 < 5
