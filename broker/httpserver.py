"""aiohttp's server, answering requests its HTTP parser refuses in the API's JSON error shape.

A request aiohttp cannot parse (a NUL in a header, Content-Length together with
Transfer-Encoding, a header line over 8 KiB, too many headers, bytes that are not HTTP) never
reaches the application or its middlewares: aiohttp's `RequestHandler.handle_error` answers it,
as text/plain. That method is the one place to change the answer, and aiohttp (3.14) offers no
setting for it: `Server` builds a plain `RequestHandler` and `AppRunner` builds a plain `Server`.
So this module subclasses all three, overriding only what builds the next one and the answer.

What aiohttp still decides (documented in docs/api.md, "Requests the HTTP parser refuses"):
- the answer is always JSON: the request's Content-Type and Accept were not (reliably) parsed;
- the status is 400 for every parse failure (aiohttp reports all of them as 400, with no
  machine-readable kind), and the answer says `HTTP/1.0` and closes the connection;
- nothing is answered when no response can be written: the client hung up, a TLS handshake
  failed on the TLS port, or part of a response was already sent.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from delayd.broker import errors

MAX_DETAIL_CHARS = 200  # aiohttp's message quotes the offending bytes; one line of them is enough


def parse_error_body(status: int, message: str | None) -> bytes:
    if status >= 500:
        err: errors.ApiError = errors.Internal("unexpected failure; the request may be retried")
    else:
        # aiohttp's text is "Reason:\n\n  b'the bytes'\n     ^": keep the first line.
        detail = (message or "").strip().split("\n", 1)[0].rstrip(":").strip()[:MAX_DETAIL_CHARS]
        err = errors.BadRequest(f"the request could not be parsed as HTTP: {detail or 'unparseable'}")
    return json.dumps(err.body(), separators=(",", ":")).encode()


class JsonErrorRequestHandler(web.RequestHandler):
    __slots__ = ()

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's own handling first: it logs, and raises if a response was already started.
        plain = super().handle_error(request, status, exc, message)
        resp = web.Response(status=plain.status, body=parse_error_body(plain.status, message),
                            content_type="application/json")
        resp.force_close()
        return resp


class JsonErrorServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        # web.Server.__call__, building our handler class (its fallback for bad kwargs is not needed:
        # the kwargs are ours).
        return JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorAppRunner(web.AppRunner):
    """web.AppRunner whose connections answer parse failures as JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # Same state, our protocol factory: AppRunner has no parameter for the server class.
        server.__class__ = JsonErrorServer
        return server
