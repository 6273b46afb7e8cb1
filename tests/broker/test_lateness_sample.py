"""The daemon's lateness sample (`GET /v1/stats` `lateness_ms`): the last LATENESS_SAMPLE released
messages, kept as the batch core's packed chunks, one per release batch."""

from __future__ import annotations

import random

from delayd.broker.config import Config
from delayd.broker.service import LATENESS_SAMPLE, Broker
from delayd.storage.dispatch import Released
from delayd.storage.readyqueue import UNIT


class Topics:
    def __init__(self) -> None:
        self.woken: list[str] = []

    def notify(self, topic: str) -> None:
        self.woken.append(topic)


def units(lateness: list[int], now: int) -> bytes:
    # (commit_offset, size, tag_hash, deliver_at, released_at, seq)
    return b"".join(UNIT.pack(0, 10, 0, now - ms, now, k) for k, ms in enumerate(lateness))


def test_the_sample_is_the_last_released_messages_whatever_the_batch_sizes(tmp_path) -> None:
    broker = Broker(Config(data_dir=str(tmp_path)))
    broker.groups = Topics()  # type: ignore[assignment]
    assert broker.lateness_summary() == {"p50": 0, "p99": 0, "max": 0}
    rng = random.Random(7)
    everything: list[int] = []
    now = 1_000_000
    for size in [1, 5_000, 3, 12_000, 700, 4_096, 1, 9_999, 2, 2]:
        late = [rng.randrange(0, 500) for _ in range(size)]
        split = rng.randrange(size + 1)  # two topics in one release batch
        released = Released([("a", 0, units(late[:split], now)), ("b", 0, units(late[split:], now))], size)
        broker._on_release(released, now)
        everything += late
        xs = sorted(everything[-LATENESS_SAMPLE:])
        assert broker.lateness_summary() == {"p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))],
                                             "max": xs[-1]}
        held = sum(len(c) for c in broker.lateness) // 8
        assert held - len(broker.lateness[0]) // 8 < LATENESS_SAMPLE  # older chunks than needed went
    assert broker.groups.woken[-2:] == ["a", "b"]  # type: ignore[attr-defined]
