"""Small helpers shared by the SDK tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from delayd.client import AsyncClient, Client, RetryPolicy

from tests.support.daemon import until as until  # (re-exported: the client tests' name for it)

# Retries in tests: same rules, tiny pauses, so a test of "503 then 200" takes milliseconds.
FAST_RETRY = RetryPolicy(attempts=4, base_delay_ms=5, max_delay_ms=20)


class Either:
    """Calls a method on an AsyncClient, or on a blocking Client in a worker thread, so one test body
    covers both clients."""

    def __init__(self, kind: str, url: Any, encoding: str = "msgpack", **options: Any) -> None:
        self.kind = kind
        cls = AsyncClient if kind == "async" else Client
        self.client: AsyncClient | Client = cls(url, encoding=encoding, retry=FAST_RETRY, **options)

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.client, method)
        if self.kind == "async":
            return await fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def close(self) -> None:
        if isinstance(self.client, AsyncClient):
            await self.client.close()
        else:
            await asyncio.to_thread(self.client.close)


async def until_async(predicate: Callable[[], Awaitable[Any]], timeout_s: float = 10.0,
                      what: str = "condition", interval_s: float = 0.02) -> Any:
    """Like `until` for a coroutine predicate (e.g. asking the broker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)
