"""Fixtures for the SDK tests: in-memory fake brokers (no daemon) and real daemons."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.client.fakebroker import FakeBroker


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker("d").start()
    yield broker
    broker.stop()


@pytest.fixture
def fakes() -> Iterator[list[FakeBroker]]:
    brokers = [FakeBroker(f"s{i}").start() for i in range(3)]
    yield brokers
    for b in brokers:
        b.stop()


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    """Fail if the test leaves a thread behind that was not there before (fake brokers excepted)."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()
            and not t.name.startswith(("fake-", "asyncio_", "ThreadPoolExecutor"))]
    assert not left, f"threads leaked: {left}"
