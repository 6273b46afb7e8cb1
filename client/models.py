"""Typed results of the API, built from the decoded answers.

Every time is epoch milliseconds as in the API; the `*_dt` properties give aware UTC datetimes.
Fields the broker adds later are ignored rather than breaking old clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from delayd.client.codec import decode_body, from_epoch_ms
from delayd.client.errors import ProtocolError


class MessageState(StrEnum):
    SCHEDULED = "scheduled"
    DELIVERED = "delivered"
    CANCELLED = "cancelled"


def _req(obj: Mapping[str, Any], name: str) -> Any:
    try:
        return obj[name]
    except (KeyError, TypeError) as e:
        raise ProtocolError(f"answer lacks {name!r}: {obj!r:.200}") from e


def _headers(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj.get("headers") or {})


@dataclass(frozen=True)
class SendResult:
    id: str
    deliver_at: int
    duplicate: bool = False

    @property
    def deliver_at_dt(self) -> datetime:
        return from_epoch_ms(self.deliver_at)

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> SendResult:
        return cls(str(_req(obj, "id")), int(_req(obj, "deliver_at")), bool(obj.get("duplicate", False)))


@dataclass(frozen=True)
class Message:
    """A message as `get` / `get_key` show it."""

    id: str
    topic: str
    body: bytes
    deliver_at: int
    state: MessageState | str
    produced_at: int | None = None
    key: str | None = None
    tag: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @property
    def deliver_at_dt(self) -> datetime:
        return from_epoch_ms(self.deliver_at)

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> Message:
        raw_state = str(_req(obj, "state"))
        try:
            state: MessageState | str = MessageState(raw_state)
        except ValueError:
            state = raw_state  # a state this SDK does not know yet
        produced = obj.get("produced_at")
        return cls(id=str(_req(obj, "id")), topic=str(obj.get("topic") or ""), body=decode_body(obj),
                   deliver_at=int(_req(obj, "deliver_at")), state=state,
                   produced_at=None if produced is None else int(produced), key=obj.get("key"),
                   tag=obj.get("tag"), headers=_headers(obj))


@dataclass(frozen=True)
class ReceivedMessage:
    """A pulled message; settle it with `ack`, `nack` or `extend` using `receipt`."""

    id: str
    receipt: str
    topic: str
    body: bytes
    deliver_at: int
    delivered_at: int
    attempt: int
    key: str | None = None
    tag: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    group: str | None = None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @property
    def deliver_at_dt(self) -> datetime:
        return from_epoch_ms(self.deliver_at)

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any], group: str | None = None, topic: str = "") -> ReceivedMessage:
        """`topic`: the topic pulled from, for an answer without one (a pull whose `fields` left it out)."""
        deliver_at = int(_req(obj, "deliver_at"))
        return cls(id=str(_req(obj, "id")), receipt=str(_req(obj, "receipt")), topic=str(obj.get("topic") or topic),
                   body=decode_body(obj), deliver_at=deliver_at,
                   delivered_at=int(obj.get("delivered_at") or deliver_at), attempt=int(obj.get("attempt") or 1),
                   key=obj.get("key"), tag=obj.get("tag"), headers=_headers(obj), group=group)


@dataclass(frozen=True)
class DeadLetter:
    id: str
    topic: str
    body: bytes
    deliver_at: int
    attempt: int
    reason: str | None = None
    key: str | None = None
    tag: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> DeadLetter:
        return cls(id=str(_req(obj, "id")), topic=str(obj.get("topic") or ""), body=decode_body(obj),
                   deliver_at=int(obj.get("deliver_at") or 0), attempt=int(obj.get("attempt") or 0),
                   reason=obj.get("reason"), key=obj.get("key"), tag=obj.get("tag"), headers=_headers(obj))


@dataclass(frozen=True)
class PendingMessage:
    """A pending message as a listing shows it (`list`); `body` only when asked for."""

    id: str
    topic: str
    deliver_at: int
    produced_at: int
    body_size: int
    key: str | None = None
    tag: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None

    @property
    def deliver_at_dt(self) -> datetime:
        return from_epoch_ms(self.deliver_at)

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> PendingMessage:
        has_body = "body" in obj or "body_b64" in obj
        return cls(id=str(_req(obj, "id")), topic=str(obj.get("topic") or ""), deliver_at=int(_req(obj, "deliver_at")),
                   produced_at=int(obj.get("produced_at") or 0), body_size=int(obj.get("body_size") or 0),
                   key=obj.get("key"), tag=obj.get("tag"), headers=_headers(obj),
                   body=decode_body(obj) if has_body else None)


@dataclass(frozen=True)
class PendingPage:
    """One page of a listing, in due order. `cursor` resumes after it (None: nothing more; also
    None when several shards were merged). A page may hold fewer messages than asked for and still
    have a cursor: the broker bounds the work of one request."""

    messages: list[PendingMessage]
    cursor: str | None = None


@dataclass(frozen=True)
class CancelResult:
    id: str
    state: str = "cancelled"

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> CancelResult:
        return cls(str(_req(obj, "id")), str(obj.get("state") or "cancelled"))


@dataclass(frozen=True)
class PushSettings:
    """A push subscription: the daemon POSTs each due message to `url` (docs/push.md).

    Unset fields take the daemon's defaults (timeout 30 s, 10 in flight, JSON, unsigned). Answers
    never carry the secret, only `secret_fingerprint`."""

    url: str
    timeout_ms: int | None = None
    max_in_flight: int | None = None
    secret: str | None = None
    format: str | None = None  # "json" or "msgpack": the encoding of the POSTed message
    secret_fingerprint: str | None = None  # in answers only

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url}
        for name in ("timeout_ms", "max_in_flight", "secret", "format"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> PushSettings:
        return cls(str(_req(obj, "url")), obj.get("timeout_ms"), obj.get("max_in_flight"), None, obj.get("format"),
                   obj.get("secret_fingerprint"))


@dataclass(frozen=True)
class Subscription:
    topic: str
    group: str
    start: str | None = None
    max_attempts: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    push: PushSettings | None = None  # None: a pull subscription

    @classmethod
    def from_wire(cls, topic: str, group: str, obj: Mapping[str, Any] | None) -> Subscription:
        obj = dict(obj or {})
        start = obj.pop("start", None)
        max_attempts = obj.pop("max_attempts", None)
        push = obj.pop("push", None)
        obj.pop("topic", None)
        obj.pop("group", None)
        return cls(topic, group, start, None if max_attempts is None else int(max_attempts), obj,
                   PushSettings.from_wire(push) if isinstance(push, Mapping) else None)


@dataclass(frozen=True)
class SubscriptionStatus:
    """`GET /v1/topics/{t}/subscriptions/{g}`: a group's settings and counts. Over several shards
    the counts are summed and `oldest_unacked_age_ms` is the oldest of any shard."""

    topic: str
    group: str
    start: str
    max_attempts: int
    backlog: int
    inflight: int
    dead: int
    oldest_unacked_age_ms: int

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> SubscriptionStatus:
        return cls(topic=str(_req(obj, "topic")), group=str(_req(obj, "group")), start=str(obj.get("start") or ""),
                   max_attempts=int(_req(obj, "max_attempts")), backlog=int(obj.get("backlog") or 0),
                   inflight=int(obj.get("inflight") or 0), dead=int(obj.get("dead") or 0),
                   oldest_unacked_age_ms=int(obj.get("oldest_unacked_age_ms") or 0))

    @classmethod
    def merge(cls, parts: list[SubscriptionStatus]) -> SubscriptionStatus:
        first = parts[0]
        return cls(first.topic, first.group, first.start, first.max_attempts,
                   backlog=sum(p.backlog for p in parts), inflight=sum(p.inflight for p in parts),
                   dead=sum(p.dead for p in parts),
                   oldest_unacked_age_ms=max(p.oldest_unacked_age_ms for p in parts))


@dataclass(frozen=True)
class AckResult:
    acked: int
    stale: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NackResult:
    nacked: int
    stale: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExtendResult:
    extended: int
    stale: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RedriveResult:
    redriven: int


@dataclass(frozen=True)
class ScheduleBucket:
    start_ms: int
    count: int

    @property
    def start_dt(self) -> datetime:
        return from_epoch_ms(self.start_ms)


@dataclass(frozen=True)
class NodeInfo:
    """`GET /v1/info` of one URL. `role` ("primary", "follower", "candidate") and `primary` (the
    primary's URL, None while unknown) come from a member of a replicated shard; None otherwise."""

    url: str
    node_id: str
    version: str = ""
    role: str | None = None
    primary: str | None = None

    @classmethod
    def from_wire(cls, url: str, d: Mapping[str, Any]) -> NodeInfo:
        role, primary = d.get("role"), d.get("primary")
        return cls(url, str(d["node_id"]), str(d.get("version", "")), role if isinstance(role, str) else None,
                   primary if isinstance(primary, str) else None)


@dataclass(frozen=True)
class Stats:
    """`GET /v1/stats`. With several shards the counts are summed and lateness is the worst shard's
    (percentiles cannot be merged exactly, so p50/p99 are upper bounds); `shards` keeps each one."""

    scheduled: int
    produced_total: int
    delivered_total: int
    cancelled_total: int
    lateness_ms: dict[str, int]
    topics: dict[str, dict[str, int]]
    groups: dict[str, dict[str, int]]
    pipeline: dict[str, int]
    disk_bytes: int
    raw: dict[str, Any] = field(default_factory=dict)
    shards: dict[str, Stats] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> Stats:
        def num(name: str) -> int:
            return int(obj.get(name) or 0)
        return cls(scheduled=num("scheduled"), produced_total=num("produced_total"),
                   delivered_total=num("delivered_total"), cancelled_total=num("cancelled_total"),
                   lateness_ms=dict(obj.get("lateness_ms") or {}), topics=dict(obj.get("topics") or {}),
                   groups=dict(obj.get("groups") or {}), pipeline=dict(obj.get("pipeline") or {}),
                   disk_bytes=num("disk_bytes"), raw=dict(obj))

    @classmethod
    def merge(cls, per_shard: Mapping[str, Stats]) -> Stats:
        parts = list(per_shard.values())
        if len(parts) == 1:
            only = parts[0]
            return cls(**{**only.__dict__, "shards": dict(per_shard)})

        def total(name: str) -> int:
            return sum(getattr(p, name) for p in parts)

        def sum_maps(maps: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
            out: dict[str, dict[str, int]] = {}
            for m in maps:
                for name, counters in m.items():
                    slot = out.setdefault(name, {})
                    for k, v in counters.items():
                        slot[k] = slot.get(k, 0) + (v if isinstance(v, int | float) else 0)
            return out

        lateness: dict[str, int] = {}
        pipeline: dict[str, int] = {}
        for p in parts:
            for k, v in p.lateness_ms.items():
                lateness[k] = max(lateness.get(k, 0), v or 0)
            for k, v in p.pipeline.items():
                pipeline[k] = pipeline.get(k, 0) + (v or 0)
        return cls(scheduled=total("scheduled"), produced_total=total("produced_total"),
                   delivered_total=total("delivered_total"), cancelled_total=total("cancelled_total"),
                   lateness_ms=lateness, topics=sum_maps([p.topics for p in parts]),
                   groups=sum_maps([p.groups for p in parts]), pipeline=pipeline,
                   disk_bytes=total("disk_bytes"), raw={}, shards=dict(per_shard))

    def to_dict(self) -> dict[str, Any]:
        """The API's shape (for `--json`), with `shards` when there are several."""
        out: dict[str, Any] = dict(self.raw) if self.raw else {
            "scheduled": self.scheduled, "produced_total": self.produced_total,
            "delivered_total": self.delivered_total, "cancelled_total": self.cancelled_total,
            "lateness_ms": self.lateness_ms, "topics": self.topics, "groups": self.groups,
            "pipeline": self.pipeline, "disk_bytes": self.disk_bytes}
        if len(self.shards) > 1:
            out["shards"] = {name: s.to_dict() for name, s in self.shards.items()}
        return out
