"""A key is one key whichever way it comes: a msgpack produce body's keys reach the key index packed
(the batch core's Keys, no str a key, each found by its str's hash), a JSON body the reference
parser declines and a lookup by key bring a str. Produced one way, a key is a duplicate the other
way, with or without the key filter, before and after the index has written it and the daemon
has restarted; for ASCII keys and for those whose str is not their UTF-8 (Latin-1, CJK, astral,
a NUL)."""

from __future__ import annotations

import json
import time

import msgpack
import pytest
from delayd.broker.config import Config
from delayd.broker.service import Broker
from delayd.storage import keyindex
from delayd.storage.store import NewMessage

KEYS = ["order-7", "é-clé", "订单-1", "😀", "k\x00nul"]
HOUR = 3_600_000


async def by_core(broker: Broker, topic: str, keys: list[str]) -> list[dict]:
    raw = msgpack.packb({"messages": [{"body": b"x", "delay_ms": HOUR, "key": k} for k in keys]})
    answer = await broker.produce_raw(topic, raw, True)
    assert answer is not None, "the batch core declined the body"
    return json.loads(answer)["messages"]


async def by_reference(broker: Broker, topic: str, keys: list[str]) -> list[dict]:
    now = broker.clock.now_ms()
    got = await broker.produce([NewMessage(topic, b"x", now + HOUR, key=k) for k in keys])
    return [{"id": p.id, "deliver_at": p.deliver_at, "duplicate": p.duplicate} for p in got]


PATHS = {"batch core": by_core, "reference": by_reference}


@pytest.mark.parametrize("first", list(PATHS))
@pytest.mark.parametrize("with_filter", [True, False], ids=["filter", "no filter"])
async def test_a_key_produced_one_way_is_a_duplicate_the_other(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                               first: str, with_filter: bool) -> None:
    if not with_filter:  # (as at start-up before a build is done: every key is looked up)
        monkeypatch.setattr(keyindex.FilterBuild, "start", lambda self: None)
    other = next(p for p in PATHS if p != first)
    broker = Broker(Config(data_dir=str(tmp_path)))
    await broker.start()
    try:
        assert broker.store is not None
        if with_filter:
            deadline = time.monotonic() + 10
            while not broker.store.keys.filter_ready:
                assert time.monotonic() < deadline, "the key filter was never built"
                time.sleep(0.01)
        else:  # as at start-up while the build (never started here) is not done
            broker.store.keys._filter = None
        assert broker.store.keys.filter_ready == with_filter
        held = {}
        for k in KEYS:
            original = (await PATHS[first](broker, "t", [k]))[0]
            again = (await PATHS[other](broker, "t", [k]))[0]
            assert not original["duplicate"] and again == {**original, "duplicate": True}, k
            assert broker.id_for_key("t", k) == original["id"]
            held[k] = original
        for path in PATHS.values():  # a batch of all of them, and a new one: only the new one stored
            got = await path(broker, "t", [*KEYS, f"new-{first}-{path.__name__}"])
            assert got[:-1] == [{**held[k], "duplicate": True} for k in KEYS] and not got[-1]["duplicate"]
        assert (await by_core(broker, "other-topic", KEYS[:1]))[0]["duplicate"] is False
    finally:
        await broker.stop()  # (writes the keys)
    broker = Broker(Config(data_dir=str(tmp_path)))
    await broker.start()
    try:
        assert broker.store is not None
        deadline = time.monotonic() + 10
        while with_filter and not broker.store.keys.filter_ready:  # a filter built from the index's str keys
            assert time.monotonic() < deadline, "the key filter was never built"
            time.sleep(0.01)
        assert broker.store.keys.filter_ready == with_filter
        for path in PATHS.values():
            got = await path(broker, "t", KEYS)
            assert got == [{**held[k], "duplicate": True} for k in KEYS]
    finally:
        await broker.stop()
