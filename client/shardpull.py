"""Pulling one subscription from several shards at once, without ever returning more than `max`.

Each shard gets a share of `max` (shares rotate, so with `max` smaller than the shard count every
shard still gets its turn). The call returns as soon as any shard has answered with messages; the
long-polls still running on the other shards are not abandoned - cancelling an HTTP request could
lose messages the broker has already leased - they stay in flight, and what they bring back is kept
for the next `pull` of the same subscription (dropped once its lease must have run out, in which case
the broker redelivers it). `close()` hands any such unclaimed messages back with a zero-delay nack.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from delayd.client.errors import DelaydError
from delayd.client.models import ReceivedMessage

# fetch(shard_url, max, wait_ms, lease_ms) -> messages of one shard
Fetch = Callable[[str, int, int, int], Awaitable[list[ReceivedMessage]]]
# release(topic, group, messages): give leased messages back (a zero-delay nack)
Release = Callable[[str, str, list[ReceivedMessage]], Awaitable[object]]

# A stashed message is dropped this long before its lease would end, so a caller never gets one that
# is about to be handed to another consumer.
LEASE_SAFETY_S = 0.5
# On close, polls still in flight get this long to come back before they are cancelled: a poll the
# broker has just answered would otherwise strand its messages until their lease runs out.
CLOSE_GRACE_S = 0.25


class PullKey(NamedTuple):
    topic: str
    group: str
    tags: tuple[str, ...] | None
    fields: tuple[str, ...] | None = None  # messages pulled with fewer fields serve only such pulls


def split_max(total: int, parts: int) -> list[int]:
    """`total` spread over `parts` as evenly as possible (earlier parts get the remainder)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class _Subscription:
    def __init__(self) -> None:
        self.inflight: dict[str, asyncio.Task[list[ReceivedMessage]]] = {}
        self.stash: deque[tuple[float, ReceivedMessage]] = deque()  # (usable until, monotonic; message)
        self.lease_s: dict[str, float] = {}
        self.turn = 0


class ShardedPuller:
    def __init__(self) -> None:
        self._subs: dict[PullKey, _Subscription] = {}

    async def pull(self, key: PullKey, urls: Sequence[str], fetch: Fetch, *, max_messages: int, wait_ms: int,
                   lease_ms: int) -> list[ReceivedMessage]:
        sub = self._subs.setdefault(key, _Subscription())
        errors: list[DelaydError] = []
        self._harvest(sub, errors)
        out = self._take(sub, max_messages)
        if out:
            return out

        idle = [u for u in urls if u not in sub.inflight]
        if idle:
            start = sub.turn % len(idle)
            sub.turn += 1
            order = idle[start:] + idle[:start]
            for url, share in zip(order, split_max(max_messages, len(order)), strict=True):
                if share > 0:
                    sub.inflight[url] = asyncio.ensure_future(fetch(url, share, wait_ms, lease_ms))
                    sub.lease_s[url] = lease_ms / 1000
        mine = {sub.inflight[u] for u in idle if u in sub.inflight}
        deadline = time.monotonic() + wait_ms / 1000
        while sub.inflight:
            if mine and not all(t.done() for t in mine):
                timeout = None  # our own polls end by themselves within wait_ms
            else:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    break
            await asyncio.wait(set(sub.inflight.values()), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            self._harvest(sub, errors)
            if sub.stash:
                break
        out = self._take(sub, max_messages)
        if not out and errors:
            raise errors[0]
        return out

    def _harvest(self, sub: _Subscription, errors: list[DelaydError]) -> None:
        for url, task in list(sub.inflight.items()):
            if not task.done():
                continue
            del sub.inflight[url]
            try:
                messages = task.result()
            except DelaydError as e:
                errors.append(e)
                continue
            usable_until = time.monotonic() + sub.lease_s.get(url, 30.0) - LEASE_SAFETY_S
            sub.stash.extend((usable_until, m) for m in messages)

    @staticmethod
    def _take(sub: _Subscription, limit: int) -> list[ReceivedMessage]:
        now = time.monotonic()
        out: list[ReceivedMessage] = []
        while sub.stash and len(out) < limit:
            usable_until, msg = sub.stash.popleft()
            if usable_until > now:
                out.append(msg)
        return out

    async def close(self, release: Release) -> None:
        """Stop the polls still in flight and release every message nobody has claimed."""
        subs, self._subs = self._subs, {}
        for key, sub in subs.items():
            tasks = list(sub.inflight.values())
            if tasks:
                await asyncio.wait(tasks, timeout=CLOSE_GRACE_S)
            self._harvest(sub, [])
            for t in sub.inflight.values():
                t.cancel()
            await asyncio.gather(*sub.inflight.values(), return_exceptions=True)
            left = [m for _, m in sub.stash]
            if left:
                try:
                    await release(key.topic, key.group, left)
                except DelaydError:
                    pass  # the leases run out and the broker redelivers them anyway
