"""broker.http's read_raw on a real aiohttp server: a body that came whole with its headers is taken
as it lies (no timer, no wait), one that trickles in afterwards is read chunk by chunk; both give
the same bytes."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time

from aiohttp import web
from aiohttp.test_utils import TestServer
from delayd.broker.config import Config
from delayd.broker.http import CONFIG, read_raw

from tests.robustness.rawhttp import status_of

BODY = bytes(range(256)) * 64  # 16 KiB: more than one read of the socket when it trickles
DEADLINE_S = 10.0


def head(length: int) -> bytes:
    return (b"POST /body HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: " + str(length).encode() + b"\r\n\r\n")


def answer(s: socket.socket) -> bytes:
    out = b""
    s.settimeout(DEADLINE_S)
    while chunk := s.recv(65536):
        out += chunk
    return out


class Seen:
    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.whole_at_entry: bool | None = None
        self.kind: type | None = None


def app(seen: Seen, wait_for_whole: bool) -> web.Application:
    async def body(request: web.Request) -> web.Response:
        if wait_for_whole:  # the body arrives, then read_raw is called
            deadline = time.monotonic() + DEADLINE_S
            while not request.content.is_eof():
                assert time.monotonic() < deadline, "the body never arrived"
                await asyncio.sleep(0.001)
        seen.whole_at_entry = request.content.is_eof()
        seen.entered.set()
        raw = await read_raw(request, 1 << 20)
        seen.kind = type(raw)
        return web.Response(text=f"{len(raw)} {hashlib.sha256(raw).hexdigest()}")

    a = web.Application()
    a[CONFIG] = Config()
    a.router.add_post("/body", body)
    return a


def expected() -> bytes:
    return f"{len(BODY)} {hashlib.sha256(BODY).hexdigest()}".encode()


async def test_a_body_that_came_with_its_headers_is_taken_as_it_lies() -> None:
    seen = Seen()
    async with TestServer(app(seen, wait_for_whole=True)) as server:
        def send() -> bytes:
            with socket.create_connection((server.host, server.port)) as s:
                s.sendall(head(len(BODY)) + BODY)
                return answer(s)
        got = await asyncio.to_thread(send)
    assert status_of(got) == 200 and got.endswith(expected()), got[:300]
    assert seen.whole_at_entry is True
    assert seen.kind is bytes  # the buffered body itself, not a copy into a new buffer


async def test_a_body_that_trickles_in_after_the_handler_started_is_read_whole() -> None:
    seen = Seen()
    loop = asyncio.get_running_loop()
    async with TestServer(app(seen, wait_for_whole=False)) as server:
        def send() -> bytes:
            with socket.create_connection((server.host, server.port)) as s:
                s.sendall(head(len(BODY)))
                # The handler is running (and reading) before any of the body is sent.
                asyncio.run_coroutine_threadsafe(asyncio.wait_for(seen.entered.wait(), DEADLINE_S), loop).result()
                for i in range(0, len(BODY), 5000):
                    s.sendall(BODY[i:i + 5000])
                return answer(s)
        got = await asyncio.to_thread(send)
    assert status_of(got) == 200 and got.endswith(expected()), got[:300]
    assert seen.whole_at_entry is False
    assert seen.kind is bytearray
