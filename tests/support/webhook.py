"""A real HTTP endpoint for push tests: aiohttp.web on a free loopback port, served by its own
event loop in a thread of the test process, so the (synchronous) tests can block on the daemon
while the endpoint keeps answering.

Per path, a script of replies (status, headers, a delay, or "hold until released") is consumed
one request at a time; after it, requests get `default`. Every request is recorded as a Hit
with the wall-clock millisecond it arrived, and the number of requests a path holds at once is
tracked (current and peak, also summed over the path's first segment: "/a/x" and "/a/y" count
under "/a" too), which is how the tests see the daemon's concurrency bounds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.daemon import free_port


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # answer after this long (the daemon's timeout may cut it first)
    hold: bool = False  # answer only once release(path) is called


@dataclass(frozen=True)
class Hit:
    path: str
    headers: dict[str, str]  # names lower-cased
    raw_headers: list[tuple[str, str]]
    body: bytes
    at_ms: int  # wall clock when the request arrived
    status: int | None = None  # what was answered (None: the request ended without an answer)

    def int_header(self, name: str) -> int:
        return int(self.headers[name.lower()])


class Receiver:
    def __init__(self, default: Reply | None = None) -> None:
        self.port = free_port()
        self.default = default or Reply()
        self._scripts: dict[str, list[Reply]] = defaultdict(list)
        self._lock = threading.Lock()
        self._hits: list[Hit] = []
        self.active: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)
        self._loop = asyncio.new_event_loop()
        self._released: dict[str, asyncio.Event] = {}
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="webhook-receiver", daemon=True)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    # -- control (from the test thread) ------------------------------------------------------
    def start(self) -> Receiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        for path in list(self._released):
            self.release(path)
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def script(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self._scripts[path].extend(replies)

    def release(self, path: str) -> None:
        """Let every held request of `path` answer (now and from now on)."""
        def go() -> None:
            self._event(path).set()
        self._loop.call_soon_threadsafe(go)

    def hold(self, path: str) -> None:
        """Undo release(path): held replies of `path` wait for the next release again."""
        def arm() -> None:
            self._released[path] = asyncio.Event()  # requests already released keep the old one
        self._loop.call_soon_threadsafe(arm)  # after any release asked for before: callbacks run in order

    def hits(self, path: str | None = None) -> list[Hit]:
        with self._lock:
            return [h for h in self._hits if path is None or h.path == path]

    def answered(self, path: str | None = None) -> list[Hit]:
        return [h for h in self.hits(path) if h.status is not None]

    # -- the endpoint (in the receiver's loop) -------------------------------------------------
    def _event(self, path: str) -> asyncio.Event:
        if path not in self._released:
            self._released[path] = asyncio.Event()
        return self._released[path]

    async def _start(self) -> None:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        at_ms = int(time.time() * 1000)
        path = request.path
        body = await request.read()
        with self._lock:
            reply = self._scripts[path].pop(0) if self._scripts[path] else self.default
            counted = {path, "/" + path.split("/")[1]}  # the path and its first segment
            for key in counted:
                self.active[key] += 1
                self.peak[key] = max(self.peak[key], self.active[key])
            index = len(self._hits)
            self._hits.append(Hit(path, {k.lower(): v for k, v in request.headers.items()},
                                  list(request.headers.items()), body, at_ms))
        status: int | None = None
        try:
            if reply.hold:
                await self._event(path).wait()
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            status = reply.status
            return web.Response(status=reply.status, headers=reply.headers, text="answer from the test endpoint")
        finally:
            with self._lock:
                for key in counted:
                    self.active[key] -= 1
                hit = self._hits[index]
                self._hits[index] = Hit(hit.path, hit.headers, hit.raw_headers, hit.body, hit.at_ms, status)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
