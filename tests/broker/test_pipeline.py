"""Pipeline building blocks: bounded links (flow control, no loss) and in-flight tracking."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from delayd.broker.pipeline import InFlight, Link


async def test_link_put_waits_while_full_and_loses_nothing():
    link: Link[list[int]] = Link("x", capacity_batches=2)
    await link.put([1, 2])
    await link.put([3])
    assert link.items == 3 and len(link) == 2
    third = asyncio.create_task(link.put([4]))
    await asyncio.sleep(0)
    assert not third.done(), "a full link makes the producer wait"
    assert await link.get() == [1, 2]
    await asyncio.wait_for(third, 1)
    got = [await link.get(), await link.get()]
    assert got == [[3], [4]] and link.items == 0


async def test_link_wait_times_out_without_taking_an_item():
    link: Link[list[str]] = Link("x", capacity_batches=1)
    await link.wait(0.01)
    assert link.get_nowait() is None
    waiter = asyncio.create_task(link.wait(5))
    await asyncio.sleep(0)
    await link.put(["a"])
    await asyncio.wait_for(waiter, 1)
    assert link.get_nowait() == ["a"], "waiting never consumes"


def test_inflight_read_time_is_the_oldest_open_slot():
    store = SimpleNamespace(load_time_ms=5000)
    f = InFlight(store)  # type: ignore[arg-type]
    assert f.read_time() == 5000, "nothing in flight: everything before the next slot is done"
    f.add(3000, 1)  # a walk holds its slot open
    f.add(4000, 2)
    assert f.read_time() == 3000
    f.done(3000)
    assert f.read_time() == 4000
    f.done(4000, 2)
    assert f.read_time() == 5000 and f.count == 0
