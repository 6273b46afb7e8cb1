"""Request bodies decoded with limits (broker.bodies), in process: what a valid body decodes to,
and that every limit stops a hostile body while decoding, with the API's error and index."""

from __future__ import annotations

import json
import random
import tracemalloc
from dataclasses import replace
from typing import Any

import msgpack
import pytest
from delayd.broker import bodies, codec, errors
from delayd.broker.config import Config

CFG = Config()
JSON, MSGPACK = codec.JSON, codec.MSGPACK
MIB = 1024 * 1024


def decode(body: Any, fmt: str, cfg: Config = CFG, raw: bytes | None = None) -> list[tuple[Any, bool]]:
    if raw is None:
        raw = msgpack.packb(body, use_bin_type=True) if fmt == MSGPACK else json.dumps(body).encode()
    return [m for m in bodies.produce("t", bytearray(raw), fmt, cfg, 1000) if m is not None]


def error(body: Any, fmt: str, cfg: Config = CFG, raw: bytes | None = None) -> errors.ApiError:
    with pytest.raises(errors.ApiError) as e:
        decode(body, fmt, cfg, raw)
    return e.value


def random_message(rng: random.Random, fmt: str) -> dict[str, Any]:
    m: dict[str, Any] = {}
    if fmt == MSGPACK and rng.random() < 0.5:
        m["body"] = rng.randbytes(rng.randrange(50))
    else:
        m["body"] = "".join(rng.choice("ab\"\\{}[],:é€😀\n") for _ in range(rng.randrange(30)))
    if rng.random() < 0.5:
        m["delay_ms"] = rng.randrange(10**6)
    if rng.random() < 0.5:
        m["key"] = f"k{rng.randrange(10**6)}[]{{}}"
    if rng.random() < 0.5:
        m["tag"] = rng.choice(["a", "{", "]", "é"])
    if rng.random() < 0.5:
        m["headers"] = {f"h{i},": f"v{i}]" for i in range(rng.randrange(64))}
    if rng.random() < 0.2:
        m["replace"] = True
    return m


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_valid_bodies_decode_as_whole_body_decoding_did(fmt: str) -> None:
    """The streaming decoders give what json.loads/msgpack.unpackb followed by parse_produce gave."""
    rng = random.Random(17)
    for _ in range(40):
        msgs = [random_message(rng, fmt) for _ in range(rng.randrange(1, 40))]
        body: Any = {"messages": msgs} if rng.random() < 0.7 else msgs[0]
        want = codec.parse_produce("t", body, CFG, 1000)
        assert decode(body, fmt) == list(zip(want.messages, want.replace, strict=True))
    spaced = b'\xef\xbb\xbf \n{ "messages" :\t[ {"body": "a"} ,\r\n{"body": "b"} ] }\n'
    assert [m.body for m, _ in decode(None, JSON, raw=spaced)] == [b"a", b"b"]


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_a_message_with_more_elements_than_any_valid_one_is_refused_by_index(fmt: str) -> None:
    full = {"body": "x", "delay_ms": 1, "key": "k", "tag": "t", "replace": False,
            "headers": {f"h{i}": "v" for i in range(64)}}
    assert len(decode({"messages": [full]}, fmt)) == 1  # 6 fields + 64 headers: within MESSAGE_ELEMENTS
    # A nested list in a message: refused when it is met, not after building it.
    e = error({"messages": [{"body": "x"}, {"body": "x", "tags": list(range(100_000))}]}, fmt)
    assert isinstance(e, errors.InvalidMessage) and e.index == 1, e


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_nesting_deeper_than_a_message_and_its_headers_is_refused(fmt: str) -> None:
    for deep in ({"headers": {"a": {"b": "c"}}}, {"headers": {"a": ["b"]}}, {"key": [[["k"]]]}):
        e = error({"messages": [{"body": "x"}, {"body": "x", **deep}]}, fmt)
        assert isinstance(e, errors.InvalidMessage) and e.index == 1, (deep, e)
    e = error({"body": "x", "headers": {"a": {"b": {"c": "d"}}}}, fmt)
    assert isinstance(e, errors.InvalidMessage) and e.index == 0


def test_msgpack_nesting_as_deep_as_msgpack_goes_is_a_400() -> None:
    raw = b"\x81\xa8messages\x91" + b"\x81\xa1a" * 5000 + b"\xc0"
    assert isinstance(error(None, MSGPACK, raw=raw), errors.InvalidMessage)
    raw = b"\x91" * 100_000 + b"\xc0"
    assert error(None, MSGPACK, raw=raw).status == 400


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_the_request_element_budget_is_a_413(fmt: str) -> None:
    cfg = replace(CFG, max_request_elements=1000)
    msg = {"body": "x", "headers": {f"h{i}": "v" for i in range(10)}}  # 1 + 2 * 2 + 2 * 10 = 25 elements
    assert len(decode({"messages": [msg] * 39}, fmt, cfg)) == 39
    e = error({"messages": [msg] * 41}, fmt, cfg)
    assert isinstance(e, errors.TooLarge) and "max_request_elements" in e.message


def test_json_and_msgpack_count_elements_alike() -> None:
    for n in (1, 7, 40):
        msg = {"body": "x", "key": "k", "headers": {f"h{i}": "v" for i in range(n)}}
        counts = []
        for fmt in (JSON, MSGPACK):
            budget = bodies.Budget(10**9)
            raw = msgpack.packb({"messages": [msg] * 3}) if fmt == MSGPACK else json.dumps({"messages": [msg] * 3}).encode()
            if fmt == JSON:
                scan = bodies.JsonScanner(bytearray(raw), 10**9, budget)
                list(scan.value(0, 9, None))
                counts.append(budget.total)
            else:
                hooks = bodies.Hooks(budget, 9)
                msgpack.unpackb(raw, object_hook=hooks.map, list_hook=hooks.list)
                counts.append(budget.total)
        assert counts[0] == counts[1] == 2 + 3 + 3 * (2 * 3 + 2 * n), (n, counts)


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_a_batch_over_max_batch_stops_at_the_message_past_it(fmt: str) -> None:
    cfg = replace(CFG, max_batch=100)
    assert len(decode({"messages": [{"body": ""}] * 100}, fmt, cfg)) == 100
    e = error({"messages": [{"body": ""}] * 101}, fmt, cfg)
    assert isinstance(e, errors.InvalidMessage) and "1-100" in e.message
    for empty in ({"messages": []}, {"messages": {"body": "x"}}, {"messages": None}):
        assert isinstance(error(empty, fmt), errors.InvalidMessage)


def test_msgpack_lengths_are_refused_from_their_prefix() -> None:
    """A bin or str longer than the largest valid one is refused as 413, without reading it."""
    e = error({"messages": [{"body": b"x"}, {"body": b"\0" * (MIB + 1)}]}, MSGPACK)
    assert isinstance(e, errors.TooLarge) and e.index == 1
    raw = b"\x81\xa8messages\x91\x81\xa4body\xc6\x7f\xff\xff\xff" + b"\0" * MIB  # says 2 GiB
    tracemalloc.start()
    assert error(None, MSGPACK, raw=raw).status in (400, 413)
    assert tracemalloc.get_traced_memory()[1] < 4 * MIB
    tracemalloc.stop()
    raw = b"\x81\xa8messages\x91\x81\xa4body\xdf\xff\xff\xff\xff"  # a map that says 4 billion entries
    assert isinstance(error(None, MSGPACK, raw=raw), errors.InvalidMessage)


def test_json_strings_longer_than_any_valid_one_are_a_413() -> None:
    cfg = replace(CFG, max_body_bytes=1000)
    limit = bodies.JSON_ESCAPE_BYTES * 1000
    ok = '{"messages": [{"body": "' + "\\u0001" * 1000 + '"}]}'
    assert decode(None, JSON, cfg, raw=ok.encode())[0][0].body == b"\x01" * 1000
    e = error(None, JSON, cfg, raw=b'{"messages": [{"body": "x"}, {"body": "' + b"a" * (limit + 1) + b'"}]}')
    assert isinstance(e, errors.TooLarge) and e.index == 1, e
    e = error(None, JSON, cfg, raw=b'{"body": "' + b"a" * (limit + 10))  # unterminated as well
    assert isinstance(e, errors.TooLarge)
    assert isinstance(error(None, JSON, cfg, raw=b'{"body": "abc'), errors.InvalidJson)


@pytest.mark.parametrize("raw,cls", [
    (b'{"messages": [{"body": "x"}], "body": "y"}', errors.InvalidMessage),
    (b'{"messages": [{"body": "x"}] x', errors.InvalidJson),
    (b'{"messages": [{"body": "x"},]}', errors.InvalidJson),
    (b'{"messages": [{"body": "x"},,{"body": "x"}]}', errors.InvalidJson),
    (b'{"messages": [{"body": "x"}}', errors.InvalidJson),
    (b'{"messages": [{"body": "x"]}', errors.InvalidJson),
    (b'{"messages": [{"body": "x"} {"body": "y"}]}', errors.InvalidJson),
    (b'{"messages": [{"body": "\xff"}]}', errors.InvalidJson),
    (b'{"messages": [{"body": "x"}', errors.InvalidJson),
    (b'{"body": "x"} {"body": "y"}', errors.InvalidJson),
    (b'[' * 100_000, errors.InvalidMessage),
    (b'{"body": "x", "delay_ms": 1' + b"0" * 5000 + b"}", errors.InvalidJson),
])
def test_malformed_json_is_a_400(raw: bytes, cls: type[errors.ApiError]) -> None:
    e = error(None, JSON, raw=raw)
    assert isinstance(e, cls) and e.status == 400, e


def test_a_long_json_batch_is_scanned_in_slices() -> None:
    """The scanner yields None now and then: the HTTP layer gives the event loop back there."""
    msg = {"body": "x", "headers": {f"h{i}": "v" for i in range(3)}}
    raw = bytearray(json.dumps({"messages": [msg] * 10_000}).encode())
    items = list(bodies.produce("t", raw, JSON, CFG, 0))
    assert sum(item is None for item in items) >= 10 and len(items) - items.count(None) == 10_000


def test_a_long_string_of_escapes_is_walked_in_windows() -> None:
    """1.2 MB of \\" in one string: past one regex window, so the scanner yields inside it, and the
    string still decodes whole."""
    raw = bytearray(b'{"messages": [{"body": "' + b'\\"' * 600_000 + b'"}, {"body": "x"}]}')
    items = list(bodies.produce("t", raw, JSON, CFG, 0))
    msgs = [m for m, _ in (i for i in items if i is not None)]
    assert [m.body for m in msgs] == [b'"' * 600_000, b"x"] and items.count(None) >= 1


GARBAGE = {  # 4 MiB each: containers of one to three bytes, 56 to 64 bytes each as Python objects
    "msgpack-arrays-of-empty-maps": (MSGPACK, b"\xdd\x00\x00\x00\x40" + (b"\xdc\xff\xff" + b"\x80" * 0xFFFF) * 64),
    "msgpack-batch-of-arrays-of-empty-maps": (MSGPACK, b"\x81\xa8messages\xdd\x00\x00\x00\x40"
                                              + (b"\xdc\xff\xff" + b"\x80" * 0xFFFF) * 64),
    "msgpack-batch-of-empty-maps": (MSGPACK, b"\x81\xa8messages\xdd\x00\x00\x27\x10" + b"\x80" * 10_000),
    "json-arrays-of-empty-objects": (JSON, b"[[" + b"{}," * (4 * MIB // 3) + b"{}]]"),
    "json-batch-of-arrays": (JSON, b'{"messages": [[' + b"{}," * (4 * MIB // 3) + b"{}]]}"),
    "json-batch-of-empty-objects": (JSON, b'{"messages": [' + b"{}," * (4 * MIB // 3) + b"{}]}"),
    "json-deep": (JSON, b'{"messages": [' + b"[" * (4 * MIB) + b"]}"),
}


@pytest.mark.parametrize("fmt,raw", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_is_refused_having_built_almost_nothing(fmt: str, raw: bytes) -> None:
    """Before: every byte of such a body became a 56-64-byte object (4.2 GB for 60 MB)."""
    body = bytearray(raw)
    tracemalloc.start()
    with pytest.raises(errors.ApiError) as e:
        for _ in bodies.produce("t", body, fmt, CFG, 0):
            pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert 400 <= e.value.status < 500
    assert peak < MIB, peak


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_control_bodies_are_flat_and_bounded(fmt: str) -> None:
    def pack(b: Any) -> bytearray:
        return bytearray(msgpack.packb(b) if fmt == MSGPACK else json.dumps(b).encode())
    assert bodies.control(pack({"receipts": ["a"] * 10_000, "max": 5}), fmt) == {"receipts": ["a"] * 10_000, "max": 5}
    assert bodies.control(bytearray(), fmt) == {}
    for bad in ({"tags": [["a"]]}, {"max": [{"a": 1}]}, {"receipts": ["a"] * 20_000}):
        with pytest.raises(errors.ApiError) as e:
            bodies.control(pack(bad), fmt)
        assert e.value.status in (400, 413), bad
    if fmt == MSGPACK:  # msgpack also bounds each container on its length prefix
        for bad in ({"receipts": ["a"] * 10_001}, {f"f{i}": 1 for i in range(17)}):
            with pytest.raises(errors.InvalidJson):
                bodies.control(pack(bad), fmt)
