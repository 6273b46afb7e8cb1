"""The checkpoint's writes run in a thread of their own, at a lower CPU priority than the event
loop's (broker.service CHECKPOINT_NICE), so that busy cores serve produce, release and pull first;
and a keyed flood's keys start the next checkpoint early (Broker._next_checkpoint)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import msgpack
import pytest
from delayd.broker.config import Config
from delayd.broker.service import CHECKPOINT_NICE, Broker


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's nice value is set by its id on Linux")
async def test_checkpoints_are_written_by_a_thread_of_lower_priority(tmp_path) -> None:
    broker = Broker(Config(data_dir=str(tmp_path), checkpoint_interval_ms=20))
    await broker.start()
    try:
        deadline = time.monotonic() + 10
        while broker._writing is None or not broker._writing.done():  # a checkpoint written
            assert time.monotonic() < deadline, "no checkpoint was written"
            await asyncio.sleep(0.01)
        writers = [t for t in threading.enumerate() if t.name.startswith("delayd-checkpoint")]
        assert len(writers) == 1 and writers[0].native_id is not None
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, writers[0].native_id) == min(19, own + CHECKPOINT_NICE)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own  # the event loop's is unchanged
    finally:
        await broker.stop()
    deadline = time.monotonic() + 10
    while any(t.name.startswith("delayd-checkpoint") for t in threading.enumerate()):  # the thread ends with the broker
        assert time.monotonic() < deadline, "the checkpoint thread outlived the broker"
        await asyncio.sleep(0.01)


def keyed_body(first: int, n: int) -> bytes:
    return msgpack.packb({"messages": [{"body": b"x", "delay_ms": 3_600_000, "key": f"k{i}"} for i in range(first, first + n)]})


async def test_a_keyed_flood_is_checkpointed_before_the_interval(tmp_path) -> None:
    """Once half of max_unwritten_keys keys wait to be written, the next checkpoint starts at once
    (not checkpoint_interval_ms later): a keyed flood's keys are written before produce is refused."""
    broker = Broker(Config(data_dir=str(tmp_path), checkpoint_interval_ms=600_000, max_unwritten_keys=1000))
    await broker.start()
    try:
        assert broker.store is not None
        await broker.produce_raw("t", keyed_body(0, 600), False)  # (over half once it is in)
        assert broker.store.keys.unwritten == 600
        await broker.produce_raw("t", keyed_body(600, 1), False)  # finds 600 waiting: checkpoint now
        deadline = time.monotonic() + 10
        while broker.store.keys.unwritten:
            assert time.monotonic() < deadline, "the keys were not written before the interval"
            await asyncio.sleep(0.01)
        assert broker.store.keys.count() == 601
    finally:
        await broker.stop()


async def test_a_failed_checkpoint_is_retried_after_the_interval_even_in_a_keyed_flood(tmp_path) -> None:
    interval_s = 0.3
    broker = Broker(Config(data_dir=str(tmp_path), checkpoint_interval_ms=int(interval_s * 1000), max_unwritten_keys=1000))
    await broker.start()
    tries = []

    def failing(pending: object) -> None:
        tries.append(time.monotonic())
        raise OSError("injected")

    try:
        assert broker.store is not None
        broker.store.finish_checkpoint = failing  # type: ignore[method-assign]
        await broker.produce_raw("t", keyed_body(0, 600), False)
        start = time.monotonic()
        deadline = start + 10
        for i in range(40):  # each of these finds over half of the bound waiting
            await broker.produce_raw("t", keyed_body(600 + i, 1), False)
            await asyncio.sleep(interval_s / 10)
        while len(tries) < 2:
            assert time.monotonic() < deadline, "the failed checkpoint was not retried"
            await asyncio.sleep(0.01)
        elapsed = time.monotonic() - start
        assert len(tries) <= 2 + elapsed / interval_s, (len(tries), elapsed)  # not one a produce
    finally:
        del broker.store.finish_checkpoint
        await broker.stop()
