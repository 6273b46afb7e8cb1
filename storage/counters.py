"""Counters: what /v1/stats and the metrics report — totals and per-topic counts.

They change only with appends (produce and cancel to the commit log, release to a ready
queue), so recovery makes them exact by restoring the checkpoint's snapshot and replaying the
appends after it. Topics are also known here by their crc32 (`topic_hash`), the 4 bytes a
TimerLog unit carries instead of the name.
"""

from __future__ import annotations

import enum
import zlib
from typing import Any


class Count(enum.StrEnum):
    """Per-topic counts (the names are those of /v1/stats)."""
    SCHEDULED = "scheduled"
    PRODUCED = "produced_total"
    DELIVERED = "delivered_total"
    CANCELLED = "cancelled_total"


class Total(enum.StrEnum):
    """Broker-wide totals (the checkpoint keeps them by these names)."""
    PRODUCED = "produced"
    DELIVERED = "delivered"
    CANCELLED = "cancelled"
    ROLLED = "rolled"
    UNREADABLE = "unreadable"


_FRESH = {c.value: 0 for c in Count}


class Counters:
    def __init__(self) -> None:
        self.totals: dict[str, int] = {Total.PRODUCED: 0, Total.DELIVERED: 0, Total.CANCELLED: 0, Total.ROLLED: 0}
        self.topics: dict[str, dict[str, int]] = {}
        self.topic_names: dict[int, str] = {}  # topic_hash -> name
        self.hashes: dict[str, int] = {}  # memo of topic_hash (read directly by hot loops)

    def topic_hash(self, topic: str) -> int:
        h = self.hashes.get(topic)
        if h is None:
            h = self.hashes[topic] = zlib.crc32(topic.encode())
            self.topic_names.setdefault(h, topic)
        return h

    def add(self, topic: str, count: str, n: int) -> None:
        c = self.topics.get(topic)
        if c is None:
            c = self.topics[topic] = dict(_FRESH)
            self.topic_hash(topic)
        c[count] = c.get(count, 0) + n

    def total(self, total: str, n: int = 1) -> None:
        self.totals[total] = self.totals.get(total, 0) + n

    # -- the events -----------------------------------------------------------------------------
    def produced(self, topic: str, n: int) -> None:
        self.add(topic, Count.PRODUCED, n)
        self.add(topic, Count.SCHEDULED, n)
        self.totals[Total.PRODUCED] += n

    def cancelled(self, topic: str, n: int = 1) -> None:
        self.add(topic, Count.CANCELLED, n)
        self.add(topic, Count.SCHEDULED, -n)
        self.totals[Total.CANCELLED] += n

    def delivered(self, topic: str, n: int, *, was_scheduled: bool = True) -> None:
        if was_scheduled:
            self.add(topic, Count.SCHEDULED, -n)
        self.add(topic, Count.DELIVERED, n)
        self.totals[Total.DELIVERED] += n

    @property
    def scheduled(self) -> int:
        return sum(c[Count.SCHEDULED] for c in self.topics.values())

    # -- checkpoint -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "topics": {t: dict(c) for t, c in self.topics.items()}}

    def restore(self, snap: dict[str, Any]) -> None:
        self.totals.update(snap.get("totals", {}))
        self.topics = {t: dict(c) for t, c in snap.get("topics", {}).items()}
        for t in self.topics:
            self.topic_hash(t)
