"""The key filter (storage/keyfilter.py): the compiled `filter_add`/`filter_maybe`/`filter_claim`
against the Python reference, bit for bit, damaged input included; and the one promise lookups rely
on: a pair that was added is always a "maybe". `make asan` runs this file with AddressSanitizer."""

from __future__ import annotations

from typing import Any

import pytest
from delayd.storage import keyfilter as ref
from delayd.storage.keyfilter import BLOCK, KeyFilter
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.shrinking import refill

c = pytest.importorskip("delayd.storage._batch", reason="the compiled batch core is built by pip install")

TOPICS = st.sampled_from(["t", "orders", "ü-topic", ""])
KEYS = st.lists(st.none() | st.text(max_size=12) | st.integers(-2**70, 2**70), max_size=40)


@settings(max_examples=200, deadline=None)
@given(blocks=st.integers(1, 6), seed=st.binary(min_size=0, max_size=64), topic=TOPICS, keys=KEYS,
       asked=KEYS)
def test_compiled_add_and_maybe_match_the_reference(blocks: int, seed: bytes, topic: str, keys: list[Any],
                                                      asked: list[Any]) -> None:
    start = bytearray((seed * (blocks * BLOCK))[:blocks * BLOCK]) if seed else bytearray(blocks * BLOCK)
    b_c, b_ref = bytearray(start), bytearray(start)
    assert c.filter_add(b_c, topic, keys) == ref.filter_add(b_ref, topic, keys) == sum(k is not None for k in keys)
    assert b_c == b_ref
    assert c.filter_maybe(b_c, topic, asked) == ref.filter_maybe(b_ref, topic, asked)
    # what was added is always a "maybe", in order, None left out
    assert c.filter_maybe(b_c, topic, keys) == [k for k in keys if k is not None]
    assert c.filter_add(b_c, topic, tuple(keys)) == ref.filter_add(b_ref, topic, tuple(keys))
    assert b_c == b_ref


@settings(max_examples=200, deadline=None)
@given(blocks=st.integers(1, 6), seed=st.binary(min_size=0, max_size=64), topic=TOPICS, keys=KEYS)
def test_a_claim_is_a_maybe_then_an_add_key_by_key_in_both(blocks: int, seed: bytes, topic: str,
                                                            keys: list[Any]) -> None:
    start = bytearray((seed * (blocks * BLOCK))[:blocks * BLOCK]) if seed else bytearray(blocks * BLOCK)
    b_c, b_ref, b_steps = bytearray(start), bytearray(start), bytearray(start)
    steps: list[Any] = []
    for k in keys:  # what a claim means: each key asked, then added, in order
        steps += ref.filter_maybe(b_steps, topic, [k])
        ref.filter_add(b_steps, topic, [k])
    named = sum(k is not None for k in keys)
    assert c.filter_claim(b_c, topic, keys) == ref.filter_claim(b_ref, topic, keys) == (steps, named)
    assert b_c == b_ref == b_steps
    assert c.filter_claim(b_c, topic, tuple(keys)) == ([k for k in keys if k is not None], named)


# A full filter's false maybes: 16 bits a key (SMALL_BITS_PER_KEY, within SMALL_FILTER_BYTES), then 8.
@pytest.mark.parametrize("small_bytes, bits_per_key, most", [(ref.SMALL_FILTER_BYTES, 16, 0.004), (0, 8, 0.04)])
def test_an_empty_filter_holds_nothing_and_a_full_one_answers_only_a_few_false_maybes(
        monkeypatch: pytest.MonkeyPatch, small_bytes: int, bits_per_key: int, most: float) -> None:
    monkeypatch.setattr(ref, "SMALL_FILTER_BYTES", small_bytes)
    f = KeyFilter(0)
    assert len(f.bits) * 8 == f.capacity * bits_per_key
    asked = [f"new-{i}" for i in range(100_000)]
    assert f.maybe("t", asked) == []
    f.add("t", [f"old-{i}" for i in range(f.capacity)])
    assert f.full is False
    f.add("t", ["one more"])
    assert f.full is True
    false = len(f.maybe("t", asked))
    assert 0 < false < most * len(asked)  # PROBES 6: about 0.1% (16 bits a key) or 2.5% (8) at capacity
    assert len(f.maybe("other", [f"old-{i}" for i in range(20_000)])) < most * 20_000  # the topic is hashed too


def test_a_filter_has_16_bits_a_key_up_to_4_mib_then_4_mib_then_8_bits_a_key() -> None:
    mib = 8 << 20
    assert ref.filter_bits(1 << 20) == 16 << 20  # 2 MiB
    assert ref.filter_bits(2 << 20) == 4 * mib
    assert ref.filter_bits(3 << 20) == 4 * mib  # 10.7 bits a key
    assert ref.filter_bits(4 << 20) == 4 * mib
    assert ref.filter_bits(10 << 20) == 10 * mib  # 8 bits a key
    assert len(KeyFilter(3 << 20).bits) == 4 << 20


@pytest.mark.parametrize("bits, topic, keys, error", [
    (b"\0" * 64, "t", ["k"], TypeError),  # not a bytearray
    (memoryview(bytearray(64)), "t", ["k"], TypeError),
    (bytearray(0), "t", ["k"], ValueError),  # no block
    (bytearray(65), "t", ["k"], ValueError),  # a cut block
    (bytearray(64), b"t", ["k"], TypeError),  # topic not a str
    (bytearray(64), "t", "k", TypeError),  # keys not a list or tuple
    (bytearray(64), "t", iter(["k"]), TypeError),
    (bytearray(64), "t", ["k", ["unhashable"]], TypeError),
])
def test_damaged_input_fails_the_same_way_in_both(bits: Any, topic: Any, keys: Any, error: type) -> None:
    for name in ("filter_add", "filter_maybe", "filter_claim"):
        for impl in (c, ref):
            with pytest.raises(error):
                getattr(impl, name)(bits, topic, keys)


def test_a_key_whose_hash_changes_the_list_is_not_read_past_its_end() -> None:
    keys: list[Any] = []
    for impl in (c, ref):
        bits = bytearray(64)
        impl.filter_add(bits, "t", refill(keys))  # must not read the items that are gone
        assert len(impl.filter_maybe(bits, "t", refill(keys))) <= 1
        assert impl.filter_claim(bits, "t", refill(keys))[1] == 1


@pytest.mark.parametrize("name", ["filter_add", "filter_claim"])
def test_the_keys_before_an_unhashable_one_are_added_as_in_the_reference(name: str) -> None:
    """The compiled filter hashes keys in groups before it sets their bits: a key that cannot be
    hashed, in the middle of a group, still leaves the keys before it added, as the reference does."""
    for at in (0, 5, 16, 21, 40):
        keys: list[Any] = [f"k{i}" for i in range(40)]
        keys.insert(at, ["unhashable"])
        b_c, b_ref = bytearray(4 * BLOCK), bytearray(4 * BLOCK)
        for impl, bits in ((c, b_c), (ref, b_ref)):
            with pytest.raises(TypeError):
                getattr(impl, name)(bits, "t", keys)
        assert b_c == b_ref
        assert c.filter_maybe(b_c, "t", keys[:at]) == keys[:at]
