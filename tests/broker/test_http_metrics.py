"""broker.http's metrics middleware on a real aiohttp server: each request counted once, by route
template and status; a request cancelled before it had a status (client gone, shutdown) is not
counted as a 500."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from delayd.broker.http import METRICS, metrics_middleware


class Seen:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None, int]] = []

    def observe_request(self, method: str, route: str | None, status: int, seconds: float) -> None:
        assert seconds >= 0
        self.requests.append((method, route, status))

    def render(self) -> tuple[bytes, str]:
        return b"", "text/plain"


async def test_requests_are_counted_by_route_template_and_status() -> None:
    async def ok(r: web.Request) -> web.StreamResponse:
        return web.Response(status=201)

    async def missing(r: web.Request) -> web.StreamResponse:
        raise web.HTTPNotFound()

    async def broken(r: web.Request) -> web.StreamResponse:
        raise RuntimeError("a bug")

    async def cancelled(r: web.Request) -> web.StreamResponse:
        raise asyncio.CancelledError

    seen = Seen()
    app = web.Application(middlewares=[metrics_middleware])
    app[METRICS] = seen
    app.router.add_get("/v1/messages/{id}", ok)
    app.router.add_delete("/v1/messages/{id}", missing)
    app.router.add_post("/v1/messages/{id}", broken)
    app.router.add_put("/v1/messages/{id}", cancelled)
    async with TestServer(app) as server, aiohttp.ClientSession() as http:
        for method in ("GET", "DELETE", "POST"):
            async with http.request(method, server.make_url("/v1/messages/d-1f")) as r:
                await r.read()
        async with http.get(server.make_url("/no/such/d-2f")) as r:
            assert r.status == 404
        try:
            async with http.put(server.make_url("/v1/messages/d-3f")) as r:
                await r.read()
        except aiohttp.ClientError:
            pass  # the cancelled handler may drop the connection
    assert seen.requests == [("GET", "/v1/messages/{id}", 201), ("DELETE", "/v1/messages/{id}", 404),
                             ("POST", "/v1/messages/{id}", 500), ("GET", None, 404)]
