"""A replicated member switches its pipeline in place (broker.replication: primary ↔ follower).
What the old pipeline had taken out of the wheel and not yet released (loaded `lookahead_ms`
early, or held by dequeue-put until due) must still be released once the member is primary
again — also when no other primary released it meanwhile (a primary demoted and re-elected)."""

from __future__ import annotations

from delayd.broker.config import Config
from delayd.broker.service import Broker
from delayd.storage.msgtable import MessageState
from delayd.storage.store import NewMessage

from tests.support.daemon import until


async def test_units_held_by_a_replaced_pipeline_are_released_by_the_next(tmp_path) -> None:
    broker = Broker(Config(data_dir=str(tmp_path), lookahead_ms=2000, fsync="never"))
    await broker.start()
    try:
        store = broker.store
        assert store is not None and broker.pipeline is not None
        now = broker.clock.now_ms()
        produced = await broker.produce([NewMessage("t", b"m%d" % i, now + 1500 + 10 * i) for i in range(20)])
        seqs = [broker.parse_id(p.id) for p in produced]
        # Loaded ahead of time: the wheel's cursor passed their slots, dequeue-put holds them.
        await until(lambda: broker.pipeline.dequeue_put.holding == 20, 5, "the 20 loaded ahead")
        assert all(store.state(s)[0] == MessageState.SCHEDULED for s in seqs)
        await broker.switch_role(follower=True)  # demoted: this member releases nothing now
        await broker.switch_role(follower=False)  # elected again, nobody released them meanwhile
        await until(lambda: all(store.state(s)[0] == MessageState.DELIVERED for s in seqs), 10,
                    "every message held by the replaced pipeline released")
        assert store.ready.end("t") == 20, "each released once"
    finally:
        await broker.stop()
