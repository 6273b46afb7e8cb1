"""`list`: pending messages in due order, a page at a time (docs/api.md, "List pending messages").

Mixins of `AsyncClient` (an async iterator of pages) and `Client` (a plain iterator). They live
apart so that the method name `list` does not shadow the builtin inside the clients' bodies.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
from collections.abc import AsyncGenerator, Coroutine, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from delayd.client.codec import to_epoch_ms
from delayd.client.http import path
from delayd.client.models import PendingMessage, PendingPage

if TYPE_CHECKING:
    from delayd.client.aio import AsyncClient

T = TypeVar("T")
MAX_PAGE = 1000  # the API's limit per page


class Listing:
    """`AsyncClient.list` and the shard merge behind it."""

    _targets: builtins.list[str]  # shard names (client.aio)

    @property
    def sharded(self) -> bool:
        raise NotImplementedError

    async def _ready(self) -> None:
        raise NotImplementedError

    async def _call(self, shard: str, method: str, url_path: str, **kw: Any) -> Any:
        raise NotImplementedError

    def list(self, topic: str | None = None, *, from_ms: int | datetime | None = None,
             to_ms: int | datetime | None = None, page_size: int = 100, body: bool = False,
             cursor: str | None = None) -> AsyncGenerator[PendingPage, None]:
        """Pending messages in due order, a page at a time: `async for page in c.list("orders"):`.

        `topic=None` lists every topic (the admin right). `from_ms`/`to_ms` bound the due time
        (inclusive; epoch ms or aware datetimes); `body=True` fetches bodies too; `cursor` resumes
        after an earlier page's `cursor`. With several shards their listings are merged in due
        order (pages then carry no cursor).
        """
        if not 1 <= page_size <= MAX_PAGE:
            raise ValueError(f"page_size must be in [1, {MAX_PAGE}]")
        url_path = "/v1/messages" if topic is None else path("topics", topic, "messages")
        query = {"from": None if from_ms is None else to_epoch_ms(from_ms, "from_ms"),
                 "to": None if to_ms is None else to_epoch_ms(to_ms, "to_ms"),
                 "limit": page_size, "body": "true" if body else None}
        if not self._targets:  # several URLs not asked yet: they may be one shard or several
            return self._after_discovery(url_path, query, page_size, cursor)
        if not self.sharded:
            return self._pages(self._targets[0], url_path, query, cursor)
        if cursor is not None:
            raise ValueError("a cursor resumes the listing of one broker, not a merge of several shards")
        return self._merged(url_path, query, page_size)

    async def _after_discovery(self, url_path: str, query: dict[str, Any], page_size: int, cursor: str | None
                               ) -> AsyncGenerator[PendingPage, None]:
        await self._ready()
        if self.sharded and cursor is not None:
            raise ValueError("a cursor resumes the listing of one broker, not a merge of several shards")
        pages = self._pages(self._targets[0], url_path, query, cursor) if not self.sharded \
            else self._merged(url_path, query, page_size)
        try:
            async for page in pages:
                yield page
        finally:
            await pages.aclose()

    async def _pages(self, url: str, url_path: str, query: dict[str, Any], cursor: str | None
                     ) -> AsyncGenerator[PendingPage, None]:
        while True:
            answer = await self._call(url, "GET", url_path, query={**query, "cursor": cursor})
            cursor = answer.get("next_cursor")
            page = PendingPage([PendingMessage.from_wire(m) for m in answer.get("messages") or []], cursor)
            if page.messages or cursor is None:  # an empty page with a cursor: the broker's work bound
                yield page
            if cursor is None:
                return

    async def _merged(self, url_path: str, query: dict[str, Any], page_size: int) -> AsyncGenerator[PendingPage, None]:
        """A k-way merge of every shard's listing: a message is handed out only while every shard
        that may still hold an earlier one has a page buffered."""
        shards = {u: self._pages(u, url_path, query, None) for u in self._targets}
        buffers: dict[str, collections.deque[PendingMessage]] = {u: collections.deque() for u in self._targets}
        live = set(self._targets)

        async def refill(u: str) -> None:
            try:
                buffers[u].extend((await anext(shards[u])).messages)
            except StopAsyncIteration:
                live.discard(u)

        try:
            while True:
                while any(not buffers[u] for u in live):
                    await asyncio.gather(*(refill(u) for u in sorted(live) if not buffers[u]))
                out: builtins.list[PendingMessage] = []
                while len(out) < page_size and any(buffers.values()):
                    u = min((u for u in self._targets if buffers[u]),
                            key=lambda u: (buffers[u][0].deliver_at, buffers[u][0].id))
                    out.append(buffers[u].popleft())
                    if not buffers[u] and u in live:
                        break  # its next page may hold something earlier than the others' heads
                if not out:
                    return
                yield PendingPage(out, None)
        finally:
            for gen in shards.values():
                await gen.aclose()


class SyncListing:
    """`Client.list`: the same pages, as a plain iterator."""

    aio: AsyncClient

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError

    def list(self, topic: str | None = None, *, from_ms: int | datetime | None = None,
             to_ms: int | datetime | None = None, page_size: int = 100, body: bool = False,
             cursor: str | None = None) -> Iterator[PendingPage]:
        """Like `AsyncClient.list`: `for page in c.list("orders"): ...`."""
        pages = self.aio.list(topic, from_ms=from_ms, to_ms=to_ms, page_size=page_size, body=body, cursor=cursor)

        async def step() -> PendingPage | None:
            try:
                return await anext(pages)
            except StopAsyncIteration:
                return None

        async def close() -> None:
            await pages.aclose()

        try:
            while (page := self._run(step())) is not None:
                yield page
        finally:
            self._run(close())
