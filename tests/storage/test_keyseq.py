"""Keys (storage/batch_keyseq.c): a produce batch's keys packed, what the batch core's
encode_produce and encode_produce_raw give instead of a list of str or None. To Python it is that
list (len, items, iteration, count, ==); to the key filter, the overlay and the key index's
write it gives the same bits, tables, order and rows as the list, key for key, since a key's hash
is its str's: a key produced through the batch core and one asked as a str are one key."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from delayd.storage import keyfilter, overlay
from hypothesis import given, settings
from hypothesis import strategies as st

c = pytest.importorskip("delayd.storage._batch", reason="the compiled batch core is built by pip install")

# ASCII, Latin-1, CJK and astral keys, NULs and quotes (the JSON rows), a few that repeat.
KEY = st.sampled_from(["k1", "k2", "order-7", "é", "clé-1", "订单", "😀", "a\x00b", 'q"\\']) | st.text(min_size=1, max_size=12)
KEYS = st.lists(st.none() | KEY, max_size=40)
TOPICS = st.sampled_from(["t", "orders", "é"])


@settings(max_examples=200, deadline=None)
@given(keys=KEYS, probe=KEY)
def test_keys_are_the_list_they_pack(keys: list[str | None], probe: str) -> None:
    k = c.Keys(keys)
    assert len(k) == len(keys) and list(k) == keys and [k[i] for i in range(-len(keys), len(keys))] == keys * 2
    assert k == keys and keys == k and k == tuple(keys) and k == c.Keys(keys) and not k != keys
    assert k.named == len(keys) - keys.count(None)
    named = [x for x in keys if x is not None]
    assert k.repeats() == (len(set(named)) != len(named)) == c.Keys(named).repeats()
    for x in (None, probe, *keys, 7, b"k1", "\udc80"):
        assert k.count(x) == keys.count(x)
    if keys:
        assert k != keys[:-1] and k != [*keys, None]
        assert (k == [*keys[:-1], "other"]) == (keys[-1] == "other")
        assert (k == c.Keys(keys[::-1])) == (keys == keys[::-1])
    with pytest.raises(IndexError):
        k[len(keys)]
    with pytest.raises(TypeError):
        hash(k)


def test_what_cannot_be_packed_is_refused() -> None:
    with pytest.raises(TypeError):
        c.Keys(["a", 1])
    with pytest.raises(TypeError):
        c.Keys([b"a"])
    with pytest.raises(UnicodeEncodeError):
        c.Keys(["a", "\udc80"])  # a lone surrogate has no UTF-8, as no produced key
    with pytest.raises(TypeError):
        c.Keys(5)
    assert c.Keys([]) == [] and c.Keys(iter(["a", None])) == ["a", None]


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.tuples(TOPICS, KEYS), min_size=1, max_size=5), asked=st.lists(KEY, max_size=20),
       nblocks=st.integers(1, 8))
def test_the_filter_gives_the_same_bits_and_answers_for_keys_and_their_list(batches: list[tuple[str, list[str | None]]],
                                                                          asked: list[str], nblocks: int) -> None:
    bits = {kind: bytearray(keyfilter.BLOCK * nblocks) for kind in ("list", "keys", "ref", "alone")}
    for topic, keys in batches:
        packed = c.Keys(keys)
        want = keyfilter.filter_claim(bits["ref"], topic, keys)
        assert c.filter_claim(bits["list"], topic, keys) == want
        assert c.filter_claim(bits["keys"], topic, packed) == want
        assert c.filter_add(bits["alone"], topic, packed, True) == want[1]  # (without the GIL: a build's own filter)
        assert bits["keys"] == bits["list"] == bits["ref"] == bits["alone"]
        assert c.filter_add(bits["keys"], topic, packed) == c.filter_add(bits["list"], topic, keys) == \
            c.filter_add(bits["alone"], topic, packed, True) == keyfilter.filter_add(bits["ref"], topic, keys, True)
        assert bits["keys"] == bits["list"] == bits["ref"] == bits["alone"]
        assert c.filter_maybe(bits["keys"], topic, packed) == c.filter_maybe(bits["list"], topic, keys) == \
            keyfilter.filter_maybe(bits["list"], topic, keys)
        bits["ref"][:] = bits["list"]
    for topic, _ in batches:  # asked as str, as a lookup asks: the packed keys are found
        assert c.filter_maybe(bits["keys"], topic, asked) == c.filter_maybe(bits["list"], topic, asked)
        assert c.filter_maybe(bits["keys"], topic, c.Keys(asked)) == c.filter_maybe(bits["list"], topic, asked)


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.tuples(TOPICS, KEYS), min_size=1, max_size=6), slots=st.integers(1, 6))
def test_the_overlay_gives_the_same_tables_and_hits_for_keys_and_their_list(batches: list[tuple[str, list[str | None]]],
                                                                           slots: int) -> None:
    tables = {kind: [overlay.new_table(1 << slots)] for kind in ("list", "keys")}
    for entry, (topic, keys) in enumerate(batches):
        for kind, ks in (("list", keys), ("keys", c.Keys(keys))):
            start = 0
            while (start := c.overlay_put(tables[kind][-1], topic, ks, entry, start)) < len(keys):
                tables[kind].append(overlay.new_table(1 << slots))
        assert tables["keys"] == tables["list"]
    for topic, keys in batches:
        named = [k for k in keys if k is not None]
        for table in tables["list"]:
            want = c.overlay_find(table, topic, named)
            assert c.overlay_find(table, topic, c.Keys(named)) == want == overlay.overlay_find(table, topic, named)


def test_an_overlay_answers_a_packed_entry_s_keys_asked_as_str() -> None:
    if overlay.ops is not c:  # (the reference's keys are lists: its produce makes no Keys)
        pytest.skip("DELAYD_PURE=1: the overlay's tables are the reference's")
    ov = overlay.Overlay()
    ov.put(overlay.Run("t", c.Keys(["a", None, "é", "订单"]), 10, array("q", [1, 2, 3, 4])))
    ov.put(overlay.Run("u", ["a"], 20, array("q", [5])))
    assert ov.find("t", ["a", "é", "订单", "b"]) == {"a": (10, 1), "é": (12, 3), "订单": (13, 4)}
    assert ov.find("u", ["a"]) == {"a": (20, 5)}
    assert ov.keys() == [("t", ["a", None, "é", "订单"]), ("u", ["a"])]


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(st.tuples(TOPICS, KEYS), min_size=1, max_size=6), packed=st.lists(st.booleans(), min_size=6, max_size=6))
def test_the_index_s_write_order_and_rows_are_the_same_for_keys_and_their_list(runs: list[tuple[str, list[str | None]]],
                                                                             packed: list[bool]) -> None:
    seq, as_lists, mixed = 1, [], []
    for i, (topic, keys) in enumerate(runs):
        as_lists.append((topic, keys, seq, None))
        mixed.append((topic, c.Keys(keys) if packed[i] else keys, seq, None))
        seq += len(keys)
    assert c.key_order(mixed) == c.key_order(as_lists)
    order, text, bounds = want = c.key_order(as_lists, True)
    assert c.key_order(mixed, True) == want
    dues = array("q", range(seq - 1)).tobytes()
    got: Any = c.key_rows_json(mixed, order, dues, 3, text, bounds)
    assert got == c.key_rows_json(as_lists, order, dues, 3, text, bounds)


def test_the_batch_core_gives_keys_packed_and_none_without_keys() -> None:
    limits = (1 << 20, 3650 * 86_400_000, 128, 255, 256, 64, 8192)
    items = [{"body": b"a", "key": "é-1"}, {"body": b"b"}, {"body": b"c", "key": "k"}]
    got = c.encode_produce(items, b"t", 1, 1, limits, None)
    assert isinstance(got[3], c.Keys) and got[3] == ["é-1", None, "k"] and got[3].named == 2
    assert c.encode_produce([{"body": b"a"}], b"t", 1, 1, limits, None)[3] is None
