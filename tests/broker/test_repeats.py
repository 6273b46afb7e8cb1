"""broker.service `repeats`: whether a produce batch repeats a key, asked of only the keys a claim
could not rule out when there are few of them (KeyIndex.claim_many), of the whole batch otherwise;
a produce's keys as the batch core packs them (Keys) are asked as the list they are."""

from __future__ import annotations

import pytest
from delayd.broker.service import REPEAT_COUNTS, repeats
from hypothesis import given
from hypothesis import strategies as st

KEYS = st.lists(st.sampled_from([f"k{i}" for i in range(15)]), max_size=30)


@given(named=KEYS, extra=st.lists(st.sampled_from([f"k{i}" for i in range(15)]), max_size=12))
def test_the_answer_is_the_whole_batch_s_when_every_repeated_key_is_a_maybe(named: list[str], extra: list[str]) -> None:
    """`maybe` holds every key that repeats (what a claim promises), and any others: few or many."""
    maybe = [k for k in named if named.count(k) > 1] + extra
    assert repeats(named, maybe) == repeats(named, None) == (len(set(named)) != len(named))


@pytest.mark.parametrize("maybe", [["a"], ["a", "b"], ["z"] * (REPEAT_COUNTS + 1) + ["a"]])
def test_a_repeat_among_the_maybes_is_found_however_many_they_are(maybe: list[str]) -> None:
    assert repeats(["x", "a", "y", "a"], maybe)
    assert not repeats(["x", "a", "y"], maybe)


@given(named=KEYS, extra=st.lists(st.sampled_from([f"k{i}" for i in range(15)]), max_size=12))
def test_packed_keys_answer_as_their_list(named: list[str], extra: list[str]) -> None:
    packed = pytest.importorskip("delayd.storage._batch", reason="the compiled batch core is built by pip install").Keys(named)
    maybe = [k for k in named if named.count(k) > 1] + extra
    for m in (maybe, None, maybe[:REPEAT_COUNTS]):
        if m is maybe[:REPEAT_COUNTS] and len(maybe) > REPEAT_COUNTS:
            continue  # (a claim's maybes hold every key that repeats)
        assert repeats(packed, m) == repeats(named, m) == (len(set(named)) != len(named))
