"""Consistent hash ring: stable, balanced, and adding a shard moves about 1/N of the keys."""

from __future__ import annotations

from collections import Counter

import pytest
from delayd.client.ring import HashRing, hash64, routing_key
from hypothesis import given
from hypothesis import strategies as st

KEYS = [f"order-{i}" for i in range(10_000)]
HASH_ORDER_1 = 0x889DA2707C9B6189


def placement(ring: HashRing) -> dict[str, str]:
    return {k: ring.owner_of("orders", k) for k in KEYS}


def test_placement_is_fixed_across_processes_and_versions() -> None:
    # BLAKE2b, not hash(): these values must never change, or keys would move on upgrade.
    assert hash64(routing_key("orders", "order-1")) == HASH_ORDER_1
    ring = HashRing(["s0", "s1", "s2"])
    again = HashRing(["s2", "s0", "s1"])  # order of adds is irrelevant
    assert placement(ring) == placement(again)


def test_keys_spread_evenly() -> None:
    counts = Counter(placement(HashRing(["s0", "s1", "s2"])).values())
    assert set(counts) == {"s0", "s1", "s2"}
    for n in counts.values():
        assert abs(n / len(KEYS) - 1 / 3) < 0.07


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_adding_a_shard_moves_about_one_over_n(n: int) -> None:
    old = HashRing([f"s{i}" for i in range(n)])
    before = placement(old)
    new = HashRing([f"s{i}" for i in range(n + 1)])
    after = placement(new)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == f"s{n}" for k in moved)  # keys only move to the new shard
    assert abs(len(moved) / len(KEYS) - 1 / (n + 1)) < 0.08


def test_remove_restores_previous_placement() -> None:
    ring = HashRing(["s0", "s1", "s2"])
    before = placement(ring)
    ring.add("s3")
    ring.remove("s3")
    assert placement(ring) == before and ring.nodes == {"s0", "s1", "s2"}
    with pytest.raises(LookupError):
        HashRing().owner(b"x")


@given(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8), st.text(max_size=8))
def test_routing_key_is_unambiguous(t1: str, k1: str, t2: str, k2: str) -> None:
    if "\x00" in t1 + t2:
        return  # topic names cannot hold NUL
    assert (routing_key(t1, k1) == routing_key(t2, k2)) == ((t1, k1) == (t2, k2))
