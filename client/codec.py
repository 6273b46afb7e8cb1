"""Wire encoding (msgpack or JSON) and the conversions between Python values and the API's units.

The API speaks integers: times are epoch milliseconds (UTC), durations are milliseconds. Callers may
pass an aware `datetime` for `deliver_at` and a `timedelta` for `delay_ms`; a naive datetime is refused
because its meaning depends on the machine's time zone.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import msgpack
from delayd.client.errors import ProtocolError

_ONE_MS = timedelta(milliseconds=1)

Body = bytes | bytearray | memoryview | str


class Encoding(StrEnum):
    MSGPACK = "msgpack"
    JSON = "json"

    @property
    def content_type(self) -> str:
        return f"application/{self.value}"


def to_ms_duration(value: int | float | timedelta, name: str = "delay_ms") -> int:
    """Milliseconds from an int/float of ms or a `timedelta` (floored to whole ms)."""
    if isinstance(value, timedelta):
        ms = value // _ONE_MS
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be milliseconds (int) or a timedelta, not {type(value).__name__}")
    else:
        ms = round(value)
    if ms < 0:
        raise ValueError(f"{name} must be >= 0, got {ms}")
    return int(ms)


def to_epoch_ms(value: int | float | datetime, name: str = "deliver_at") -> int:
    """Epoch milliseconds from an int/float of ms or an aware `datetime`."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{name}: naive datetime is ambiguous; pass an aware one (e.g. tzinfo=UTC)")
        return (value - datetime(1970, 1, 1, tzinfo=UTC)) // _ONE_MS
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be epoch milliseconds (int) or an aware datetime, "
                        f"not {type(value).__name__}")
    return int(round(value))


def from_epoch_ms(ms: int) -> datetime:
    """An aware UTC datetime for epoch milliseconds."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def to_bytes(body: Body) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise TypeError(f"body must be bytes or str, not {type(body).__name__}")


@dataclass(frozen=True)
class OutgoingMessage:
    """One message to produce; `send_batch` also accepts plain dicts with these keys."""

    body: Body = b""
    delay_ms: int | float | timedelta | None = None
    deliver_at: int | float | datetime | None = None
    key: str | None = None
    tag: str | None = None
    headers: Mapping[str, str] | None = field(default=None)
    replace: bool = False

    @classmethod
    def coerce(cls, value: OutgoingMessage | Mapping[str, Any]) -> OutgoingMessage:
        if isinstance(value, OutgoingMessage):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"a message must be an OutgoingMessage or a dict, not {type(value).__name__}")
        data = dict(value)
        if "body_b64" in data:
            if "body" in data:
                raise ValueError("a message has both body and body_b64")
            data["body"] = base64.b64decode(data.pop("body_b64"), validate=True)
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown message field(s): {', '.join(sorted(unknown))}")
        return cls(**data)

    def to_wire(self, encoding: Encoding) -> dict[str, Any]:
        """The message object of the produce request (validated locally where cheap)."""
        if self.delay_ms is not None and self.deliver_at is not None:
            raise ValueError("give at most one of delay_ms and deliver_at")
        out: dict[str, Any] = {}
        out.update(encode_body(to_bytes(self.body), encoding))
        if self.delay_ms is not None:
            out["delay_ms"] = to_ms_duration(self.delay_ms)
        if self.deliver_at is not None:
            out["deliver_at"] = to_epoch_ms(self.deliver_at)
        if self.key is not None:
            out["key"] = str(self.key)
        if self.tag is not None:
            out["tag"] = str(self.tag)
        if self.headers:
            out["headers"] = {str(k): str(v) for k, v in self.headers.items()}
        if self.replace:
            out["replace"] = True
        return out


def encode_body(body: bytes, encoding: Encoding) -> dict[str, Any]:
    """msgpack carries raw bytes; JSON carries text as `body`, anything else as `body_b64`."""
    if encoding is Encoding.MSGPACK:
        return {"body": body}
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_b64": base64.b64encode(body).decode("ascii")}


def decode_body(obj: Mapping[str, Any]) -> bytes:
    """The payload of a message object, whichever way the broker sent it."""
    if obj.get("body_b64") is not None:
        try:
            return base64.b64decode(obj["body_b64"], validate=True)
        except (binascii.Error, ValueError, TypeError) as e:
            raise ProtocolError(f"bad body_b64 in answer: {e}") from e
    body = obj.get("body")
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    raise ProtocolError(f"bad body in answer: {type(body).__name__}")


def dumps(obj: Any, encoding: Encoding) -> bytes:
    if encoding is Encoding.MSGPACK:
        packed: bytes = msgpack.packb(obj, use_bin_type=True)  # msgpack has no type hints
        return packed
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def loads(raw: bytes, content_type: str) -> Any:
    """Decode an answer by its Content-Type (errors may come as JSON even to a msgpack client)."""
    if not raw:
        return None
    ctype = content_type.split(";", 1)[0].strip().lower()
    try:
        if ctype in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
            return msgpack.unpackb(raw, raw=False, strict_map_key=False)
        if ctype == "application/json" or ctype.endswith("+json"):
            return json.loads(raw)
    except (ValueError, msgpack.UnpackException) as e:
        raise ProtocolError(f"cannot decode {ctype} answer: {e}") from e
    raise ProtocolError(f"unexpected Content-Type {content_type!r}")
