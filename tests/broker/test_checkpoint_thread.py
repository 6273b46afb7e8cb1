"""The checkpoint's writes run in a thread of their own, at a lower CPU priority than the event
loop's (broker.service CHECKPOINT_NICE), so that busy cores serve produce, release and pull first."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

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
