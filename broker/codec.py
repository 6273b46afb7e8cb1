"""Request decoding, validation and response encoding for API v1 (JSON and msgpack).

Every way a request can be wrong ends here as an ApiError with a code; nothing malformed
reaches the broker.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgpack
from delayd.broker import errors
from delayd.broker.config import Config
from delayd.storage import commitlog
from delayd.storage.batch_pull import ALL_PULL_FIELDS, PULL_FIELDS
from delayd.storage.commitlog import Record
from delayd.storage.store import NewMessage

JSON = "application/json"
MSGPACK = "application/msgpack"
NAME_RE = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}")
MESSAGE_FIELDS = {"body", "body_b64", "delay_ms", "deliver_at", "key", "tag", "headers", "replace"}
# Per-field limits: API.md's, and where a field's commit-log length field is narrower (the tag's
# is one byte), that too: every limit is checked in characters and in UTF-8 bytes.
MAX_NAME_CHARS = 128  # topic and group: ASCII (NAME_RE), so also bytes; topic_len is u8
MAX_HEADERS = 64
MAX_HEADER_BYTES = 8 * 1024  # keys and values together, UTF-8; the packed map's u16 holds it
MAX_KEY_BYTES = 256  # key_len is u16
MAX_TAG_CHARS = 128
MAX_TAG_BYTES = commitlog.MAX_TAG_BYTES  # 255: tag_len is one byte, so 128 "€" (384 bytes) cannot be stored


def media_type(content_type: str | None) -> str | None:
    if not content_type:
        return None
    return content_type.split(";", 1)[0].strip().lower()


def request_format(content_type: str | None, has_body: bool) -> str:
    mt = media_type(content_type)
    if mt in (JSON, MSGPACK):
        return mt
    if mt is None and not has_body:
        return JSON
    raise errors.UnsupportedMediaType(f"Content-Type must be {JSON} or {MSGPACK}, not {content_type!r}")


def response_format(method: str, content_type: str | None, accept: str | None) -> str:
    if method in ("GET", "HEAD", "DELETE"):
        return MSGPACK if accept and MSGPACK in accept else JSON
    mt = media_type(content_type)
    if mt == MSGPACK:
        return MSGPACK
    if mt is None and accept and MSGPACK in accept:
        return MSGPACK
    return JSON


def encode(obj: Any, fmt: str) -> bytes:
    if fmt == MSGPACK:
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj, separators=(",", ":")).encode()


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise errors.InvalidName(f"{what} must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'")
    return value


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def obj(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise errors.BadRequest("the body must be an object")
    return body


def int_field(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    v = body.get(name, default)
    if v is None:
        return None
    if not _int(v) or not lo <= v <= hi:
        raise errors.InvalidParameter(f"{name} must be an integer in [{lo}, {hi}]")
    return int(v)


def only(body: dict[str, Any], allowed: set[str]) -> dict[str, Any]:
    """Reject fields this request does not take: a misspelt `lease_ms` must not silently
    become the 30 s default."""
    extra = set(body) - allowed
    if extra:
        raise errors.InvalidParameter(f"unknown fields {sorted(map(str, extra))}; this request takes "
                                      f"{sorted(allowed)}")
    return body


def str_list(body: dict[str, Any], name: str, *, required: bool, max_items: int = 10_000) -> list[str] | None:
    v = body.get(name)
    if v is None:
        if required:
            raise errors.InvalidParameter(f"{name} is required")
        return None
    if not isinstance(v, list) or len(v) > max_items or not all(isinstance(x, str) for x in v):
        raise errors.InvalidParameter(f"{name} must be a list of at most {max_items} strings")
    return v


def pull_fields(body: dict[str, Any]) -> int:
    """The pull's `fields` as encode_pull's bit mask: every field when absent, else id, receipt
    and the named ones (SQS's attribute names: a consumer asks for what it reads)."""
    names = str_list(body, "fields", required=False, max_items=100)
    if names is None:
        return ALL_PULL_FIELDS
    mask = 0b11
    for name in names:
        if name not in PULL_FIELDS:
            raise errors.InvalidParameter(f"fields: {name[:64]!r} is not a field of a pulled message "
                                          f"({', '.join(PULL_FIELDS)})")
        mask |= 1 << PULL_FIELDS.index(name)
    return mask


def pulled_names(mask: int) -> frozenset[str]:
    """The names a pulled message keeps under `pull_fields`' mask (`body` stands for `body_b64` too)."""
    names = {f for k, f in enumerate(PULL_FIELDS) if mask >> k & 1}
    return frozenset(names | {"body_b64"} if "body" in names else names)


# -- produce ----------------------------------------------------------------------------------
class Produce:
    """A validated produce request: messages plus their per-message options."""

    def __init__(self, messages: list[NewMessage], keys: list[str | None], replace: list[bool]) -> None:
        self.messages = messages
        self.keys = keys
        self.replace = replace


def parse_produce(topic: str, body: Any, cfg: Config, now_ms: int) -> Produce:
    body = obj(body)
    if "messages" in body:
        if set(body) - {"messages"}:
            raise errors.InvalidMessage("a batch has only the field 'messages'")
        items = body["messages"]
        if not isinstance(items, list) or not 1 <= len(items) <= cfg.max_batch:
            raise errors.InvalidMessage(f"messages must be a list of 1-{cfg.max_batch} message objects")
    else:
        items = [body]
    msgs, keys, repl = [], [], []
    for i, item in enumerate(items):
        m, r = parse_message(topic, item, i, cfg, now_ms)
        msgs.append(m)
        keys.append(m.key)
        repl.append(r)
    return Produce(msgs, keys, repl)


def parse_message(topic: str, m: Any, index: int, cfg: Config, now_ms: int) -> tuple[NewMessage, bool]:
    def bad(msg: str, cls: type[errors.ApiError] = errors.InvalidMessage) -> errors.ApiError:
        return cls(f"message {index}: {msg}", index=index)

    if not isinstance(m, dict):
        raise bad("must be an object")
    extra = set(m) - MESSAGE_FIELDS
    if extra:
        raise bad(f"unknown fields {sorted(map(str, extra))}")
    if ("body" in m) == ("body_b64" in m):
        raise bad("exactly one of body / body_b64 is required")
    if "body" in m:
        b = m["body"]
        if isinstance(b, str):
            # A lone surrogate (JSON "\ud800") is not text: stored as CESU bytes it would come
            # back as body_b64, not the way it was produced.
            if _has_surrogates(b):
                raise bad("body must be valid Unicode text (lone surrogate); send binary as body_b64")
            body = b.encode()
        elif isinstance(b, bytes):
            body = b
        else:
            raise bad("body must be a string (JSON) or bytes (msgpack)")
    else:
        if not isinstance(m["body_b64"], str):
            raise bad("body_b64 must be a base64 string")
        try:
            body = base64.b64decode(m["body_b64"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise bad("body_b64 is not valid base64") from e
    if len(body) > cfg.max_body_bytes:
        raise bad(f"body is {len(body)} bytes, the limit is {cfg.max_body_bytes}", errors.TooLarge)
    if "delay_ms" in m and "deliver_at" in m:
        raise bad("give at most one of delay_ms / deliver_at")
    if "delay_ms" in m:
        d = m["delay_ms"]
        if not _int(d) or d < 0:
            raise bad("delay_ms must be an integer >= 0")
        if d > cfg.max_delay_ms:
            raise bad(f"delay_ms exceeds the maximum horizon of {cfg.max_delay_ms} ms", errors.DelayTooLong)
        deliver_at = now_ms + d
    elif "deliver_at" in m:
        deliver_at = m["deliver_at"]
        if isinstance(deliver_at, str):
            deliver_at = parse_iso_time(deliver_at)
            if deliver_at is None:
                raise bad("deliver_at must be epoch ms or an ISO 8601 time with a zone, "
                          "like 2027-01-01T08:00:00Z or 2027-01-01T09:00:00+01:00")
        if not _int(deliver_at) or deliver_at < 0:
            raise bad("deliver_at must be an integer epoch-ms time >= 0 (or an ISO 8601 time from 1970 on)")
        if deliver_at > now_ms + cfg.max_delay_ms:
            raise bad(f"deliver_at is beyond the maximum horizon of {cfg.max_delay_ms} ms", errors.DelayTooLong)
    else:
        deliver_at = now_ms
    key = m.get("key")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key.encode(errors="surrogatepass"))
                            <= MAX_KEY_BYTES or _has_surrogates(key)):
        raise bad(f"key must be a string of 1-{MAX_KEY_BYTES} UTF-8 bytes{_size(key)}")
    tag = m.get("tag")
    if tag is not None and (not isinstance(tag, str) or len(tag) > MAX_TAG_CHARS or _has_surrogates(tag)
                            or len(tag.encode()) > MAX_TAG_BYTES):
        raise bad(f"tag must be a string of at most {MAX_TAG_CHARS} characters and {MAX_TAG_BYTES} UTF-8 bytes"
                  f"{_size(tag)}")
    headers = m.get("headers")
    if headers is not None:
        if not isinstance(headers, dict) or len(headers) > MAX_HEADERS:
            raise bad(f"headers must be a map of at most {MAX_HEADERS} string entries")
        size = 0
        for k, v in headers.items():
            if not isinstance(k, str) or not isinstance(v, str) or _has_surrogates(k) or _has_surrogates(v):
                raise bad("headers keys and values must be strings")
            size += len(k.encode()) + len(v.encode())
        if size > MAX_HEADER_BYTES:
            raise bad(f"headers exceed {MAX_HEADER_BYTES} UTF-8 bytes together (keys and values: {size})")
        headers = headers or None
    replace = m.get("replace", False)
    if not isinstance(replace, bool):
        raise bad("replace must be a boolean")
    return NewMessage(topic, body, deliver_at, tag or None, key, headers), replace


# RFC 3339 (the ISO 8601 profile of the internet): date, time to the minute or beyond, and a zone,
# which is required: a time without one means a different instant on every machine.
ISO_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?"
                      r"(?:([Zz])|([+-])(\d{2}):(\d{2}))", re.ASCII)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_iso_time(text: str) -> int | None:
    """Epoch ms of an ISO 8601 / RFC 3339 time with a zone (fractions below 1 ms are dropped);
    None when it is not one, names no zone, or names an impossible date."""
    m = ISO_TIME.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, _z, sign, off_h, off_m = m.groups()
    try:
        offset = timedelta(hours=int(off_h), minutes=int(off_m)) if sign else timedelta(0)
        if int(off_m or 0) >= 60:
            return None
        zone = timezone(-offset if sign == "-" else offset)
        when = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0), tzinfo=zone)
    except ValueError:  # month 13, second 60, an offset of a day or more
        return None
    ms = int((frac or "0").ljust(3, "0")[:3])
    return (when - EPOCH) // timedelta(milliseconds=1) + ms


def _size(v: Any) -> str:
    """ " (it is N characters, M bytes)" for a string that broke a limit: which of the two it broke."""
    if not isinstance(v, str):
        return ""
    return f" (it is {len(v)} characters, {len(v.encode(errors='surrogatepass'))} bytes)"


def _has_surrogates(s: str) -> bool:
    try:
        s.encode()
        return False
    except UnicodeEncodeError:
        return True


# -- responses --------------------------------------------------------------------------------
def body_fields(body: bytes, fmt: str) -> dict[str, Any]:
    if fmt == MSGPACK:
        return {"body": body}
    try:
        return {"body": body.decode()}
    except UnicodeDecodeError:
        return {"body_b64": base64.b64encode(body).decode()}


def message_view(message_id: str, rec: Record, fmt: str) -> dict[str, Any]:
    return {"id": message_id, "topic": rec.topic, "key": rec.key, "tag": rec.tag, "headers": rec.headers or {},
            **body_fields(rec.body, fmt), "deliver_at": rec.deliver_at, "produced_at": rec.produced_at}
