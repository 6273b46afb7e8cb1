"""Request bodies decoded with limits, so that no request can make the daemon build an unbounded
number of Python objects or hold the event loop for long.

A msgpack empty map is one byte and a dict of 64; before these limits a 60 MB body of arrays of
empty maps took 4.2 GB and stalled every other request for 10 s. Every limit below is checked
while decoding, before the objects it bounds exist:

- size: `max_request_bytes` for a produce, CONTROL_BODY_BYTES for the other bodies (enforced by
  the HTTP layer while reading, and before reading when Content-Length says more);
- nesting: a produce body is at most {"messages": [{message: {headers}}]}, four levels, and the
  other bodies two ({"receipts": [...]}); deeper is never valid, so it is refused, with no setting;
- elements (map keys, map values and array items): at most MESSAGE_ELEMENTS in one message (its
  fields and 64 headers) and `max_request_elements` in one request;
- lengths: msgpack str and bin at most max_body_bytes (msgpack's max_*_len, checked on the length
  prefix), maps at most 64 entries, no arrays or ext values inside a message; JSON strings at most
  6 x max_body_bytes raw (every byte escaped as \\u00XX).

A produce is decoded one message at a time, as a generator the HTTP layer drives in time slices
(giving the event loop back between them): msgpack through Unpacker headers for the envelope and
one unpack() per message; JSON through a scanner that skips string contents inside the regex
engine and counts containers, depth and elements up to each message's end, then json-decodes a
run of whole messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterator
from typing import Any

import msgpack
from delayd.broker import codec, errors
from delayd.broker.config import Config
from delayd.storage.store import NewMessage

CONTROL_BODY_BYTES = 1024 * 1024  # pull/ack/nack/extend/subscribe/redrive: 10,000 receipts fit in ~450 KB
CONTROL_FIELDS = 16  # those bodies have at most 5 fields
CONTROL_LIST = 10_000  # receipts, ids, tags
CONTROL_DEPTH = 2  # a map of scalars and lists of scalars
CONTROL_ELEMENTS = 2 * CONTROL_FIELDS + CONTROL_LIST
PRODUCE_DEPTH = 4  # {"messages": [{message: {headers}}]}
MESSAGE_DEPTH = 2  # a message map and its headers map
MESSAGE_ELEMENTS = 2 * (len(codec.MESSAGE_FIELDS) + codec.MAX_HEADERS)  # keys and values of both maps
JSON_ESCAPE_BYTES = 6  # "\u00XX": the most raw bytes a JSON string spends on one byte of text
JSON_WINDOW = 1 << 20  # the most bytes one regex call looks at before the scanner loops again
JSON_TICK_TOKENS = 4096  # structural bytes between two chances to give the event loop back
JSON_CHUNK_BYTES = 256 * 1024  # messages json-decoded together (one str for many small ones) ...
JSON_CHUNK_MESSAGES = 256  # ... at most this many
MSGPACK_READ_BYTES = 256 * 1024

Produced = tuple[NewMessage, bool]  # a validated message and its `replace` flag


# -- element counting -----------------------------------------------------------------------------
class Budget:
    """Elements counted as they are decoded: per message (400 invalid_message with its index) and
    per request (413 too_large)."""

    def __init__(self, request_limit: int, message_limit: int = MESSAGE_ELEMENTS) -> None:
        self.request_limit = request_limit
        self.message_limit = message_limit
        self.total = 0
        self.message = 0
        self.index: int | None = None

    def start(self, index: int | None) -> None:
        self.index, self.message = index, 0

    def add(self, n: int) -> None:
        self.total += n
        self.message += n
        if self.index is not None and self.message > self.message_limit:
            raise errors.InvalidMessage(
                f"message {self.index}: more than {self.message_limit} elements (map keys, values and array "
                f"items); a message has at most {len(codec.MESSAGE_FIELDS)} fields and {codec.MAX_HEADERS} "
                f"headers", index=self.index)
        if self.total > self.request_limit:
            raise errors.TooLarge(f"the request has more than {self.request_limit} elements (map keys, values "
                                  f"and array items; max_request_elements): send a smaller batch")


class Hooks:
    """msgpack object_hook/list_hook: count each container as msgpack completes it, and bound
    how deep containers nest below the level where decoding started."""

    def __init__(self, budget: Budget, max_depth: int) -> None:
        self.budget = budget
        self.max_depth = max_depth
        self.depths: dict[int, int] = {}  # id -> depth of containers that hold containers

    def reset(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.depths.clear()

    def _depth(self, container: Any, values: Any) -> None:
        depth = 1
        for v in values:
            if type(v) is dict or type(v) is list:
                depth = max(depth, self.depths.get(id(v), 1) + 1)
        if depth > 1:
            if depth > self.max_depth:
                raise _TooDeep()
            # The children are alive inside their parent until the top-level value is done,
            # so ids are not reused before reset().
            self.depths[id(container)] = depth

    def map(self, d: dict[str, Any]) -> dict[str, Any]:
        self.budget.add(2 * len(d))
        self._depth(d, d.values())
        return d

    def list(self, items: list[Any]) -> list[Any]:
        self.budget.add(len(items))
        self._depth(items, items)
        return items


class _TooDeep(Exception):
    """Raised inside a msgpack hook; turned into the API error by the caller, which knows what
    was being decoded."""


def _too_deep(index: int | None, depth: int) -> errors.ApiError:
    if index is None:
        return errors.InvalidJson(f"the body nests more than {depth} levels deep")
    return errors.InvalidMessage(f"message {index}: nests more than {depth} levels (a message map and its "
                                 f"headers map)", index=index)


# -- msgpack --------------------------------------------------------------------------------------
class _Reader:
    """file-like over the body, so Unpacker buffers a window of it instead of a second copy."""

    def __init__(self, raw: bytes | bytearray) -> None:
        self.view: memoryview | None = memoryview(raw)
        self.pos = 0

    def read(self, n: int) -> bytes:
        assert self.view is not None
        out = bytes(self.view[self.pos:self.pos + n])
        self.pos += len(out)
        return out

    def close(self) -> None:
        if self.view is not None:
            self.view.release()
            self.view = None


def _msgpack_error(e: Exception, index: int | None) -> errors.ApiError:
    text = str(e)
    where = f"message {index}: " if index is not None else ""
    if isinstance(e, _TooDeep | msgpack.StackError):
        return _too_deep(index, MESSAGE_DEPTH if index is not None else CONTROL_DEPTH)
    if "exceeds max_str_len" in text or "exceeds max_bin_len" in text:
        # msgpack checks the length prefix before reading the bytes: a 16 MiB bin is refused unread.
        return errors.TooLarge(f"{where}a string or binary value is longer than the limit ({text})", index=index)
    if "exceeds max_array_len" in text or "exceeds max_map_len" in text or "exceeds max_ext_len" in text:
        limits = (f"no arrays or ext values inside a message, maps of at most {codec.MAX_HEADERS} entries"
                  if index is not None else f"maps of at most {CONTROL_FIELDS} entries, arrays of at most "
                                            f"{CONTROL_LIST}, no ext values")
        cls = errors.InvalidMessage if index is not None else errors.InvalidJson
        return cls(f"{where}{text}: {limits}", index=index)
    if isinstance(e, msgpack.BufferFull):  # a str or bin too long to hold (its length is checked later)
        return errors.TooLarge(f"{where}a string or binary value is longer than the limit", index=index)
    if isinstance(e, msgpack.OutOfData):
        return errors.InvalidJson("body is not valid msgpack: it ends inside a value")
    if "for map key" in text and index is not None:
        return errors.InvalidMessage(f"{where}map keys must be strings", index=index)
    return errors.InvalidJson(f"body is not valid msgpack: {text or type(e).__name__}")


MSGPACK_ERRORS = (ValueError, TypeError, msgpack.UnpackException, _TooDeep)


def _msgpack_produce(topic: str, raw: bytes | bytearray, cfg: Config, now_ms: int) -> Iterator[Produced]:
    budget = Budget(cfg.max_request_elements)
    hooks = Hooks(budget, MESSAGE_DEPTH)
    reader = _Reader(raw)
    unp = msgpack.Unpacker(reader, raw=False, strict_map_key=True, read_size=MSGPACK_READ_BYTES,
                           max_buffer_size=cfg.max_body_bytes + 2 * MSGPACK_READ_BYTES,
                           max_str_len=max(cfg.max_body_bytes, codec.MAX_HEADER_BYTES),
                           max_bin_len=cfg.max_body_bytes, max_array_len=0, max_map_len=codec.MAX_HEADERS,
                           max_ext_len=0, object_hook=hooks.map, list_hook=hooks.list)
    index: int | None = None
    try:
        try:
            fields = unp.read_map_header()
        except ValueError:
            raise errors.BadRequest("the body must be an object") from None
        budget.start(0)
        budget.add(2 * fields)
        single: dict[str, Any] = {}
        for _ in range(fields):
            key = unp.unpack()
            if not isinstance(key, str):
                raise errors.InvalidMessage("message 0: map keys must be strings", index=0)
            if key == "messages":
                if fields != 1:
                    raise errors.InvalidMessage("a batch has only the field 'messages'")
                try:
                    n = unp.read_array_header()
                except ValueError:
                    n = -1
                if not 1 <= n <= cfg.max_batch:
                    raise errors.InvalidMessage(f"messages must be a list of 1-{cfg.max_batch} message objects")
                budget.start(None)
                budget.add(n)
                for i in range(n):
                    index = i
                    budget.start(i)
                    hooks.reset(MESSAGE_DEPTH)
                    yield codec.parse_message(topic, unp.unpack(), i, cfg, now_ms)
                index = None
                break
            index = 0
            hooks.reset(MESSAGE_DEPTH - 1)  # the value of a field, one level below the message map
            single[key] = unp.unpack()
            index = None
        else:
            yield codec.parse_message(topic, single, 0, cfg, now_ms)
        if unp.tell() != len(raw):
            raise errors.InvalidJson("body is not valid msgpack: extra data after the body")
    except MSGPACK_ERRORS as e:
        raise _msgpack_error(e, index) from None
    finally:
        reader.close()


def _msgpack_control(raw: bytes | bytearray) -> Any:
    hooks = Hooks(Budget(CONTROL_ELEMENTS), CONTROL_DEPTH)
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True, max_str_len=len(raw), max_bin_len=len(raw),
                               max_array_len=CONTROL_LIST, max_map_len=CONTROL_FIELDS, max_ext_len=0,
                               object_hook=hooks.map, list_hook=hooks.list)
    except (*MSGPACK_ERRORS, msgpack.ExtraData) as e:
        raise _msgpack_error(e, None) from None


# -- JSON -----------------------------------------------------------------------------------------
_ENVELOPE = re.compile(rb'(?:\xef\xbb\xbf)?[ \t\n\r]*\{[ \t\n\r]*"messages"[ \t\n\r]*:[ \t\n\r]*\[')
_BATCH_END = re.compile(rb"[ \t\n\r]*\}[ \t\n\r]*\Z")
_WS = re.compile(rb"[ \t\n\r]*")
# Everything up to the next structural byte outside strings. Whole strings are skipped inside
# the regex engine, so the Python loop runs once per bracket or comma, not per string.
# Possessive quantifiers: a string that does not end in the window fails at once, no backtracking.
_SKIP = re.compile(rb'[^"\[\]{},]*+(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"[^"\[\]{},]*+)*+', re.DOTALL)
_STRING_BODY = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.DOTALL)  # the inside of a string
_SEPARATOR = re.compile(r"[ \t\n\r]*,?[ \t\n\r]*")
QUOTE, COMMA, LBRACE, RBRACE, LBRACKET, RBRACKET = b'",{}[]'
_DECODER = json.JSONDecoder()


class JsonScanner:
    """Walks a JSON body's structure without building it: where each value ends, how deep it
    nests, how many elements it has. Anything it lets through is then decoded by json (which
    reports the syntax errors the scanner does not look for)."""

    def __init__(self, raw: bytes | bytearray, max_string: int, budget: Budget) -> None:
        self.raw = raw
        self.end = len(raw)
        self.pos = 0
        self.max_string = max_string
        self.budget = budget
        self.tokens = 0  # structural bytes since the last yield, over all values scanned

    def value(self, depth: int, max_depth: int, index: int | None) -> Generator[None, None, int]:
        """Scan the value at self.pos up to the byte that ends it at this level: ',' ']' '}'
        (returned, self.pos on it) or the end of the body (-1). Yields now and then."""
        raw, end, budget = self.raw, self.end, self.budget
        stack: list[int] = []
        pos = self.pos
        while True:
            pos = _SKIP.match(raw, pos, min(end, pos + JSON_WINDOW)).end()  # type: ignore[union-attr]
            if pos >= end:
                if stack:
                    raise errors.InvalidJson("body is not valid json: it ends inside a value")
                self.pos = end
                return -1
            c = raw[pos]
            if c == QUOTE:  # a string the window cut, or a long one: walk it a window at a time
                stop = min(end, pos + self.max_string + 2)
                i = pos + 1
                while True:
                    j = _STRING_BODY.match(raw, i, min(stop, i + JSON_WINDOW)).end()  # type: ignore[union-attr]
                    if j < stop and raw[j] == QUOTE:
                        break
                    if j >= stop or j == i:  # (no progress: an escape cut by the limit)
                        if end - pos > self.max_string + 2:
                            where = f"message {index}: " if index is not None else ""
                            raise errors.TooLarge(f"{where}a string longer than {self.max_string} bytes",
                                                  index=index)
                        raise errors.InvalidJson("body is not valid json: unterminated string")
                    i = j  # the window ended inside the string
                    self.pos = pos
                    yield None
                pos = j + 1
                continue
            if c == LBRACE or c == LBRACKET:
                stack.append(c)
                if depth + len(stack) > max_depth:
                    raise _too_deep(index, max_depth - depth)
                budget.add(2 if c == LBRACE else 1)  # its first entry (an empty container counts one)
            elif c == COMMA:
                if not stack:
                    self.pos = pos
                    return c
                budget.add(2 if stack[-1] == LBRACE else 1)
            elif c == RBRACE or c == RBRACKET:
                if not stack:
                    self.pos = pos
                    return c
                if (stack.pop() == LBRACE) != (c == RBRACE):
                    raise errors.InvalidJson("body is not valid json: brackets do not match")
            else:  # the window ended outside a string: go on from there
                self.pos = pos
                yield None
                continue
            pos += 1
            self.tokens += 1
            if self.tokens >= JSON_TICK_TOKENS:
                self.tokens = 0
                self.pos = pos
                yield None


def _json_loads(raw: bytes | bytearray, start: int, stop: int, encoding: str = "utf-8") -> Any:
    try:
        # JSON is UTF-8 (RFC 8259 §8.1): decode strictly (json.loads(bytes) would also guess UTF-16/32).
        return json.loads(str(memoryview(raw)[start:stop], encoding))
    except RecursionError as e:  # not reachable past the scanner's depth check; kept as a backstop
        raise errors.InvalidJson("body is nested too deeply") from e
    except ValueError as e:
        raise errors.InvalidJson(f"body is not valid json: {e}") from e


def _json_produce(topic: str, raw: bytes | bytearray, cfg: Config, now_ms: int) -> Iterator[Produced | None]:
    budget = Budget(cfg.max_request_elements)
    scan = JsonScanner(raw, JSON_ESCAPE_BYTES * cfg.max_body_bytes, budget)
    envelope = _ENVELOPE.match(raw)
    if envelope is None:  # one message (or a body that is neither)
        budget.start(0)
        end = yield from scan.value(0, MESSAGE_DEPTH, 0)
        if end != -1:
            raise errors.InvalidJson("body is not valid json: extra data after the body")
        _check_message_bytes(len(raw), 0, cfg)
        req = codec.parse_produce(topic, _json_loads(raw, 0, len(raw), "utf-8-sig") if raw else {}, cfg, now_ms)
        yield from zip(req.messages, req.replace, strict=True)
        return
    budget.add(3)  # the key "messages", its list, the list's first item
    scan.pos = envelope.end()
    pending: list[tuple[int, int]] = []  # (start, stop) of scanned messages not yet decoded
    index = 0
    while True:
        scan.pos = _WS.match(raw, scan.pos).end()  # type: ignore[union-attr]
        start = scan.pos
        if index == 0 and start < len(raw) and raw[start] == RBRACKET:
            raise errors.InvalidMessage(f"messages must be a list of 1-{cfg.max_batch} message objects")
        if index >= cfg.max_batch:
            raise errors.InvalidMessage(f"messages must be a list of 1-{cfg.max_batch} message objects")
        budget.start(index)
        end = yield from scan.value(2, PRODUCE_DEPTH, index)
        _check_message_bytes(scan.pos - start, index, cfg)
        pending.append((start, scan.pos))
        index += 1
        last = end != COMMA
        if last or scan.pos - pending[0][0] >= JSON_CHUNK_BYTES or len(pending) >= JSON_CHUNK_MESSAGES:
            yield from _json_messages(topic, raw, pending, index - len(pending), cfg, now_ms)
            pending = []
        if last:
            break
        budget.add(1)  # the next list item
        scan.pos += 1
    if end != RBRACKET:
        raise errors.InvalidJson("body is not valid json: the messages list is not closed")
    if _BATCH_END.match(raw, scan.pos + 1) is None:
        if raw[_WS.match(raw, scan.pos + 1).end():][:1] == b",":  # type: ignore[union-attr]
            raise errors.InvalidMessage("a batch has only the field 'messages'")
        raise errors.InvalidJson("body is not valid json: extra data after the messages list")


def message_json_bytes(cfg: Config) -> int:
    r"""The most bytes one message may take in JSON: the largest valid message with every byte of
    its text escaped (\u00XX). A longer one is refused before it is decoded."""
    text = cfg.max_body_bytes + codec.MAX_HEADER_BYTES + codec.MAX_KEY_BYTES + codec.MAX_TAG_BYTES
    return JSON_ESCAPE_BYTES * text + 64 * 1024  # field names, numbers, quotes and separators


def _check_message_bytes(n: int, index: int, cfg: Config) -> None:
    limit = message_json_bytes(cfg)
    if n > limit:
        raise errors.TooLarge(f"message {index}: {n} bytes of JSON, more than any valid message takes ({limit})",
                              index=index)


def _json_messages(topic: str, raw: bytes | bytearray, spans: list[tuple[int, int]], first: int, cfg: Config,
                   now_ms: int) -> Iterator[Produced]:
    """Decode a run of scanned messages with one str conversion, then validate each."""
    try:
        text = str(memoryview(raw)[spans[0][0]:spans[-1][1]], "utf-8")
    except UnicodeDecodeError as e:
        raise errors.InvalidJson(f"body is not valid json: {e}") from e
    pos = 0
    for i in range(first, first + len(spans)):
        try:
            item, pos = _DECODER.raw_decode(text, pos)
        except ValueError as e:
            raise errors.InvalidJson(f"body is not valid json (message {i}): {e}") from e
        pos = _SEPARATOR.match(text, pos).end()  # type: ignore[union-attr]
        yield codec.parse_message(topic, item, i, cfg, now_ms)
    if pos != len(text):
        raise errors.InvalidJson("body is not valid json: a message is followed by something else")


def _json_control(raw: bytes | bytearray) -> Any:
    scan = JsonScanner(raw, len(raw), Budget(CONTROL_ELEMENTS))
    for _ in scan.value(0, CONTROL_DEPTH, None):
        pass  # a control body is at most CONTROL_BODY_BYTES: no need to give the loop back
    if scan.pos != len(raw):
        raise errors.InvalidJson("body is not valid json: extra data after the body")
    return _json_loads(raw, 0, len(raw), "utf-8-sig")


# -- entry points ---------------------------------------------------------------------------------
def produce(topic: str, raw: bytes | bytearray, fmt: str, cfg: Config, now_ms: int) -> Iterator[Produced | None]:
    """The validated messages of a produce body, in order; None now and then while a long stretch
    is scanned (a chance to give the event loop back). Raises ApiError."""
    if fmt == codec.MSGPACK:
        if not raw:
            yield codec.parse_message(topic, {}, 0, cfg, now_ms)
            return
        yield from _msgpack_produce(topic, raw, cfg, now_ms)
    else:
        yield from _json_produce(topic, raw, cfg, now_ms)


def control(raw: bytes | bytearray, fmt: str) -> Any:
    """Any other request body (at most CONTROL_BODY_BYTES), decoded whole within its limits."""
    if not raw:
        return {}
    return _msgpack_control(raw) if fmt == codec.MSGPACK else _json_control(raw)
