"""The HTTP API v1 (see docs/api.md) on aiohttp.

Handlers decode and validate (broker.codec), call the Broker, and encode in the request's
format. Middlewares do the rest: one times each request by route for /metrics, one maps every
error to the API's error body with its status (no bad input ever becomes a 5xx), one checks
bearer tokens when they are configured.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from delayd.broker import bodies, codec, errors, pushconfig
from delayd.broker.config import Config, Token
from delayd.broker.openapi import spec
from delayd.broker.service import Broker
from delayd.storage.commitlog import Record
from delayd.storage.errors import StorageError

log = logging.getLogger("delayd.http")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

BROKER = web.AppKey("broker", Broker)
CONFIG = web.AppKey("config", Config)
class MetricsSink(Protocol):
    """What the HTTP layer needs of broker.metrics.Metrics (the daemon never imports it here)."""

    def observe_request(self, method: str, route: str | None, status: int, seconds: float) -> None: ...

    def render(self) -> tuple[bytes, str]: ...


METRICS = web.AppKey("metrics", MetricsSink)


def reply(request: web.Request, obj: Any, status: int = 200) -> web.Response:
    fmt = codec.response_format(request.method, request.headers.get("Content-Type"),
                                request.headers.get("Accept"))
    return web.Response(body=codec.encode(obj, fmt), status=status, content_type=fmt)


QUERY_INT = re.compile(r"-?[0-9]{1,18}")


def query_int(request: web.Request, name: str, default: str | None = None) -> int:
    """An integer query parameter, in plain ASCII digits: int() alone would also take '1_0',
    ' 5', '+5' and other scripts' digits."""
    raw = request.query.get(name, default)
    if raw is None:
        raise errors.InvalidParameter(f"query parameter {name} is required")
    if not QUERY_INT.fullmatch(raw):
        raise errors.InvalidParameter(f"query parameter {name} must be an integer, not {raw[:40]!r}")
    return int(raw)


def fmt_of(request: web.Request) -> str:
    return codec.response_format(request.method, request.headers.get("Content-Type"), request.headers.get("Accept"))


async def read_raw(request: web.Request, limit: int) -> bytes | bytearray:
    """The request body, at most `limit` bytes: 413 before reading anything when Content-Length
    says more (a client must not be able to make us wait for, or drain, 70 MB we will refuse),
    and while reading a chunked or compressed body that turns out longer."""
    if request.content_length is not None and request.content_length > limit:
        raise errors.TooLarge(f"the request body is {request.content_length} bytes, the limit is {limit}")
    # With a Content-Length (and no Content-Encoding to expand it) the buffer is allocated once:
    # growing it chunk by chunk can cost a second copy at its peak.
    exact = request.content_length if "Content-Encoding" not in request.headers else None
    timeout_s = request.app[CONFIG].request_timeout_s
    raw: bytes | bytearray
    try:
        if exact is not None and request.content.is_eof():
            # The parser has seen the whole body (a small one came with its headers: a pull, an
            # ack): taken as it lies, without a timer or a wait (about a tenth of a small
            # request's CPU here).
            raw = request.content.read_nowait()
            got = len(raw)
        else:
            raw, got = bytearray(exact or 0), 0
            # A client that sends headers and then stalls mid-body must not hold a handler forever.
            async with asyncio.timeout(timeout_s):
                while chunk := await request.content.readany():
                    if got + len(chunk) > limit:
                        raise errors.TooLarge(f"the request body exceeds the limit of {limit} bytes")
                    raw[got:got + len(chunk)] = chunk
                    got += len(chunk)
    except TimeoutError:
        raise errors.RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None
    except (ConnectionResetError, web.RequestPayloadError):
        # The client went away mid-body, or sent a body that is not what its headers said.
        raise errors.BadRequest("the connection closed before the whole body arrived") from None
    if exact is not None and got != exact:
        raise errors.BadRequest("the connection closed before the whole body arrived")
    return raw


async def read_control(request: web.Request) -> tuple[bytes | bytearray, str]:
    """A request body other than a produce (at most bodies.CONTROL_BODY_BYTES) and its format."""
    raw = await read_raw(request, min(bodies.CONTROL_BODY_BYTES, request.app[CONFIG].max_request_bytes))
    return raw, codec.request_format(request.headers.get("Content-Type"), bool(raw))


async def read_body(request: web.Request) -> Any:
    """A request body other than a produce, decoded whole."""
    return bodies.control(*await read_control(request))


SLICE_S = 0.002  # the longest a produce body is decoded before other requests get the event loop
# Bodies up to this size are read by the batch core in one call (about a millisecond per MiB);
# bigger ones are decoded in SLICE_S slices, so one 16 MiB request cannot hold up releases.
RAW_PRODUCE_BYTES = 2 * 1024 * 1024


async def read_produce(request: web.Request, topic: str, raw: bytes | bytearray, fmt: str) -> codec.Produce:
    """A produce body, decoded and validated one message at a time within broker.bodies' limits,
    in slices of SLICE_S between which other requests and releases go on."""
    cfg = request.app[CONFIG]
    now = request.app[BROKER].clock.now_ms()
    msgs, keys, replace = [], [], []
    deadline = time.monotonic() + SLICE_S
    for item in bodies.produce(topic, raw, fmt, cfg, now):
        if item is not None:
            msgs.append(item[0])
            keys.append(item[0].key)
            replace.append(item[1])
        if time.monotonic() >= deadline:
            await asyncio.sleep(0)
            deadline = time.monotonic() + SLICE_S
    return codec.Produce(msgs, keys, replace)


# -- middlewares ------------------------------------------------------------------------------
@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request duration by route template (never the raw path: ids and keys would make a series
    each) and status. Outermost, so it sees the status the error middleware chose."""
    started = time.monotonic()
    status: int | None = None  # None: cancelled (client gone, shutdown): no status to count
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:
        status = e.status
        raise
    except Exception:
        status = 500
        raise
    finally:
        if status is not None:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else None
            request.app[METRICS].observe_request(request.method, route, status, time.monotonic() - started)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.ApiError as e:
        resp = reply(request, e.body(), e.status)
        if e.retry_after_s is not None:
            resp.headers["Retry-After"] = str(max(1, int(e.retry_after_s)))
        return resp
    except (StorageError, OSError) as e:
        # From below the service layer, mapped by broker.errors' one table (a full disk is 507,
        # no descriptors 503 with Retry-After); what the table does not know is a 500 below.
        err = errors.from_exception(e)
        if err is None:
            log.exception("unexpected failure serving %s %s", request.method, request.path)
            err = errors.Internal("unexpected failure; the request may be retried")
        elif err.status >= 500 and err.status not in (503, 507):
            log.error("storage failure serving %s %s: %s", request.method, request.path, e)
        resp = reply(request, err.body(), err.status)
        if err.retry_after_s is not None:
            resp.headers["Retry-After"] = str(max(1, int(err.retry_after_s)))
        return resp
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(e.status, "bad_request")
        status = e.status if e.status < 500 else 400
        resp = reply(request, {"error": {"code": code, "message": e.reason}}, status)
        if isinstance(e, web.HTTPMethodNotAllowed):
            resp.headers["Allow"] = ",".join(sorted(e.allowed_methods))
        return resp
    except Exception:
        log.exception("unexpected failure serving %s %s", request.method, request.path)
        err = errors.Internal("unexpected failure; the request may be retried")
        return reply(request, err.body(), 500)


def _auth_middleware(tokens: tuple[Token, ...]) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in ("/healthz", "/readyz", "/openapi.json", "/ui") or path.startswith("/ui/"):
            return await handler(request)  # (the console's files hold no data; see broker.console)
        header = request.headers.get("Authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        # Header bytes that are not UTF-8 arrive as surrogates: compare them as the raw bytes
        # (no token matches them) instead of failing to encode (a 500).
        given_bytes = given.encode("utf-8", "surrogateescape")
        match = None
        for t in tokens:
            # Compare against every token so timing does not tell which prefix matched.
            if hmac.compare_digest(t.token.encode(), given_bytes) and given:
                match = t
        if match is None:
            raise errors.Unauthorized("a valid bearer token is required")
        request["token"] = match
        return await handler(request)
    return auth


def authorize(request: web.Request, right: str, topic: str | None = None) -> None:
    token: Token | None = request.get("token")
    if token is None:
        return
    if "admin" in token.rights and topic is None:
        return
    if right not in token.rights and "admin" not in token.rights:
        raise errors.Forbidden(f"this token lacks the {right!r} right")
    if topic is not None and not any(fnmatch.fnmatchcase(topic, p) for p in token.topics):
        raise errors.Forbidden(f"this token may not use topic {topic!r}")


def message_of(request: web.Request, right: str) -> tuple[str, Record, str]:
    """(id, record, state) of the message named in the path, for a token with `right`.

    A message of a topic the token may not use answers exactly like a missing id (404, same
    body): a 403 naming its topic would let any token walk the sequential ids and learn which
    exist and what their topics are. The right itself is checked first, before the id is looked
    up, so that its 403 says nothing about the id either."""
    authorize(request, right)
    message_id = request.match_info["id"]
    rec, state = request.app[BROKER].get(message_id)
    token: Token | None = request.get("token")
    if token is not None and not any(fnmatch.fnmatchcase(rec.topic, p) for p in token.topics):
        raise errors.NotFound(f"no message {message_id!r}")  # the words of Broker.get for a missing id
    return message_id, rec, state


def topic_of(request: web.Request) -> str:
    return codec.check_name(request.match_info["topic"], "topic")


def group_of(request: web.Request) -> str:
    return codec.check_name(request.match_info["group"], "group")


# -- produce / cancel / inspect ---------------------------------------------------------------
async def produce(request: web.Request) -> web.Response:
    topic = topic_of(request)
    authorize(request, "produce", topic)
    raw = await read_raw(request, request.app[CONFIG].max_request_bytes)
    fmt = codec.request_format(request.headers.get("Content-Type"), bool(raw))
    broker = request.app[BROKER]
    if fmt == codec.MSGPACK and len(raw) <= RAW_PRODUCE_BYTES:
        # The batch core reads the body and writes the answer (storage.batch.encode_produce_raw);
        # what it does not decide goes the reference way below, which answers it.
        out = fmt_of(request)
        body = await broker.produce_raw(topic, raw, out == codec.JSON)
        if body is not None:
            return web.Response(body=body, content_type=out)
    req = await read_produce(request, topic, raw, fmt)
    results = await broker.produce(req.messages, req.replace)
    return reply(request, {"messages": [{"id": r.id, "deliver_at": r.deliver_at, "duplicate": r.duplicate}
                                        for r in results]})


async def cancel(request: web.Request) -> web.Response:
    message_id, _rec, _state = message_of(request, "produce")
    return reply(request, await request.app[BROKER].cancel(message_id))


async def get_message(request: web.Request) -> web.Response:
    token = request.get("token")
    message_id, rec, state = message_of(request, "consume" if token is not None and "produce" not in token.rights
                                        else "produce")
    return reply(request, {**codec.message_view(message_id, rec, fmt_of(request)), "state": state})


def key_of(request: web.Request) -> str:
    key = request.match_info["key"]
    if not 1 <= len(key.encode(errors="surrogatepass")) <= codec.MAX_KEY_BYTES:
        raise errors.InvalidParameter(f"a key is 1-{codec.MAX_KEY_BYTES} bytes")
    return key


async def cancel_key(request: web.Request) -> web.Response:
    topic, key = topic_of(request), key_of(request)
    authorize(request, "produce", topic)
    broker = request.app[BROKER]
    return reply(request, await broker.cancel(broker.id_for_key(topic, key)))


async def get_key(request: web.Request) -> web.Response:
    topic, key = topic_of(request), key_of(request)
    token = request.get("token")
    authorize(request, "consume" if token is not None and "produce" not in token.rights else "produce", topic)
    broker = request.app[BROKER]
    message_id = broker.id_for_key(topic, key)
    rec, state = broker.get(message_id)
    return reply(request, {**codec.message_view(message_id, rec, fmt_of(request)), "state": state})


# -- consume ----------------------------------------------------------------------------------
async def subscribe(request: web.Request) -> web.Response:
    topic, name = topic_of(request), group_of(request)
    authorize(request, "consume", topic)
    body = codec.only(codec.obj(await read_body(request)), {"start", "max_attempts", "push"})
    start = body.get("start", "earliest")
    if start not in ("earliest", "latest"):
        raise errors.InvalidParameter("start must be 'earliest' or 'latest'")
    max_attempts = codec.int_field(body, "max_attempts", None, 1, 1000)
    # No `push` field keeps the group as it is; null makes it pull again.
    push = pushconfig.parse(body["push"]) if "push" in body else ...
    g = await request.app[BROKER].subscribe(topic, name, start, max_attempts, push)
    return reply(request, g.settings())


async def show_subscription(request: web.Request) -> web.Response:
    topic, name = topic_of(request), group_of(request)
    authorize(request, "consume", topic)
    return reply(request, request.app[BROKER].subscription(topic, name))


async def delete_subscription(request: web.Request) -> web.Response:
    topic, name = topic_of(request), group_of(request)
    # Deleting drops other consumers' position and dead letters: an admin's act, like
    # RocketMQ's deleteSubGroup, not something every consumer token may do.
    authorize(request, "admin", topic)
    return reply(request, await request.app[BROKER].delete_group(topic, name))


async def pull(request: web.Request) -> web.Response:
    topic, name = topic_of(request), group_of(request)
    authorize(request, "consume", topic)
    body = codec.only(codec.obj(await read_body(request)), {"max", "wait_ms", "lease_ms", "tags", "fields"})
    max_n = codec.int_field(body, "max", 100, 1, 1000)
    wait_ms = codec.int_field(body, "wait_ms", 0, 0, 30_000)
    lease_ms = codec.int_field(body, "lease_ms", 30_000, 1000, 12 * 3_600_000)
    tags = codec.str_list(body, "tags", required=False, max_items=1000)
    fields = codec.pull_fields(body)
    broker = request.app[BROKER]
    def gone() -> bool:
        return request.transport is None or request.transport.is_closing()
    taken = await broker.pull(topic, name, max_n or 100, wait_ms or 0, lease_ms or 30_000, tags, gone)
    fmt = fmt_of(request)
    if fmt == codec.MSGPACK and (encoded := broker.pulled_msgpack(taken, fields)) is not None:
        return web.Response(body=encoded, content_type=codec.MSGPACK)
    # The slow path: JSON, or a record the batch core left out (dead-lettered here when unreadable).
    keep = None if fields == codec.ALL_PULL_FIELDS else codec.pulled_names(fields)
    out = []
    for d, rec in broker.pulled(topic, name, taken):
        mid = broker.message_id(d.unit.seq)
        msg = {"id": mid, "receipt": f"{mid}.{d.receipt}", "topic": rec.topic, "key": rec.key,
               "tag": rec.tag, "headers": rec.headers or {}, **codec.body_fields(rec.body, fmt),
               "deliver_at": rec.deliver_at, "delivered_at": d.unit.released_at, "attempt": d.attempt}
        out.append(msg if keep is None else {f: v for f, v in msg.items() if f in keep})
    return reply(request, {"messages": out})


async def settle(request: web.Request) -> web.Response:
    topic, name = topic_of(request), group_of(request)
    authorize(request, "consume", topic)
    op = request.match_info["op"]
    allowed = {"ack": {"receipts"}, "nack": {"receipts", "delay_ms"}, "extend": {"receipts", "lease_ms"}}[op]
    raw, fmt = await read_control(request)
    broker = request.app[BROKER]
    if op == "ack" and fmt == codec.MSGPACK:
        # The usual ack, of what one pull gave, read by the batch core (Broker.ack_raw).
        n = await broker.ack_raw(topic, name, raw, bodies.CONTROL_LIST)
        if n is not None:
            return reply(request, {"acked": n, "stale": []})
    body = codec.only(codec.obj(bodies.control(raw, fmt)), allowed)
    receipts = codec.str_list(body, "receipts", required=True) or []
    if op == "ack":
        n, stale = await broker.settle("ack", topic, name, receipts)
        return reply(request, {"acked": n, "stale": stale})
    if op == "nack":
        delay = codec.int_field(body, "delay_ms", None, 0, 12 * 3_600_000)
        n, stale = await broker.settle("nack", topic, name, receipts, delay_ms=delay)
        return reply(request, {"nacked": n, "stale": stale})
    lease = codec.int_field(body, "lease_ms", None, 1000, 12 * 3_600_000)
    if lease is None:
        raise errors.InvalidParameter("lease_ms is required")
    n, stale = await broker.settle("extend", topic, name, receipts, lease_ms=lease)
    return reply(request, {"extended": n, "stale": stale})


async def dead(request: web.Request) -> web.Response:
    topic, name = topic_of(request), group_of(request)
    authorize(request, "consume", topic)
    limit = query_int(request, "limit", "100")
    if not 1 <= limit <= 1000:
        raise errors.InvalidParameter("limit must be in [1, 1000]")
    broker = request.app[BROKER]
    fmt = fmt_of(request)
    out = []
    for _i, d, rec in broker.dead(topic, name, limit):
        mid = broker.message_id(d.seq)
        item: dict[str, Any] = {"id": mid, "attempt": d.attempt, "reason": d.reason}
        if rec is not None:
            item.update(codec.message_view(mid, rec, fmt))
        out.append(item)
    return reply(request, {"messages": out})


async def redrive(request: web.Request) -> web.Response:
    topic, name = topic_of(request), group_of(request)
    authorize(request, "consume", topic)
    body = codec.only(codec.obj(await read_body(request)), {"ids"})
    ids = codec.str_list(body, "ids", required=False)
    n = await request.app[BROKER].redrive(topic, name, ids)
    return reply(request, {"redriven": n})


# -- observe ----------------------------------------------------------------------------------
async def stats(request: web.Request) -> web.Response:
    authorize(request, "admin")
    return reply(request, request.app[BROKER].stats())


async def schedule(request: web.Request) -> web.Response:
    authorize(request, "admin")
    start, end, step = (query_int(request, k) for k in ("from", "to", "step_ms"))
    if step <= 0 or end <= start:
        raise errors.InvalidParameter("need step_ms > 0 and to > from")
    if (end - start + step - 1) // step > 10_000:
        raise errors.InvalidParameter("at most 10,000 buckets")
    return reply(request, {"buckets": request.app[BROKER].schedule(start, end, step)})


async def info(request: web.Request) -> web.Response:
    from delayd import __version__
    broker = request.app[BROKER]
    repl = broker.repl
    return reply(request, {"node_id": broker.node_id, "version": __version__,
                           "role": repl.role() if repl is not None else "primary",
                           "primary": repl.primary() if repl is not None else None})


async def cluster(request: web.Request) -> web.Response:
    """GET /v1/cluster: the shard's members, roles, epochs, in-sync set and each member's log end
    and lag as the primary sees them (docs/replication.md)."""
    broker = request.app[BROKER]
    if broker.repl is None:
        return reply(request, {"replication": False, "shard": broker.node_id, "role": "primary"})
    try:
        return reply(request, await broker.repl.describe())
    except errors.CoordinationError as e:
        raise errors.Unavailable(f"etcd: {e}", retry_after_s=errors.RETRY_AFTER_S) from e


# Replication: what a follower answers itself; everything else under /v1/ is the primary's.
FOLLOWER_ANSWERS = frozenset({"/v1/info", "/v1/cluster", "/v1/stats", "/v1/schedule"})


@web.middleware
async def replication_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """On a follower, 421 not_primary (with the primary's URL) or 503 no_primary for the API's
    requests; on the primary, 503 insufficient_replicas for a write while the in-sync set is
    below replication_min_insync — before anything is stored."""
    repl = request.app[BROKER].repl
    path = request.path
    if repl is not None and path.startswith("/v1/") and path not in FOLLOWER_ANSWERS:
        write = request.method in ("POST", "PUT", "DELETE") and not path.endswith("/pull")
        repl.check_writable(write)
    return await handler(request)


async def replication_stream(request: web.Request) -> web.StreamResponse:
    """GET /internal/replication/stream: a follower's stream (broker.replication; not part of the
    public API). It carries every message of the shard: with tokens configured, only an admin
    token opens it (the members present the first admin token of their shared configuration)."""
    authorize(request, "admin")
    repl = request.app[BROKER].repl
    if repl is None:
        raise errors.NotFound("replication is off")
    stream: web.StreamResponse = await repl.stream(request)
    return stream


async def healthz(request: web.Request) -> web.Response:
    return reply(request, {"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    if broker.ready and broker.failure() is None:
        return reply(request, {"status": "ready"})
    return reply(request, {"status": "recovering" if not broker.ready else "failed"}, 503)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(spec())


async def metrics(request: web.Request) -> web.Response:
    authorize(request, "admin")
    body, content_type = request.app[METRICS].render()
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = content_type
    return resp


def make_app(broker: Broker, config: Config, metrics_obj: MetricsSink) -> web.Application:
    mws = [metrics_middleware, error_middleware] + ([_auth_middleware(config.tokens)] if config.tokens else [])
    mws.append(replication_middleware)
    app = web.Application(middlewares=mws, client_max_size=config.max_request_bytes)
    app[BROKER] = broker
    app[CONFIG] = config
    app[METRICS] = metrics_obj
    t, g = "/v1/topics/{topic}", "/v1/topics/{topic}/subscriptions/{group}"
    app.add_routes([
        web.post(f"{t}/messages", produce),
        web.delete("/v1/messages/{id}", cancel),
        web.get("/v1/messages/{id}", get_message, allow_head=False),
        web.delete(f"{t}/keys/{{key}}", cancel_key),
        web.get(f"{t}/keys/{{key}}", get_key, allow_head=False),
        web.put(g, subscribe),
        web.get(g, show_subscription, allow_head=False),
        web.delete(g, delete_subscription),
        web.post(f"{g}/pull", pull),
        web.post(f"{g}/{{op:ack|nack|extend}}", settle),
        web.get(f"{g}/dead", dead, allow_head=False),
        web.post(f"{g}/dead/redrive", redrive),
        web.get("/v1/stats", stats, allow_head=False),
        web.get("/v1/schedule", schedule, allow_head=False),
        web.get("/v1/info", info, allow_head=False),
        web.get("/v1/cluster", cluster, allow_head=False),
        web.get("/internal/replication/stream", replication_stream, allow_head=False),
        web.get("/metrics", metrics, allow_head=False),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/openapi.json", openapi, allow_head=False),
    ])
    from delayd.broker import console, listing  # they build on this module's helpers
    app.add_routes(listing.routes() + console.routes())
    return app
