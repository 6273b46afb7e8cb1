"""Encoding of messages and the time conversions (no network)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone

import msgpack
import pytest
from delayd.client.codec import (
    Encoding,
    OutgoingMessage,
    decode_body,
    dumps,
    from_epoch_ms,
    loads,
    to_epoch_ms,
    to_ms_duration,
)
from delayd.client.errors import ProtocolError
from hypothesis import given
from hypothesis import strategies as st


def test_durations_from_ints_and_timedeltas() -> None:
    assert to_ms_duration(1500) == 1500
    assert to_ms_duration(timedelta(seconds=2, milliseconds=5)) == 2005
    assert to_ms_duration(timedelta(microseconds=1999)) == 1  # floored to whole ms
    assert to_ms_duration(12.6) == 13
    with pytest.raises(ValueError):
        to_ms_duration(-1)
    with pytest.raises(ValueError):
        to_ms_duration(timedelta(seconds=-1))
    with pytest.raises(TypeError):
        to_ms_duration("5s")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        to_ms_duration(True)


def test_epoch_ms_from_aware_datetimes() -> None:
    assert to_epoch_ms(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    assert to_epoch_ms(datetime(2030, 1, 1, 1, 0, 0, 123000, tzinfo=timezone(timedelta(hours=1)))) == \
        to_epoch_ms(datetime(2030, 1, 1, 0, 0, 0, 123000, tzinfo=UTC))
    assert to_epoch_ms(1_900_000_000_000) == 1_900_000_000_000
    with pytest.raises(ValueError, match="naive"):
        to_epoch_ms(datetime(2030, 1, 1))
    with pytest.raises(TypeError):
        to_epoch_ms("2030-01-01")  # type: ignore[arg-type]


@given(st.integers(min_value=-10**12, max_value=10**14))
def test_epoch_ms_round_trips(ms: int) -> None:
    assert to_epoch_ms(from_epoch_ms(ms)) == ms


def test_msgpack_carries_bytes_json_carries_text_or_base64() -> None:
    m = OutgoingMessage(b"\xff\x00raw", delay_ms=timedelta(seconds=1), key="k", tag="t", headers={"a": 1})  # type: ignore[dict-item]
    wire = m.to_wire(Encoding.MSGPACK)
    assert wire == {"body": b"\xff\x00raw", "delay_ms": 1000, "key": "k", "tag": "t", "headers": {"a": "1"}}
    assert msgpack.unpackb(dumps(wire, Encoding.MSGPACK), raw=False)["body"] == b"\xff\x00raw"

    j = m.to_wire(Encoding.JSON)
    assert "body" not in j and base64.b64decode(j["body_b64"]) == b"\xff\x00raw"
    assert OutgoingMessage("héllo").to_wire(Encoding.JSON) == {"body": "héllo"}
    assert OutgoingMessage(b"text").to_wire(Encoding.JSON) == {"body": "text"}
    assert json.loads(dumps({"body": "héllo"}, Encoding.JSON)) == {"body": "héllo"}


def test_message_validation() -> None:
    with pytest.raises(ValueError, match="at most one"):
        OutgoingMessage(b"x", delay_ms=1, deliver_at=2).to_wire(Encoding.JSON)
    with pytest.raises(TypeError):
        OutgoingMessage(123).to_wire(Encoding.JSON)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown"):
        OutgoingMessage.coerce({"body": "x", "dely_ms": 5})
    m = OutgoingMessage.coerce({"body_b64": base64.b64encode(b"\x01").decode(), "replace": True, "key": "k"})
    assert m.body == b"\x01" and m.replace
    assert m.to_wire(Encoding.MSGPACK)["replace"] is True
    at = datetime(2031, 5, 1, tzinfo=UTC)
    assert OutgoingMessage("x", deliver_at=at).to_wire(Encoding.JSON)["deliver_at"] == to_epoch_ms(at)


def test_decode_body_and_answers() -> None:
    assert decode_body({"body": "hé"}) == "hé".encode()
    assert decode_body({"body": b"\x00"}) == b"\x00"
    assert decode_body({"body_b64": "AAE="}) == b"\x00\x01"
    assert decode_body({}) == b""
    with pytest.raises(ProtocolError):
        decode_body({"body_b64": "!!"})
    assert loads(msgpack.packb({"a": b"x"}), "application/msgpack") == {"a": b"x"}
    assert loads(b'{"a":1}', "application/json; charset=utf-8") == {"a": 1}
    assert loads(b"", "text/plain") is None
    with pytest.raises(ProtocolError):
        loads(b"<html>", "text/html")
    with pytest.raises(ProtocolError):
        loads(b"{nope", "application/json")
