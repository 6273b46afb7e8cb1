"""An in-memory stand-in for the delayd HTTP API, for SDK unit tests that need no daemon.

It serves real HTTP on 127.0.0.1 from its own thread (so blocking `Client`s can talk to it too),
records every request, and lets a test script answers ahead of the model (`script`), e.g. 503 then
the normal answer. The model is deliberately simple - no durability, a 10 ms long-poll tick - but
follows API.md: keys, dedup/replace, leases, nack backoff, max_attempts -> dead letters, fan-out
across groups. The real daemon is exercised by tests/client/test_daemon.py.

Replication (docs/api.md, "Replication"): `ReplicaSet` makes several fakes the members of one shard
sharing one model; a follower answers 421 `not_primary` naming the primary's advertised URL, every
member answers 503 `no_primary` while there is none, and `/v1/info` and `/v1/cluster` describe it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
from aiohttp import web

NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Seen:
    """One recorded request."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    accept: str
    headers: dict[str, str]
    body: Any
    at: float


@dataclass
class Reply:
    status: int
    payload: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # sent as-is (with headers' Content-Type), e.g. a text/plain error
    hold: threading.Event | None = None  # wait for this before answering


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str = "", index: int | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.index = status, code, message or code, index
        self.headers = headers or {}


@dataclass
class Msg:
    id: str
    topic: str
    body: bytes
    binary_in: bool
    deliver_at: int
    produced_at: int
    key: str | None
    tag: str | None
    headers: dict[str, str]
    state: str = "scheduled"
    delivered_at: int | None = None


@dataclass
class GroupState:
    start: str
    created_at: int
    max_attempts: int = 16
    attempts: dict[str, int] = field(default_factory=dict)
    available_at: dict[str, int] = field(default_factory=dict)
    leases: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> (receipt, expires_ms)
    acked: set[str] = field(default_factory=set)
    dead: dict[str, str] = field(default_factory=dict)  # id -> reason


class FakeBroker:
    def __init__(self, node_id: str = "d", *, dedup_window_ms: int = 600_000) -> None:
        self.node_id = node_id
        self.dedup_window_ms = dedup_window_ms
        self.requests: list[Seen] = []
        self.script: list[Reply | Callable[[Seen], Reply | None]] = []
        self.messages: dict[str, Msg] = {}
        self.keys: dict[tuple[str, str], str] = {}
        self.groups: dict[tuple[str, str], GroupState] = {}
        self.counter = 0
        self.receipts = 0
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port = 0
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._stopping = False
        self.replicas: ReplicaSet | None = None  # set when this fake is a member of a replicated shard
        self.member = ""
        self.advertise_url = ""  # what a 421 names (default: self.url)

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> FakeBroker:
        self._thread = threading.Thread(target=self._main, args=(port,), name=f"fake-{self.node_id}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake broker did not start")
        return self

    def _main(self, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self._runner.cleanup())
        self.loop.close()

    def stop(self) -> None:
        self._stopping = True
        if self.loop is not None and self._thread is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def paths(self) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.requests]

    # ------------------------------------------------------------------ HTTP

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        body: Any = None
        if raw:
            if ctype == "application/msgpack":
                body = msgpack.unpackb(raw, raw=False)
            elif ctype == "application/json":
                body = json.loads(raw)
            else:
                body = raw
        seen = Seen(request.method, request.raw_path.split("?")[0], dict(request.query), ctype,
                    request.headers.get("Accept", ""), dict(request.headers), body, time.monotonic())
        self.requests.append(seen)
        reply_type = ctype if raw else ("application/msgpack" if "msgpack" in seen.accept else "application/json")
        if self.replicas is not None and seen.path not in UNREDIRECTED:
            refused = self.replicas.refusal(self)
            if refused is not None:
                return self._encode(refused.status, refused.payload, reply_type, refused.headers)
        while self.script:
            item = self.script.pop(0)
            reply = item(seen) if callable(item) else item
            if reply is None:
                continue
            if reply.hold is not None:
                await asyncio.get_running_loop().run_in_executor(None, reply.hold.wait, 10)
            if reply.raw is not None:
                return web.Response(status=reply.status, body=reply.raw, headers=reply.headers)
            return self._encode(reply.status, reply.payload, reply_type, reply.headers)
        if raw and ctype not in ("application/msgpack", "application/json"):
            return self._encode(415, {"error": {"code": "unsupported_media_type", "message": ctype}},
                                "application/json")
        try:
            status, payload = await self._route(seen, reply_type, request)
        except ApiError as e:
            err: dict[str, Any] = {"code": e.code, "message": e.message}
            if e.index is not None:
                err["index"] = e.index
            return self._encode(e.status, {"error": err}, reply_type, e.headers)
        return self._encode(status, payload, reply_type)

    @staticmethod
    def _encode(status: int, payload: Any, ctype: str, headers: dict[str, str] | None = None) -> web.Response:
        if ctype == "application/msgpack":
            data = msgpack.packb(payload, use_bin_type=True)
        else:
            data = json.dumps(payload).encode()
            ctype = "application/json"
        return web.Response(status=status, body=data, content_type=ctype, headers=headers)

    async def _route(self, r: Seen, ctype: str, request: web.Request) -> tuple[int, Any]:
        from urllib.parse import unquote
        parts = [unquote(p) for p in r.path.strip("/").split("/")]
        m, b = r.method, r.body if isinstance(r.body, dict) else {}
        if parts[:1] != ["v1"]:
            raise ApiError(404, "not_found", "no route")
        p = parts[1:]
        with self.lock:
            if m == "GET" and p == ["info"]:
                if self.replicas is not None:
                    return 200, {"node_id": self.node_id, "version": "fake", **self.replicas.info(self)}
                return 200, {"node_id": self.node_id, "version": "fake"}
            if m == "GET" and p == ["cluster"]:
                if self.replicas is not None:
                    return 200, self.replicas.describe(self)
                return 200, {"replication": False, "shard": self.node_id, "role": "primary"}
            if m == "GET" and p == ["stats"]:
                return 200, self._stats()
            if m == "GET" and p == ["schedule"]:
                return 200, self._schedule(r.query)
            if len(p) == 3 and p[0] == "topics" and p[2] == "messages" and m == "POST":
                return 200, self._produce(p[1], r.body, ctype)
            if len(p) == 2 and p[0] == "messages":
                msg = self.messages.get(p[1])
                if msg is None:
                    raise ApiError(404, "not_found", f"no message {p[1]}")
                return self._inspect_or_cancel(m, msg, ctype)
            if len(p) == 4 and p[0] == "topics" and p[2] == "keys":
                mid = self.keys.get((p[1], p[3]))
                if mid is None or self.messages[mid].state != "scheduled":
                    raise ApiError(404, "not_found", f"no pending message with key {p[3]!r}")
                return self._inspect_or_cancel(m, self.messages[mid], ctype)
            if len(p) >= 4 and p[0] == "topics" and p[2] == "subscriptions":
                topic, group, rest = p[1], p[3], p[4:]
                self._check_names(topic, group)
                if m == "PUT" and not rest:
                    g = self._group(topic, group, b.get("start", "earliest"))
                    if "max_attempts" in b:
                        g.max_attempts = int(b["max_attempts"])
                    if "start" in b:
                        g.start = b["start"]
                    return 200, {"topic": topic, "group": group, "start": g.start, "max_attempts": g.max_attempts}
                if m == "POST" and rest in (["ack"], ["nack"], ["extend"]):
                    return 200, self._settle(topic, group, rest[0], b)
                if m == "GET" and rest == ["dead"]:
                    return 200, self._dead(topic, group, int(r.query.get("limit", 100)), ctype)
                if m == "POST" and rest == ["dead", "redrive"]:
                    g = self._group(topic, group)
                    ids = b.get("ids")
                    chosen = [i for i in list(g.dead) if ids is None or i in ids]
                    for i in chosen:
                        del g.dead[i]
                        g.attempts[i] = 0
                        g.available_at[i] = now_ms()
                    return 200, {"redriven": len(chosen)}
        if len(p) == 5 and p[0] == "topics" and p[4] == "pull" and m == "POST":
            return 200, await self._pull(p[1], p[3], b, ctype, request)
        raise ApiError(404, "not_found", f"no route {m} {r.path}")

    # ------------------------------------------------------------------ model

    def _check_names(self, *names: str) -> None:
        for n in names:
            if not NAME.match(n) or n.startswith("."):
                raise ApiError(400, "invalid_name", f"bad name {n!r}")

    def _body_out(self, msg: Msg, ctype: str) -> dict[str, Any]:
        if ctype == "application/msgpack":
            return {"body": msg.body}
        try:
            return {"body": msg.body.decode("utf-8")}
        except UnicodeDecodeError:
            return {"body_b64": base64.b64encode(msg.body).decode()}

    def _produce(self, topic: str, body: Any, ctype: str) -> dict[str, Any]:
        self._check_names(topic)
        items = body["messages"] if isinstance(body, dict) and "messages" in body else [body]
        now = now_ms()
        parsed = []
        for i, it in enumerate(items):
            if not isinstance(it, dict):
                raise ApiError(400, "invalid_message", "not an object", i)
            if "delay_ms" in it and "deliver_at" in it:
                raise ApiError(400, "invalid_message", "both delay_ms and deliver_at", i)
            if "body_b64" in it:
                payload, binary = base64.b64decode(it["body_b64"]), True
            elif isinstance(it.get("body"), bytes):
                payload, binary = it["body"], True
            elif isinstance(it.get("body", ""), str):
                payload, binary = it.get("body", "").encode(), False
            else:
                raise ApiError(400, "invalid_message", "bad body", i)
            if it.get("tag") == "poison":
                raise ApiError(400, "invalid_message", "poison tag", i)
            due = now + int(it["delay_ms"]) if "delay_ms" in it else int(it.get("deliver_at", now))
            parsed.append((it, payload, binary, due))
        out = []
        for it, payload, binary, due in parsed:
            key = it.get("key")
            if key is not None:
                old_id = self.keys.get((topic, key))
                old = self.messages.get(old_id) if old_id else None
                if old is not None and old.state == "scheduled" and it.get("replace"):
                    old.state = "cancelled"
                elif old is not None and (old.state == "scheduled" or (
                        old.state == "delivered" and now - (old.delivered_at or 0) < self.dedup_window_ms)):
                    out.append({"id": old.id, "deliver_at": old.deliver_at, "duplicate": True})
                    continue
            self.counter += 1
            msg = Msg(f"{self.node_id}-{self.counter}", topic, payload, binary, due, now, key, it.get("tag"),
                      dict(it.get("headers") or {}))
            self.messages[msg.id] = msg
            if key is not None:
                self.keys[(topic, key)] = msg.id
            out.append({"id": msg.id, "deliver_at": due, "duplicate": False})
        return {"messages": out}

    def _inspect_or_cancel(self, method: str, msg: Msg, ctype: str) -> tuple[int, Any]:
        if method == "GET":
            return 200, {"id": msg.id, "topic": msg.topic, "key": msg.key, "tag": msg.tag, "headers": msg.headers,
                         **self._body_out(msg, ctype), "deliver_at": msg.deliver_at,
                         "produced_at": msg.produced_at, "state": msg.state}
        if method == "DELETE":
            if msg.state == "delivered" or (msg.state == "scheduled" and msg.deliver_at <= now_ms()
                                            and self._is_leased(msg.id)):
                raise ApiError(409, "already_delivered", f"{msg.id} was delivered")
            msg.state = "cancelled"
            return 200, {"id": msg.id, "state": "cancelled"}
        raise ApiError(404, "not_found", "no route")

    def _is_leased(self, mid: str) -> bool:
        return any(mid in g.leases for g in self.groups.values())

    def _group(self, topic: str, group: str, start: str = "earliest") -> GroupState:
        g = self.groups.get((topic, group))
        if g is None:
            g = self.groups[(topic, group)] = GroupState(start, now_ms())
        return g

    def _candidates(self, topic: str, g: GroupState, tags: list[str] | None, limit: int) -> list[Msg]:
        now = now_ms()
        out = []
        for msg in self.messages.values():
            if msg.topic != topic or msg.state == "cancelled" or msg.deliver_at > now:
                continue
            if g.start == "latest" and msg.deliver_at < g.created_at:
                continue
            if msg.id in g.acked or msg.id in g.dead or g.available_at.get(msg.id, 0) > now:
                continue
            lease = g.leases.get(msg.id)
            if lease is not None and lease[1] > now:
                continue
            if tags is not None and msg.tag not in tags:
                continue
            if lease is not None:  # expired lease: that delivery attempt failed
                del g.leases[msg.id]
                if g.attempts.get(msg.id, 0) >= g.max_attempts:
                    g.dead[msg.id] = "lease expired"
                    continue
            out.append(msg)
            if len(out) >= limit:
                break
        return out

    async def _pull(self, topic: str, group: str, b: dict[str, Any], ctype: str,
                    request: web.Request) -> dict[str, Any]:
        self._check_names(topic, group)
        limit = int(b.get("max", 100))
        if not 1 <= limit <= 1000:
            raise ApiError(400, "invalid_request", "max out of range")
        lease_ms = int(b.get("lease_ms", 30_000))
        deadline = time.monotonic() + int(b.get("wait_ms", 0)) / 1000
        tags = b.get("tags")
        while True:
            if request.transport is None or request.transport.is_closing() or self._stopping:
                return {"messages": []}  # the client went away: lease nothing
            with self.lock:
                g = self._group(topic, group)
                found = self._candidates(topic, g, tags, limit)
                if found or time.monotonic() >= deadline:
                    out = []
                    now = now_ms()
                    for msg in found:
                        self.receipts += 1
                        receipt = f"{msg.id}.{self.receipts}"
                        g.leases[msg.id] = (receipt, now + lease_ms)
                        g.attempts[msg.id] = g.attempts.get(msg.id, 0) + 1
                        msg.state = "delivered"
                        msg.delivered_at = msg.delivered_at or now
                        out.append({"id": msg.id, "receipt": receipt, "topic": msg.topic, "key": msg.key,
                                    "tag": msg.tag, "headers": msg.headers, **self._body_out(msg, ctype),
                                    "deliver_at": msg.deliver_at, "delivered_at": msg.deliver_at,
                                    "attempt": g.attempts[msg.id]})
                    return {"messages": out}
            await asyncio.sleep(0.01)

    def _settle(self, topic: str, group: str, action: str, b: dict[str, Any]) -> dict[str, Any]:
        g = self._group(topic, group)
        now = now_ms()
        done, stale = 0, []
        for receipt in b.get("receipts", []):
            mid = receipt.split(".", 1)[0]
            lease = g.leases.get(mid)
            if lease is None or lease[0] != receipt or lease[1] <= now:
                stale.append(receipt)
                continue
            done += 1
            if action == "ack":
                del g.leases[mid]
                g.acked.add(mid)
            elif action == "extend":
                g.leases[mid] = (receipt, now + int(b["lease_ms"]))
            else:
                del g.leases[mid]
                attempt = g.attempts.get(mid, 1)
                if attempt >= g.max_attempts:
                    g.dead[mid] = "max_attempts"
                else:
                    delay = b.get("delay_ms")
                    g.available_at[mid] = now + (int(delay) if delay is not None else
                                                 min(600_000, 1000 * 2 ** (attempt - 1)))
        name = {"ack": "acked", "nack": "nacked", "extend": "extended"}[action]
        return {name: done, "stale": stale}

    def _dead(self, topic: str, group: str, limit: int, ctype: str) -> dict[str, Any]:
        g = self._group(topic, group)
        out = []
        for mid, reason in list(g.dead.items())[:limit]:
            msg = self.messages[mid]
            out.append({"id": mid, "topic": topic, "key": msg.key, "tag": msg.tag, "headers": msg.headers,
                        **self._body_out(msg, ctype), "deliver_at": msg.deliver_at,
                        "attempt": g.attempts.get(mid, 0), "reason": reason})
        return {"messages": out}

    def _stats(self) -> dict[str, Any]:
        pending = [m for m in self.messages.values() if m.state == "scheduled"]
        topics: dict[str, dict[str, int]] = {}
        for m in self.messages.values():
            t = topics.setdefault(m.topic, {"scheduled": 0, "delivered_total": 0})
            t["scheduled"] += m.state == "scheduled"
            t["delivered_total"] += m.state == "delivered"
        groups = {f"{t}/{n}": {"backlog": 0, "inflight": len(g.leases), "dead": len(g.dead)}
                  for (t, n), g in self.groups.items()}
        return {"scheduled": len(pending), "produced_total": self.counter,
                "delivered_total": sum(m.state == "delivered" for m in self.messages.values()),
                "cancelled_total": sum(m.state == "cancelled" for m in self.messages.values()),
                "lateness_ms": {"p50": 1, "p99": 3, "max": 7}, "topics": topics, "groups": groups,
                "pipeline": {"timer": 0}, "disk_bytes": 1000}

    def _schedule(self, q: dict[str, str]) -> dict[str, Any]:
        start, end, step = int(q["from"]), int(q["to"]), int(q["step_ms"])
        buckets = [[s, 0] for s in range(start, end, step)]
        for m in self.messages.values():
            if m.state == "scheduled" and start <= m.deliver_at < end:
                buckets[(m.deliver_at - start) // step][1] += 1
        return {"buckets": buckets}


# ---------------------------------------------------------------------------------------------- replicas

# What a follower answers itself (docs/api.md, "Replication"); everything else goes to the primary.
UNREDIRECTED = {"/v1/info", "/v1/cluster", "/v1/stats", "/v1/schedule", "/healthz", "/readyz", "/metrics"}


class ReplicaSet:
    """Members of one shard (one node id) over one shared model. `primary` is the index of the
    member that serves, or None while the shard has none. A member's `advertise_url` is what 421
    answers name (its own URL unless a test sets another, as behind a published port)."""

    def __init__(self, node_id: str, size: int = 3, primary: int | None = 0, retry_after_s: int = 1) -> None:
        self.members = [FakeBroker(node_id).start() for _ in range(size)]
        first = self.members[0]
        for i, b in enumerate(self.members):
            b.replicas = self
            b.member = f"{node_id}-{'abc'[i]}"
            b.advertise_url = b.url
            if b is not first:  # one model: whoever is primary serves the same messages
                b.messages, b.keys, b.groups, b.lock = first.messages, first.keys, first.groups, first.lock
        self.primary = primary
        self.epoch = 1
        self.retry_after_s = retry_after_s

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.members]

    def promote(self, index: int | None) -> None:
        """Make member `index` the primary (None: no primary), carrying the id counters over."""
        if index is not None:
            top = max(self.members, key=lambda b: b.counter)
            self.members[index].counter = top.counter
            self.members[index].receipts = max(b.receipts for b in self.members)
        self.primary = index
        self.epoch += 1

    def primary_url(self) -> str | None:
        return None if self.primary is None else self.members[self.primary].advertise_url

    def refusal(self, b: FakeBroker) -> Reply | None:
        if self.primary is None:
            return Reply(503, {"error": {"code": "no_primary", "message": "no primary is known"}},
                         {"Retry-After": str(self.retry_after_s)})
        if self.members[self.primary] is not b:
            return Reply(421, {"error": {"code": "not_primary", "message": f"{b.member} is a follower",
                                         "primary": self.primary_url()}})
        return None

    def role(self, b: FakeBroker) -> str:
        if self.primary is None:
            return "candidate"
        return "primary" if self.members[self.primary] is b else "follower"

    def info(self, b: FakeBroker) -> dict[str, Any]:
        return {"role": self.role(b), "primary": self.primary_url()}

    def describe(self, b: FakeBroker) -> dict[str, Any]:
        p = None if self.primary is None else self.members[self.primary]
        return {"shard": b.node_id, "epoch": self.epoch,
                "primary": None if p is None else {"member": p.member, "url": p.advertise_url, "epoch": self.epoch},
                "isr": {"epoch": self.epoch, "members": [m.member for m in self.members], "revision": 7},
                "members": [{"member": m.member, "url": m.advertise_url, "role": self.role(m), "in_sync": True,
                             "registered": True, "lag_bytes": 0, "lag_ms": 0} for m in self.members],
                "self": {"member": b.member, "role": self.role(b), "epoch": self.epoch,
                         "may_acknowledge": p is b, "fence_left_ms": 2000 if p is b else None}}

    def stop(self) -> None:
        for b in self.members:
            b.stop()
