"""`AsyncClient`: the whole HTTP API v1 as coroutines, for one broker or a set of shards.

Sharding: given several URLs, the client asks each `GET /v1/info` for its `node_id` (once, on first
use) and then routes

* produce, `cancel_key`, `get_key` - by a consistent hash ring over (topic, key); a message without
  a key goes to a random shard (all unkeyed messages of one `send_batch` call to the same one);
* `cancel`, `get`, `ack`, `nack`, `extend` - to the shard whose node id prefixes the id or receipt;
* `pull` - to every shard (see `client.shardpull`), never returning more than `max`;
* `subscribe`, `dead`, `redrive`, `stats`, `schedule`, `info` - to every shard, answers merged;
* `list` (client.listing) - to every shard, its pages merged in due order.

Pending messages never move between shards. When shards are added, keys move per consistent hashing,
so `cancel_key` / `get_key` ask every shard when the key's current owner answers 404.

Replicas: URLs whose `/v1/info` reports the same node id are members of one replicated shard, not
two shards. Each request to a shard goes to its primary (client.replicas, client.http: a 421 is
followed, an unreachable member skipped).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from delayd.client.codec import Body, Encoding, OutgoingMessage, to_epoch_ms, to_ms_duration
from delayd.client.errors import AlreadyDelivered, ConnectionFailed, DelaydError, InvalidMessage, NotFound
from delayd.client.http import Retry, RetryPolicy, TlsOption, Transport, path, tls_context
from delayd.client.listing import Listing
from delayd.client.models import (
    AckResult,
    CancelResult,
    DeadLetter,
    ExtendResult,
    Message,
    NackResult,
    NodeInfo,
    PushSettings,
    ReceivedMessage,
    RedriveResult,
    ScheduleBucket,
    SendResult,
    Stats,
    Subscription,
    SubscriptionStatus,
)
from delayd.client.replicas import Shard, advertised_members, normalize_url
from delayd.client.ring import DEFAULT_VNODES, HashRing, routing_key
from delayd.client.shardpull import PullKey, ShardedPuller

DEFAULT_URL = "http://127.0.0.1:7070"
MAX_BATCH = 10_000  # the API's limit for one produce request
# What one produce request is kept under when a batch is split: the broker refuses requests over
# its max_request_bytes (default 16 MiB) and max_request_elements (default 250,000) with 413.
REQUEST_BYTES = 8 << 20
REQUEST_ELEMENTS = 200_000

Urls = str | Sequence[str] | Mapping[str, str | Sequence[str]]
Receipts = str | ReceivedMessage | Iterable[str | ReceivedMessage]
Push = PushSettings | Mapping[str, Any] | bool | None  # subscribe(push=...): False = back to pull


def _url_list(url: str | Sequence[str]) -> list[str]:
    items = url.split(",") if isinstance(url, str) else list(url)
    return [normalize_url(u) for u in items if u and u.strip()]


def normalize_urls(url: Urls) -> tuple[list[str], dict[str, str]]:
    """(urls, known node ids by url). A string may hold several URLs separated by commas; a mapping
    gives each node id one URL or several (the members of a replicated shard)."""
    nodes: dict[str, str] = {}
    if isinstance(url, Mapping):
        urls = []
        for node, members in url.items():
            for u in _url_list(members):
                urls.append(u)
                nodes[u] = str(node)
    else:
        urls = _url_list(url)
    if not urls:
        raise ValueError("at least one broker URL is required")
    if len(set(urls)) != len(urls):
        raise ValueError(f"duplicate broker URL in {urls}")
    return urls, nodes


def owner_node(id_or_receipt: str) -> str:
    """The node id that prefixes a message id or receipt (`{node_id}-{n}`, receipts `{id}.…`)."""
    return id_or_receipt.split("-", 1)[0]


def receipt_list(receipts: Receipts) -> list[str]:
    if isinstance(receipts, str | ReceivedMessage):
        receipts = [receipts]
    return [r.receipt if isinstance(r, ReceivedMessage) else str(r) for r in receipts]


def _wire_size(v: Any) -> tuple[int, int]:
    """(estimated bytes, elements) of one wire value, in either encoding."""
    if isinstance(v, str):
        # In JSON, printable ASCII takes a byte a character (2 for '"' and '\\'), other text up to 4
        # (UTF-8), and control characters 6 (\u00XX).
        return len(v) * (1 if v.isascii() and v.isprintable() else 4 if v.isprintable() else 6) + 2, 1
    if isinstance(v, bytes | bytearray):
        return len(v) + 5, 1
    if isinstance(v, Mapping):
        size = elements = 0
        for k, x in v.items():
            ks, ke = _wire_size(k)
            xs, xe = _wire_size(x)
            size, elements = size + ks + xs + 2, elements + ke + xe
        return size + 2, elements
    return 20, 1


def request_parts(indices: list[int], wires: list[dict[str, Any]]) -> list[list[int]]:
    """`indices` in runs that each fit one produce request: at most MAX_BATCH messages,
    REQUEST_BYTES and REQUEST_ELEMENTS (estimated; a single larger message goes alone)."""
    parts: list[list[int]] = []
    part: list[int] = []
    size = elements = 0
    for i in indices:
        s, e = _wire_size(wires[i])
        if part and (len(part) >= MAX_BATCH or size + s > REQUEST_BYTES or elements + e + 1 > REQUEST_ELEMENTS):
            parts.append(part)
            part, size, elements = [], 0, 0
        part.append(i)
        size, elements = size + s, elements + e + 1
    if part:
        parts.append(part)
    return parts


class AsyncClient(Listing):
    """Asynchronous delayd client. Use as `async with AsyncClient(url) as c:` or call `close()`.

    `url` is one base URL, several (a list, or one string with commas) for a sharded deployment, or
    a mapping `{node_id: url}` that skips the `/v1/info` discovery. URLs that report the same node id
    are the members of one replicated shard (in a mapping: `{node_id: [url, ...]}`); requests go to
    its primary, following 421 `not_primary` redirects. `encoding` is `"msgpack"`
    (default) or `"json"`. `token` is the bearer token when the daemon has tokens configured.

    `tls` is for `https://` URLs of a daemon whose certificate the system does not trust (a
    self-signed or private-CA one): the path of a PEM file of CA certificates, or an
    `ssl.SSLContext` (client certificates, pinning, ...). Left out, the system's CAs are used.

    Retries (jittered exponential backoff, honouring `Retry-After`) happen only where a retry cannot
    duplicate anything: reads, cancel, ack, nack, extend and the other idempotent calls are retried
    on connection errors, 429 and 503; produce is retried on those only when every message in the
    request has a `key` (the broker deduplicates by key), and otherwise only when the request
    provably did not take effect (connection refused, or 429 `backpressure`).
    """

    def __init__(self, url: Urls = DEFAULT_URL, token: str | None = None, *, encoding: str | Encoding = "msgpack",
                 timeout_s: float = 30.0, retry: RetryPolicy | None = None, vnodes: int = DEFAULT_VNODES,
                 tls: TlsOption = None) -> None:
        self._urls, self._node_by_url = normalize_urls(url)
        self.encoding = Encoding(encoding)
        self._http = Transport(token=token, encoding=self.encoding, timeout_s=timeout_s,
                               retry=retry or RetryPolicy(), tls=tls_context(tls))
        self._vnodes = vnodes
        self._ring: HashRing | None = None
        self._shards: dict[str, Shard] = {}  # by name: the node id, or the only URL given
        self._targets: list[str] = []         # shard names, in the order their first URL was given
        self._discovery: asyncio.Lock | None = None
        self._puller = ShardedPuller()
        if self._node_by_url:
            self._build_shards({u: (n, None) for u, n in self._node_by_url.items()})
        elif len(self._urls) == 1:
            # One URL is one shard (replicated or not): nothing to discover before the first call.
            self._shards = {self._urls[0]: Shard.single(self._urls[0])}
            self._targets = [self._urls[0]]

    # ----------------------------------------------------------------- lifecycle & topology

    @property
    def urls(self) -> list[str]:
        """The broker base URLs this client talks to, in the order given."""
        return list(self._urls)

    @property
    def sharded(self) -> bool:
        """True when the client spreads over several shards. Before the first call, several URLs
        whose node ids are not known yet count as sharded (they may turn out to be one replicated
        shard)."""
        return len(self._targets) > 1 if self._targets else len(self._urls) > 1

    @property
    def shards(self) -> dict[str, list[str]]:
        """Each shard's member URLs by shard name (its node id; the URL itself for a lone URL),
        once known (empty before the first call of a client given several URLs)."""
        return {n: list(self._shards[n].members) for n in self._targets}

    @property
    def primaries(self) -> dict[str, str | None]:
        """The primary each shard's requests go to now (None: not known, the next member is tried)."""
        return {n: self._shards[n].primary for n in self._targets}

    async def __aenter__(self) -> AsyncClient:
        """`async with AsyncClient(...) as c:` closes the client at the end of the block."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the client (see `close`)."""
        await self.close()

    async def close(self) -> None:
        """Release unclaimed pulled messages and close connections. Idempotent."""
        if self._http.closed:
            return
        await self._puller.close(lambda t, g, ms: self.nack(t, g, ms, delay_ms=0))
        await self._http.close()

    def _build_shards(self, found: Mapping[str, tuple[str, str | None]]) -> None:
        """Shards from {url: (node id, role)}, members in the order given; a member that says it is
        primary is tried first."""
        shards: dict[str, Shard] = {}
        for u in self._urls:
            if u not in found:
                continue
            node, role = found[u]
            shard = shards.setdefault(node, Shard(node, []))
            shard.members.append(u)
            if role == "primary":
                shard.primary = u
        self._node_by_url = {u: n for u, (n, _) in found.items()}
        self._shards = shards
        self._targets = list(shards)
        self._ring = HashRing(self._targets, self._vnodes) if len(shards) > 1 else None

    async def _ready(self) -> None:
        """Know the shards: ask every URL's `/v1/info` once (several URLs, no mapping given)."""
        if self._targets:
            return
        if self._discovery is None:
            self._discovery = asyncio.Lock()
        async with self._discovery:
            if not self._targets:
                await self._discover()

    async def _discover(self) -> None:
        outcomes = await asyncio.gather(*(self._http.request(u, "GET", "/v1/info") for u in self._urls),
                                        return_exceptions=True)
        found: dict[str, tuple[str, str | None]] = {}
        down: list[tuple[str, ConnectionFailed]] = []
        for u, outcome in zip(self._urls, outcomes, strict=True):
            if isinstance(outcome, ConnectionFailed):
                down.append((u, outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                role = outcome.get("role")
                found[u] = (str(outcome["node_id"]), role if isinstance(role, str) else None)
        views = await self._cluster_views([u for u in self._urls if u in found])
        for u, err in down:
            # A member that is down now can still be placed by what its shard says of its members.
            node = next((found[v][0] for v, view in views.items() if u in advertised_members(view)), None)
            if node is None:
                raise err
            found[u] = (node, None)
        self._build_shards(found)
        for v, view in views.items():
            self._shards[found[v][0]].learn_aliases(v, view)

    async def _cluster_views(self, urls: list[str]) -> dict[str, Any]:
        """`GET /v1/cluster` of each URL that answers one with replication on (a daemon without
        replication, or one older than it, is simply left out)."""
        if len(self._urls) < 2:
            return {}
        outcomes = await asyncio.gather(*(self._http.request(u, "GET", "/v1/cluster", retry=Retry.NEVER)
                                          for u in urls), return_exceptions=True)
        return {u: o for u, o in zip(urls, outcomes, strict=True)
                if isinstance(o, Mapping) and isinstance(o.get("members"), list)}

    async def _topology(self) -> HashRing | None:
        await self._ready()
        return self._ring

    async def _shard_for_id(self, id_or_receipt: str) -> str:
        await self._ready()
        if len(self._targets) == 1:
            return self._targets[0]
        node = owner_node(id_or_receipt)
        if node not in self._shards:
            raise NotFound(f"no shard has node id {node!r} (from {id_or_receipt!r})")
        return node

    async def _shard_for_key(self, topic: str, key: str) -> str:
        ring = await self._topology()
        return self._targets[0] if ring is None else ring.owner_of(topic, key)

    async def _call(self, shard: str, method: str, url_path: str, **kw: Any) -> Any:
        return await self._http.request(self._shards[shard], method, url_path, **kw)

    async def _everywhere(self, method: str, url_path: str, **kw: Any) -> list[Any]:
        await self._ready()
        return list(await asyncio.gather(*(self._call(n, method, url_path, **kw) for n in self._targets)))

    # ----------------------------------------------------------------- produce

    async def send(self, topic: str, body: Body, *, delay_ms: int | float | timedelta | None = None,
                   deliver_at: int | float | datetime | None = None, key: str | None = None,
                   tag: str | None = None, headers: Mapping[str, str] | None = None,
                   replace: bool = False) -> SendResult:
        """Produce one message; due after `delay_ms`, at `deliver_at`, or now.

        A `key` makes the call idempotent (a second send answers the first message with
        `duplicate=True`); with `replace=True` it reschedules the pending message instead.
        """
        msg = OutgoingMessage(body, delay_ms, deliver_at, key, tag, headers, replace)
        return (await self.send_batch(topic, [msg]))[0]

    async def send_batch(self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]
                         ) -> list[SendResult]:
        """Produce many messages; results in the same order.

        One request to one broker is all-or-nothing. Across shards, and beyond 10,000 messages or
        about 8 MiB (REQUEST_BYTES, REQUEST_ELEMENTS), the batch is split; if a part fails, the
        exception's `index` is the position in `messages` and its `partial` attribute lists the
        results of the parts that were stored (None elsewhere).
        """
        msgs: list[OutgoingMessage] = []
        wires: list[dict[str, Any]] = []
        for i, m in enumerate(messages):
            try:
                msg = OutgoingMessage.coerce(m)
                msgs.append(msg)
                wires.append(msg.to_wire(self.encoding))
            except (TypeError, ValueError) as e:
                raise InvalidMessage(str(e), index=i) from e
        if not msgs:
            return []
        routes: dict[str, list[int]] = {}
        ring = await self._topology()
        if ring is None:
            routes[self._targets[0]] = list(range(len(msgs)))
        else:
            unkeyed = ring.owner(routing_key(topic, secrets.token_hex(8)))
            for i, m in enumerate(msgs):
                shard = ring.owner_of(topic, m.key) if m.key is not None else unkeyed
                routes.setdefault(shard, []).append(i)
        parts: list[tuple[str, list[int]]] = []
        for url, indices in routes.items():
            parts += [(url, part) for part in request_parts(indices, wires)]

        async def produce(url: str, indices: list[int]) -> list[SendResult]:
            keyed = all(msgs[i].key is not None for i in indices)
            answer = await self._call(url, "POST", path("topics", topic, "messages"),
                                      body={"messages": [wires[i] for i in indices]},
                                      retry=Retry.SAFE if keyed else Retry.UNSENT)
            results = [SendResult.from_wire(r) for r in answer["messages"]]
            if len(results) != len(indices):
                raise DelaydError(f"asked to store {len(indices)} messages, broker answered {len(results)}",
                                  code="protocol_error", url=self._shards[url].current())
            return results

        outcomes = await asyncio.gather(*(produce(u, ix) for u, ix in parts), return_exceptions=True)
        out: list[SendResult | None] = [None] * len(msgs)
        failure: BaseException | None = None
        for (_, indices), outcome in zip(parts, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if isinstance(outcome, DelaydError) and outcome.index is not None \
                        and 0 <= outcome.index < len(indices):
                    outcome.index = indices[outcome.index]
                failure = failure or outcome
                continue
            for i, r in zip(indices, outcome, strict=True):
                out[i] = r
        if failure is not None:
            failure.partial = out  # type: ignore[attr-defined]
            raise failure
        return [r for r in out if r is not None]

    # ----------------------------------------------------------------- cancel & inspect

    async def cancel(self, id: str) -> CancelResult:
        """Cancel a pending message. Idempotent; raises `AlreadyDelivered` (409) or `NotFound`."""
        url = await self._shard_for_id(id)
        return CancelResult.from_wire(await self._call(url, "DELETE", path("messages", id)))

    async def cancel_key(self, topic: str, key: str) -> CancelResult:
        """Cancel the pending message of `topic` that has `key`."""
        answer = await self._by_key("DELETE", topic, key)
        return CancelResult.from_wire(answer)

    async def get(self, id: str) -> Message:
        """A message by id, with its state (scheduled, delivered, cancelled); `NotFound` if none."""
        url = await self._shard_for_id(id)
        return Message.from_wire(await self._call(url, "GET", path("messages", id)))

    async def get_key(self, topic: str, key: str) -> Message:
        """The pending message of `topic` that has `key`."""
        return Message.from_wire(await self._by_key("GET", topic, key))

    async def _by_key(self, method: str, topic: str, key: str) -> Any:
        url_path = path("topics", topic, "keys", key)
        owner = await self._shard_for_key(topic, key)
        try:
            return await self._call(owner, method, url_path)
        except NotFound as first:
            others = [u for u in self._targets if u != owner]
            if not others:
                raise
            # The key may have been placed before shards were added: ask the previous owners too.
            outcomes = await asyncio.gather(*(self._call(u, method, url_path) for u in others),
                                            return_exceptions=True)
            for outcome in outcomes:
                if not isinstance(outcome, BaseException):
                    return outcome
            for outcome in outcomes:
                if isinstance(outcome, AlreadyDelivered):
                    raise outcome from None
            for outcome in outcomes:
                if not isinstance(outcome, NotFound) and isinstance(outcome, BaseException):
                    raise outcome from None
            raise first

    # ----------------------------------------------------------------- consume

    def _sub_path(self, topic: str, group: str, *rest: str) -> str:
        return path("topics", topic, "subscriptions", group, *rest)

    async def subscribe(self, topic: str, group: str, start: str | None = None,
                        max_attempts: int | None = None, push: Push = None) -> Subscription:
        """Create or update a subscription group; `start` is "earliest" or "latest".

        `push` makes it a push subscription (a PushSettings, or a mapping of its fields), `False`
        turns it back into pull, None (the default) leaves it as it is."""
        body: dict[str, Any] = {}
        if start is not None:
            body["start"] = start
        if max_attempts is not None:
            body["max_attempts"] = int(max_attempts)
        if push is False:
            body["push"] = None
        elif isinstance(push, PushSettings):
            body["push"] = push.to_wire()
        elif isinstance(push, Mapping):
            body["push"] = dict(push)
        elif push is not None:
            raise TypeError("push must be a PushSettings, a mapping, False (back to pull) or None (unchanged)")
        answers = await self._everywhere("PUT", self._sub_path(topic, group), body=body)
        return Subscription.from_wire(topic, group, answers[0] if isinstance(answers[0], Mapping) else None)

    async def get_subscription(self, topic: str, group: str) -> SubscriptionStatus:
        """A group's settings and counts (backlog, inflight, dead, age of the oldest unacked
        message). Unlike `pull`, looking does not create the group: `NotFound` if it does not exist
        (on every shard)."""
        parts = [SubscriptionStatus.from_wire(a)
                 for a in await self._on_shards_that_have_it("GET", self._sub_path(topic, group))]
        return SubscriptionStatus.merge(parts)

    async def delete_subscription(self, topic: str, group: str) -> None:
        """Delete a group with its position, leases and dead letters (needs the `admin` right).
        `NotFound` if no shard has it; a later `pull` or `subscribe` creates it afresh."""
        await self._on_shards_that_have_it("DELETE", self._sub_path(topic, group))

    async def _on_shards_that_have_it(self, method: str, url_path: str) -> list[Any]:
        """Ask every shard; the answers of those that have it, `NotFound` when none has it."""
        await self._ready()
        outcomes = await asyncio.gather(*(self._call(u, method, url_path) for u in self._targets),
                                        return_exceptions=True)
        found = [o for o in outcomes if not isinstance(o, BaseException)]
        for o in outcomes:
            if isinstance(o, BaseException) and not isinstance(o, NotFound):
                raise o
        if not found:
            first = outcomes[0]
            assert isinstance(first, NotFound)
            raise first
        return found

    async def pull(self, topic: str, group: str, max: int = 100, wait_ms: int | timedelta = 0,
                   lease_ms: int | timedelta = 30_000, tags: Iterable[str] | None = None,
                   fields: Iterable[str] | None = None) -> list[ReceivedMessage]:
        """Lease up to `max` due messages, waiting up to `wait_ms` for the first one. `fields`:
        only these are sent (with id, receipt and deliver_at; the others keep their defaults:
        empty body, no key, tag or headers, attempt 1, delivered_at = deliver_at)."""
        wait = to_ms_duration(wait_ms, "wait_ms")
        lease = to_ms_duration(lease_ms, "lease_ms")
        tag_list = None if tags is None else [str(t) for t in tags]
        field_list = None if fields is None else sorted({str(f) for f in fields} | {"deliver_at"})

        async def fetch(url: str, n: int, wait_ms: int, lease_ms: int) -> list[ReceivedMessage]:
            body: dict[str, Any] = {"max": n, "wait_ms": wait_ms, "lease_ms": lease_ms}
            if tag_list is not None:
                body["tags"] = tag_list
            if field_list is not None:
                body["fields"] = field_list
            answer = await self._call(url, "POST", self._sub_path(topic, group, "pull"), body=body,
                                      extra_timeout_s=wait_ms / 1000)
            return [ReceivedMessage.from_wire(m, group, topic) for m in answer.get("messages") or []]

        await self._ready()
        if not self.sharded:
            return await fetch(self._targets[0], max, wait, lease)
        key = PullKey(topic, group, None if tag_list is None else tuple(tag_list),
                      None if field_list is None else tuple(field_list))
        return await self._puller.pull(key, self._targets, fetch, max_messages=max, wait_ms=wait, lease_ms=lease)

    async def _settle(self, topic: str, group: str, action: str, receipts: Receipts,
                      extra: Mapping[str, Any]) -> tuple[int, list[str], str]:
        """Send ack/nack/extend to the owning shard(s); (count, stale receipts, count field name)."""
        counted = {"ack": "acked", "nack": "nacked", "extend": "extended"}[action]
        items = receipt_list(receipts)
        if not items:
            return 0, [], counted
        by_url: dict[str, list[str]] = {}
        stale: list[str] = []
        for r in items:
            try:
                by_url.setdefault(await self._shard_for_id(r), []).append(r)
            except NotFound:
                stale.append(r)  # no shard could ever have leased it
        answers = await asyncio.gather(*(
            self._call(u, "POST", self._sub_path(topic, group, action), body={"receipts": rs, **extra})
            for u, rs in by_url.items()))
        count = 0
        for (_, rs), answer in zip(by_url.items(), answers, strict=True):
            answer = answer if isinstance(answer, Mapping) else {}
            part_stale = [str(s) for s in answer.get("stale") or []]
            stale += part_stale
            count += int(answer.get(counted, len(rs) - len(part_stale)))
        return count, stale, counted

    async def ack(self, topic: str, group: str, receipts: Receipts) -> AckResult:
        """Acknowledge messages (receipts, or the `ReceivedMessage`s themselves)."""
        count, stale, _ = await self._settle(topic, group, "ack", receipts, {})
        return AckResult(count, stale)

    async def nack(self, topic: str, group: str, receipts: Receipts,
                   delay_ms: int | timedelta | None = None) -> NackResult:
        """Hand messages back for redelivery after `delay_ms` (default: the broker's backoff)."""
        extra = {} if delay_ms is None else {"delay_ms": to_ms_duration(delay_ms)}
        count, stale, _ = await self._settle(topic, group, "nack", receipts, extra)
        return NackResult(count, stale)

    async def extend(self, topic: str, group: str, receipts: Receipts,
                     lease_ms: int | timedelta = 30_000) -> ExtendResult:
        """Renew leases to `lease_ms` from now."""
        extra = {"lease_ms": to_ms_duration(lease_ms, "lease_ms")}
        count, stale, _ = await self._settle(topic, group, "extend", receipts, extra)
        return ExtendResult(count, stale)

    async def dead(self, topic: str, group: str, limit: int = 100) -> list[DeadLetter]:
        """Dead letters of a group (at most `limit`, over all shards)."""
        answers = await self._everywhere("GET", self._sub_path(topic, group, "dead"), query={"limit": limit})
        out = [DeadLetter.from_wire(m) for a in answers for m in (a or {}).get("messages") or []]
        return out[:limit]

    async def redrive(self, topic: str, group: str, ids: Iterable[str] | None = None) -> RedriveResult:
        """Re-queue dead letters (the given ids, or all of them)."""
        url_path = self._sub_path(topic, group, "dead", "redrive")
        if ids is None:
            answers = await self._everywhere("POST", url_path, body={})
        else:
            by_url: dict[str, list[str]] = {}
            for i in ids:
                by_url.setdefault(await self._shard_for_id(i), []).append(i)
            answers = list(await asyncio.gather(*(self._call(u, "POST", url_path, body={"ids": ix})
                                                  for u, ix in by_url.items())))
        return RedriveResult(sum(_redriven_count(a) for a in answers))

    # ----------------------------------------------------------------- observe

    async def stats(self) -> Stats:
        """`GET /v1/stats` of every shard, merged (counts summed; each shard in `.shards`)."""
        answers = await self._everywhere("GET", "/v1/stats")
        names = list(self._targets)
        return Stats.merge({n: Stats.from_wire(a or {}) for n, a in zip(names, answers, strict=True)})

    async def schedule(self, from_ms: int | datetime, to_ms: int | datetime,
                       step_ms: int | timedelta) -> list[ScheduleBucket]:
        """How many pending messages fall due in each `step_ms` bucket of [from_ms, to_ms)."""
        query = {"from": to_epoch_ms(from_ms, "from_ms"), "to": to_epoch_ms(to_ms, "to_ms"),
                 "step_ms": to_ms_duration(step_ms, "step_ms")}
        answers = await self._everywhere("GET", "/v1/schedule", query=query)
        counts: dict[int, int] = {}
        for a in answers:
            for start, count in (a or {}).get("buckets") or []:
                counts[int(start)] = counts.get(int(start), 0) + int(count)
        return [ScheduleBucket(s, c) for s, c in sorted(counts.items())]

    async def info(self) -> list[NodeInfo]:
        """`GET /v1/info` of every URL given (each member of a replicated shard), in URL order:
        its node id, version, and with replication its `role` and the `primary` it knows."""
        answers = await asyncio.gather(*(self._http.request(u, "GET", "/v1/info") for u in self._urls))
        return [NodeInfo.from_wire(u, a) for u, a in zip(self._urls, answers, strict=True)]

    async def cluster(self) -> dict[str, dict[str, Any]]:
        """`GET /v1/cluster` of every shard, by shard name: its members, their roles, the primary,
        the epoch, the in-sync set and each follower's lag (docs/replication.md); with replication
        off `{"replication": false, "shard": ..., "role": "primary"}`. Any member may answer."""
        await self._ready()
        answers = await asyncio.gather(*(self._call(n, "GET", "/v1/cluster") for n in self._targets))
        return {n: dict(a) if isinstance(a, Mapping) else {} for n, a in zip(self._targets, answers, strict=True)}


def _redriven_count(answer: Any) -> int:
    if not isinstance(answer, Mapping):
        return 0
    for name in ("redriven", "requeued", "count"):
        if isinstance(answer.get(name), int):
            return int(answer[name])
    ids = answer.get("ids")
    return len(ids) if isinstance(ids, list) else 0
