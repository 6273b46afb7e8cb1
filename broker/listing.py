"""Browse pending messages over HTTP (docs/api.md, "List pending messages"):

    GET /v1/topics/{topic}/messages?from=&to=&limit=&cursor=&body=
    GET /v1/messages?from=&to=&limit=&cursor=&body=          (every topic; admin)

The storage side is storage.browse; this module parses the query, drives a page (letting the
event loop run while a big slot is walked), and encodes the answer and the cursor.

The cursor is opaque to clients: base64url of (version, deliver_at, seq) and a CRC, i.e. the
position after the last message examined. It is not a snapshot: a page lists what is pending
when it is built, after that position.
"""

from __future__ import annotations

import base64
import binascii
import logging
import struct
import zlib
from typing import Any

from aiohttp import web
from delayd.broker import codec, errors
from delayd.broker.http import BROKER, authorize, fmt_of, query_int, reply, topic_of
from delayd.storage.browse import END_OF_TIME, Position, Query
from delayd.storage.commitlog import Record

log = logging.getLogger("delayd.http")

CURSOR = struct.Struct("<BqQ")  # version, deliver_at, seq
CURSOR_VERSION = 1
DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no", "")


def encode_cursor(pos: Position | None) -> str | None:
    if pos is None:
        return None
    raw = CURSOR.pack(CURSOR_VERSION, pos.deliver_at, pos.seq)
    return base64.urlsafe_b64encode(raw + struct.pack("<I", zlib.crc32(raw))).decode().rstrip("=")


def decode_cursor(text: str) -> Position:
    bad = errors.InvalidParameter("cursor is not one this API handed out (pass next_cursor back unchanged)")
    if len(text) > 64:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise bad from None
    if len(raw) != CURSOR.size + 4 or struct.unpack("<I", raw[CURSOR.size:])[0] != zlib.crc32(raw[:CURSOR.size]):
        raise bad
    version, deliver_at, seq = CURSOR.unpack(raw[:CURSOR.size])
    if version != CURSOR_VERSION or deliver_at < 0:
        raise bad
    return Position(deliver_at, seq)


def parse_query(request: web.Request, topic: str | None) -> tuple[Query, bool]:
    q = request.query
    start = query_int(request, "from", "0")
    end = query_int(request, "to", str(END_OF_TIME)) if "to" in q else END_OF_TIME
    if start < 0 or end < start:
        raise errors.InvalidParameter("need 0 <= from <= to")
    limit = query_int(request, "limit", str(DEFAULT_LIMIT))
    if not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidParameter(f"limit must be in [1, {MAX_LIMIT}]")
    body = q.get("body", "false").lower()
    if body not in TRUE + FALSE:
        raise errors.InvalidParameter("body must be true or false")
    after = decode_cursor(q["cursor"]) if q.get("cursor") else None
    th = None if topic is None else zlib.crc32(topic.encode())
    return Query(start_ms=start, end_ms=end, limit=limit, after=after, topic_hash=th), body in TRUE


async def list_topic(request: web.Request) -> web.Response:
    topic = topic_of(request)
    token = request.get("token")
    # The rights of GET /v1/messages/{id}: consume or produce on the topic.
    authorize(request, "consume" if token is not None and "produce" not in token.rights else "produce", topic)
    return await _answer(request, topic)


async def list_all(request: web.Request) -> web.Response:
    authorize(request, "admin")
    return await _answer(request, None)


async def _answer(request: web.Request, topic: str | None) -> web.Response:
    query, with_body = parse_query(request, topic)
    broker = request.app[BROKER]
    page, records = await broker.browse(query)
    fmt = fmt_of(request)
    out: list[dict[str, Any]] = []
    for item, rec in zip(page.items, records, strict=True):
        if not isinstance(rec, Record):
            log.warning("pending message %d is unreadable (%s); not listed", item.seq, rec)
            continue
        if topic is not None and rec.topic != topic:
            continue  # another topic with the same crc32
        view: dict[str, Any] = {"id": broker.message_id(item.seq), "topic": rec.topic, "key": rec.key,
                                "tag": rec.tag, "headers": rec.headers or {}, "deliver_at": item.deliver_at,
                                "produced_at": rec.produced_at, "body_size": len(rec.body)}
        if with_body:
            view.update(codec.body_fields(rec.body, fmt))
        out.append(view)
    return reply(request, {"messages": out, "next_cursor": encode_cursor(page.next)})


def routes() -> list[web.RouteDef]:
    return [web.get("/v1/topics/{topic}/messages", list_topic, allow_head=False),
            web.get("/v1/messages", list_all, allow_head=False)]
