"""A small asyncio etcd v3 client over etcd's JSON gateway (grpc-gateway), on aiohttp.

Only what replication coordination needs: range, put, delete, txn, lease grant / keepalive /
revoke / time-to-live, and watch.

Why the gateway and not a client from PyPI (checked when this was written; docs/replication.md has
the longer version):

* Every maintained asyncio client on PyPI (aetcd, etcd3aio, etcd3-async-client, etcetra) speaks
  gRPC, so it brings grpcio and protobuf: native wheels of tens of MB, version pins that fight
  other packages (etcetra pins grpcio 1.62.2 and protobuf 4.25), and the usual grpcio wheel gaps on
  new Pythons. The older ones are unmaintained (aioetcd3: last release 2020; etcd3: 2020 and
  synchronous; etcd3-py: 2019; python-etcd and aioetcd speak the v2 API that etcd 3.4 no longer
  serves by default).
* etcd 3.4 (Debian's `etcd-server`) serves the whole v3 API as JSON at `/v3/...` on its client port,
  including the two streaming calls we use (a lease keepalive is one request, one answer; a watch
  is a chunked stream of JSON lines). aiohttp is already a dependency of the daemon.
* The part we use is small and stable: keys and values are base64, 64-bit numbers are strings,
  an error is `{"error", "message", "code"}` with the gRPC code.

Endpoints are tried in turn. A request that could not even connect moves on to the next endpoint.
A read, a lease keepalive, a revoke or a time-to-live that failed after it was sent is simply sent
again; a write (put, delete, txn, grant) whose answer was lost raises `EtcdOutcomeUnknown`, because
only the caller knows how to find out whether it was applied.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

import aiohttp
from delayd.broker.errors import (
    EtcdOutcomeUnknown,
    EtcdRequestFailed,
    EtcdUnavailable,
    EtcdWatchCanceled,
)

DEFAULT_TIMEOUT_S = 2.0
# Watch stream lines are single JSON messages; ours carry a few small keys each.
WATCH_LINE_LIMIT_BYTES = 1 << 20


class GrpcCode(IntEnum):
    """The gRPC status codes the gateway puts in `code` that we act on."""
    OK = 0
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    FAILED_PRECONDITION = 9
    UNAVAILABLE = 14


class CompareTarget(Enum):
    """What a txn compare looks at; the value is the gateway's field name for the operand."""
    VERSION = "version"
    CREATE = "create_revision"
    MOD = "mod_revision"
    VALUE = "value"
    LEASE = "lease"


class CompareResult(Enum):
    EQUAL = "EQUAL"
    GREATER = "GREATER"
    LESS = "LESS"
    NOT_EQUAL = "NOT_EQUAL"


class EventType(Enum):
    PUT = "PUT"
    DELETE = "DELETE"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with `prefix` (etcd's GetPrefixRangeEnd)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[:i + 1])
    return b"\0"  # every key


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KeyValue:
        return cls(_unb64(d.get("key")), _unb64(d.get("value")), int(d.get("create_revision", 0)),
                   int(d.get("mod_revision", 0)), int(d.get("version", 0)), int(d.get("lease", 0)))


@dataclass(frozen=True)
class RangeResult:
    revision: int  # the store revision the read saw
    kvs: tuple[KeyValue, ...]

    def get(self, key: bytes) -> KeyValue | None:
        return next((kv for kv in self.kvs if kv.key == key), None)


@dataclass(frozen=True)
class Compare:
    """One txn condition: `target` of `key` `result` `operand` (an absent key has revisions 0)."""
    key: bytes
    target: CompareTarget
    operand: int | bytes
    result: CompareResult = CompareResult.EQUAL

    def to_json(self) -> dict[str, Any]:
        operand = _b64(self.operand) if isinstance(self.operand, bytes) else str(self.operand)
        return {"key": _b64(self.key), "target": self.target.name, "result": self.result.value,
                self.target.value: operand}


@dataclass(frozen=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0

    def to_json(self) -> dict[str, Any]:
        req: dict[str, Any] = {"key": _b64(self.key), "value": _b64(self.value)}
        if self.lease:
            req["lease"] = str(self.lease)
        return {"request_put": req}


@dataclass(frozen=True)
class Delete:
    key: bytes

    def to_json(self) -> dict[str, Any]:
        return {"request_delete_range": {"key": _b64(self.key)}}


@dataclass(frozen=True)
class Get:
    key: bytes
    prefix: bool = False

    def to_json(self) -> dict[str, Any]:
        req = {"key": _b64(self.key)}
        if self.prefix:
            req["range_end"] = _b64(prefix_end(self.key))
        return {"request_range": req}


TxnOp = Put | Delete | Get


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store revision after the txn (its own, when it wrote)
    responses: tuple[dict[str, Any], ...]

    def ranges(self) -> tuple[KeyValue, ...]:
        """Every key read by the branch that ran (its Get operations, in order)."""
        out: list[KeyValue] = []
        for r in self.responses:
            out.extend(KeyValue.from_json(kv) for kv in r.get("response_range", {}).get("kvs", ()))
        return tuple(out)


@dataclass(frozen=True)
class Lease:
    id: int
    ttl_s: int  # what etcd granted (it may raise a short TTL to its minimum)


@dataclass(frozen=True)
class WatchEvent:
    type: EventType
    kv: KeyValue


class EtcdClient:
    """One client for a list of endpoints (`http://host:2379`). Create and use it inside a running
    event loop; `close()` when done."""

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = tuple(e.rstrip("/") for e in endpoints)
        self.timeout_s = timeout_s
        self._current = 0  # the endpoint that answered last; tried first
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            # A transport closed by a cancelled request finishes closing in a loop callback: let
            # it run before the caller closes the loop.
            await asyncio.sleep(0)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No session-wide timeout: every call sets its own deadline.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    def _order(self) -> list[int]:
        n = len(self.endpoints)
        return [(self._current + i) % n for i in range(n)]

    async def _call(self, path: str, body: dict[str, Any], *, idempotent: bool,
                    timeout_s: float | None = None) -> dict[str, Any]:
        """POST `body` to `/v3/{path}`: the first endpoint that answers wins. `timeout_s` bounds the
        whole call, every endpoint included."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        failures: list[str] = []
        # A pooled connection may have died with its server; one more round gets a fresh one.
        order = self._order() * (2 if idempotent else 1)
        n = len(self.endpoints)
        for attempt, i in enumerate(order):
            endpoint = self.endpoints[i]
            left = deadline - time.monotonic()
            if left <= 0:
                failures.append(f"{endpoint}: no time left")
                break
            # A black-holed endpoint must not eat the time the others need: in the first round each
            # endpoint gets an equal share of what is left.
            share = left / (n - attempt) if attempt < n else left
            try:
                async with asyncio.timeout(share):
                    async with self._http().post(f"{endpoint}/v3/{path}", json=body) as resp:
                        status = resp.status
                        raw = await resp.read()
            except aiohttp.ClientConnectorError as e:  # nothing was sent: safe to go on
                failures.append(f"{endpoint}: {e.os_error or e}")
                continue
            except (aiohttp.ClientError, TimeoutError) as e:
                why = f"timed out after {share:.2f}s" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
                if not idempotent:
                    raise EtcdOutcomeUnknown(f"etcd /v3/{path} at {endpoint}: {why}; "
                                             "the write may or may not have been applied") from e
                failures.append(f"{endpoint}: {why}")
                continue
            data = _decode(raw, endpoint, path)
            if status == 200 and not data.get("error"):
                self._current = i
                return data
            code, message = _error_of(data, raw)
            if code == GrpcCode.UNAVAILABLE and idempotent:  # no leader, stopping: try another member
                failures.append(f"{endpoint}: {message}")
                continue
            raise EtcdRequestFailed(f"etcd /v3/{path} at {endpoint}: {message} (code {code}, HTTP {status})",
                                    code=code, http_status=status)
        raise EtcdUnavailable(f"no etcd endpoint answered /v3/{path}: " + "; ".join(failures))

    # -- key-value --------------------------------------------------------------------------

    async def get(self, key: bytes, *, prefix: bool = False, timeout_s: float | None = None) -> RangeResult:
        """A linearizable read of one key, or of every key under `prefix`."""
        body = Get(key, prefix).to_json()["request_range"]
        data = await self._call("kv/range", body, idempotent=True, timeout_s=timeout_s)
        return RangeResult(_revision(data), tuple(KeyValue.from_json(kv) for kv in data.get("kvs", ())))

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Write one key; returns the store revision of the write."""
        data = await self._call("kv/put", Put(key, value, lease).to_json()["request_put"], idempotent=False)
        return _revision(data)

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        """Delete a key (or a prefix); returns how many keys were deleted."""
        body = Get(key, prefix).to_json()["request_range"]
        data = await self._call("kv/deleterange", body, idempotent=False)
        return int(data.get("deleted", 0))

    async def txn(self, compare: Iterable[Compare], success: Iterable[TxnOp] = (),
                  failure: Iterable[TxnOp] = ()) -> TxnResult:
        """If every compare holds, run `success`, else `failure`: one atomic step at etcd."""
        body = {"compare": [c.to_json() for c in compare], "success": [op.to_json() for op in success],
                "failure": [op.to_json() for op in failure]}
        data = await self._call("kv/txn", body, idempotent=False)
        return TxnResult(bool(data.get("succeeded", False)), _revision(data), tuple(data.get("responses", ())))

    # -- leases -----------------------------------------------------------------------------

    async def lease_grant(self, ttl_s: int, *, timeout_s: float | None = None) -> Lease:
        data = await self._call("lease/grant", {"TTL": str(ttl_s)}, idempotent=False, timeout_s=timeout_s)
        return Lease(int(data["ID"]), int(data.get("TTL", ttl_s)))

    async def lease_keepalive(self, lease_id: int, *, timeout_s: float | None = None) -> int:
        """Renew a lease once. Returns its TTL in seconds, or 0 when etcd no longer has it (it
        expired or was revoked: a lease is never renewed after it expired)."""
        data = await self._call("lease/keepalive", {"ID": str(lease_id)}, idempotent=True, timeout_s=timeout_s)
        result = data.get("result")
        if not isinstance(result, dict):
            raise EtcdUnavailable(f"etcd lease keepalive: unexpected answer {data!r}")
        return int(result.get("TTL", 0))

    async def lease_revoke(self, lease_id: int, *, timeout_s: float | None = None) -> bool:
        """Revoke a lease and delete its keys. False when etcd did not have it (any more)."""
        try:
            await self._call("lease/revoke", {"ID": str(lease_id)}, idempotent=True, timeout_s=timeout_s)
        except EtcdRequestFailed as e:
            if e.code == GrpcCode.NOT_FOUND:
                return False
            raise
        return True

    async def lease_time_to_live(self, lease_id: int, *, timeout_s: float | None = None) -> int:
        """Seconds the lease has left (rounded down), or -1 when etcd does not have it."""
        data = await self._call("lease/timetolive", {"ID": str(lease_id)}, idempotent=True, timeout_s=timeout_s)
        return int(data.get("TTL", 0))

    # -- watch ------------------------------------------------------------------------------

    async def watch_once(self, key: bytes, start_revision: int, *, prefix: bool = False,
                         timeout_s: float) -> tuple[WatchEvent, ...]:
        """Wait for the first change of `key` (or under `prefix`) at or after `start_revision`.

        Returns the first batch of events, or () when none came within `timeout_s`. Raises
        `EtcdUnavailable` when no endpoint took the watch or the stream broke, and
        `EtcdWatchCanceled` when etcd dropped it (the revision was compacted): re-read, then watch
        from the new revision."""
        req: dict[str, Any] = {"key": _b64(key), "start_revision": str(start_revision)}
        if prefix:
            req["range_end"] = _b64(prefix_end(key))
        failures: list[str] = []
        for i in self._order():
            endpoint = self.endpoints[i]
            created = False
            try:
                async with asyncio.timeout(timeout_s):
                    async with self._http().post(f"{endpoint}/v3/watch", json={"create_request": req},
                                                 read_bufsize=WATCH_LINE_LIMIT_BYTES) as resp:
                        if resp.status != 200:
                            raw = await resp.read()
                            raise EtcdRequestFailed(f"etcd watch at {endpoint}: HTTP {resp.status} {raw[:200]!r}",
                                                    code=-1, http_status=resp.status)
                        self._current = i
                        async for line in resp.content:
                            if not line.strip():
                                continue
                            msg = _decode(line, endpoint, "watch")
                            result = msg.get("result")
                            if not isinstance(result, dict):
                                code, message = _error_of(msg, line)
                                raise EtcdUnavailable(f"etcd watch at {endpoint}: {message} (code {code})")
                            created = True
                            if result.get("canceled"):
                                raise EtcdWatchCanceled(
                                    f"etcd canceled the watch at revision {start_revision}: "
                                    f"{result.get('cancel_reason', '')} (compacted to "
                                    f"{result.get('compact_revision', '?')})")
                            events = result.get("events")
                            if events:
                                return tuple(WatchEvent(EventType(ev.get("type", "PUT")),
                                                        KeyValue.from_json(ev.get("kv", {})))
                                             for ev in events)
                        raise EtcdUnavailable(f"etcd watch at {endpoint}: the stream ended")
            except aiohttp.ClientConnectorError as e:
                failures.append(f"{endpoint}: {e.os_error or e}")
                continue
            except TimeoutError:
                if created:
                    return ()
                failures.append(f"{endpoint}: no answer within {timeout_s:.2f}s")
                break  # the time is spent
            except aiohttp.ClientError as e:
                raise EtcdUnavailable(f"etcd watch at {endpoint}: {type(e).__name__}: {e}") from e
        raise EtcdUnavailable("no etcd endpoint took the watch: " + "; ".join(failures))


def _revision(data: dict[str, Any]) -> int:
    return int(data.get("header", {}).get("revision", 0))


def _error_of(data: dict[str, Any], raw: bytes) -> tuple[int, str]:
    """(gRPC code, message) of an error answer: `{"error", "message", "code"}` for a unary call,
    `{"error": {"grpc_code", "message", ...}}` inside a stream."""
    err = data.get("error")
    if isinstance(err, dict):
        data = err
    code = data.get("code", data.get("grpc_code", -1))
    message = data.get("message") or data.get("error") or raw[:200].decode("utf-8", "replace")
    return int(code), str(message)


def _decode(raw: bytes, endpoint: str, path: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise EtcdUnavailable(f"etcd /v3/{path} at {endpoint}: not JSON: {raw[:200]!r}") from e
    if not isinstance(data, dict):
        raise EtcdUnavailable(f"etcd /v3/{path} at {endpoint}: not a JSON object: {raw[:200]!r}")
    return data
