"""A produce refused for room (an index behind: errors.Backpressure, nothing stored) waits up to
`backpressure_wait_ms` for the writes that make room, trying again (Broker._with_room), and is
answered 429 only after that: a flood's produce goes on once a checkpoint has written its keys,
instead of its client waiting out a Retry-After second."""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest
from delayd.broker import errors
from delayd.broker.config import Config
from delayd.broker.service import Broker
from delayd.storage.store import NewMessage


def keyed_body(first: int, n: int) -> bytes:
    return msgpack.packb({"messages": [{"body": b"x", "delay_ms": 3_600_000, "key": f"k{i}"} for i in range(first, first + n)]})


async def over_the_bound(tmp_path, wait_ms: int) -> Broker:
    """A broker whose key index is behind: 1,500 keys unwritten, the bound 1,000, no checkpoint
    coming (the interval is ten minutes, and one batch went past the bound in one go)."""
    broker = Broker(Config(data_dir=str(tmp_path), checkpoint_interval_ms=600_000, max_unwritten_keys=1000,
                           backpressure_wait_ms=wait_ms))
    await broker.start()
    await broker.produce_raw("t", keyed_body(0, 1500), False)
    assert broker.store is not None and broker.store.keys.unwritten == 1500
    return broker


@pytest.mark.parametrize("raw", [True, False], ids=["batch core", "reference"])
async def test_a_refused_produce_waits_for_room_and_then_goes_on(tmp_path, raw: bool) -> None:
    broker = await over_the_bound(tmp_path, 30_000)
    try:
        assert broker.store is not None
        now, seq = broker.clock.now_ms(), broker.store.next_seq
        if raw:
            task = asyncio.ensure_future(broker.produce_raw("t", keyed_body(1500, 1), False))
        else:
            task = asyncio.ensure_future(broker.produce([NewMessage("t", b"x", now + 3_600_000, key="k1500")]))
        await asyncio.sleep(0.3)  # (tried again six times meanwhile)
        assert not task.done(), "refused at once"
        assert broker.store.next_seq == seq  # nothing of it stored while it waits
        broker._keys_waiting.set()  # a checkpoint now: it writes the keys, and the produce goes on
        answer = await asyncio.wait_for(task, 10)
        assert answer
        assert broker.store.next_seq == seq + 1
        assert broker.store.key_holders("t", ["k1500"])["k1500"][0] == seq
    finally:
        await broker.stop()


@pytest.mark.parametrize("wait_ms", [0, 200])
async def test_a_produce_still_refused_after_backpressure_wait_ms_is_answered_429(tmp_path, wait_ms: int) -> None:
    broker = await over_the_bound(tmp_path, wait_ms)
    try:
        assert broker.store is not None
        seq, start = broker.store.next_seq, time.monotonic()
        with pytest.raises(errors.Backpressure):
            await broker.produce_raw("t", keyed_body(1500, 1), False)
        assert time.monotonic() - start >= wait_ms / 1000 - 0.06  # (tries every 50 ms until the next would be late)
        assert broker.store.next_seq == seq  # nothing stored
        assert await broker.produce_raw("t", msgpack.packb({"messages": [{"body": b"x"}]}), False)  # keyless goes on
    finally:
        await broker.stop()
