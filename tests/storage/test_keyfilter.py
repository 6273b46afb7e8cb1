"""The key filter (storage/keyfilter.py): the compiled `filter_add`/`filter_add_json`/`filter_maybe`/
`filter_claim` against the Python reference, bit for bit, damaged input included; and the one promise lookups rely
on: a pair that was added is always a "maybe". `make asan` runs this file with AddressSanitizer."""

from __future__ import annotations

import json
import sqlite3
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
    assert c.filter_add(b_c, topic, keys, True) == ref.filter_add(b_ref, topic, keys, True)  # alone: a list as before
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


# A full filter's false maybes: 32 bits a key (SMALL_BITS_PER_KEY, within SMALL_FILTER_BYTES), then 8;
# enough keys asked that some are false (about 45 of a million at 32 bits a key).
@pytest.mark.parametrize("small_bytes, bits_per_key, asks, most", [(ref.SMALL_FILTER_BYTES, 32, 1_000_000, 0.0002),
                                                                     (0, 8, 100_000, 0.04)])
def test_an_empty_filter_holds_nothing_and_a_full_one_answers_only_a_few_false_maybes(
        monkeypatch: pytest.MonkeyPatch, small_bytes: int, bits_per_key: int, asks: int, most: float) -> None:
    monkeypatch.setattr(ref, "SMALL_FILTER_BYTES", small_bytes)
    f = KeyFilter(0)
    assert len(f.bits) * 8 == f.capacity * bits_per_key
    asked = [f"new-{i}" for i in range(asks)]
    assert f.maybe("t", asked) == []
    f.add("t", [f"old-{i}" for i in range(f.capacity)])
    assert f.full is False
    f.add("t", ["one more"])
    assert f.full is True
    false = len(f.maybe("t", asked))
    assert 0 < false < most * len(asked)  # PROBES 6: about 0.005% (32 bits a key) or 2.5% (8) at capacity
    others = [f"old-{i}" for i in range(f.capacity)]
    assert len(f.maybe("other", others)) < most * len(others)  # the topic is hashed too


def test_a_filter_has_32_bits_a_key_up_to_4_mib_then_4_mib_then_8_bits_a_key() -> None:
    mib = 8 << 20
    assert ref.filter_bits(1 << 19) == 16 << 20  # 2 MiB
    assert ref.filter_bits(1 << 20) == 4 * mib
    assert ref.filter_bits(2 << 20) == 4 * mib  # 16 bits a key
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


# Keys as the index holds them (text of any code point a produce accepts) and some it never holds:
# lone surrogates (only a JSON escape can carry one), and empty keys.
JSON_KEYS = st.lists(st.text(max_size=12) | st.sampled_from(["", "\ud800", "a\udfff", 'q"', "back\\", "\x00\x1f\x7f",
                                                                 "é", "𝄞", "\u2028"]), max_size=40)


def json_chunks(keys: list[str]) -> list[bytes]:
    """`keys` as JSON arrays the ways a chunk can be written: as SQLite's json_group_array writes
    them (what a build reads), and json.dumps's, escaped to ASCII or not, spaced or not."""
    out = [json.dumps(keys, ensure_ascii=a, separators=sep).encode("utf-8", "surrogatepass")
           for a in (True, False) for sep in ((",", ":"), (" ,\n", ":"))]
    out = [o for o in out if not any(0xD800 <= ord(ch) <= 0xDFFF for ch in o.decode("utf-8", "surrogatepass"))]
    if not any(0xD800 <= ord(ch) <= 0xDFFF for k in keys for ch in k):
        db = sqlite3.connect(":memory:")
        db.execute("CREATE TABLE t (k TEXT)")
        db.executemany("INSERT INTO t VALUES (?)", [(k,) for k in keys])
        if sqlite3.sqlite_version_info >= (3, 38):
            out.append(db.execute("SELECT CAST(json_group_array(k) AS BLOB) FROM t").fetchone()[0])
        db.close()
    return out


@settings(max_examples=200, deadline=None)
@given(blocks=st.integers(1, 6), topic=TOPICS, keys=JSON_KEYS)
def test_a_json_chunk_adds_its_keys_as_the_list_does_in_both(blocks: int, topic: str, keys: list[str]) -> None:
    """filter_add_json of a chunk sets the bits filter_add of its keys sets, for every way a chunk
    is written (ASCII keys hashed from their bytes, escaped and other keys made a str)."""
    listed = bytearray(blocks * BLOCK)
    ref.filter_add(listed, topic, keys)
    for chunk in json_chunks(keys):
        b_c, b_ref = bytearray(blocks * BLOCK), bytearray(blocks * BLOCK)
        last = keys[-1] if keys else None
        assert c.filter_add_json(b_c, topic, chunk) == ref.filter_add_json(b_ref, topic, chunk) == (len(keys), last)
        assert b_c == b_ref == listed


def test_a_build_sized_chunk_with_a_few_odd_keys_adds_every_key() -> None:
    keys = [f"order-{i:012d}" for i in range(20_000)]
    keys[7], keys[4_000], keys[19_999] = "é-key", 'quo"te', "tab\t"
    f = KeyFilter(len(keys))
    assert f.add_json("t", json.dumps(keys).encode()) == (len(keys), "tab\t") and f.added == len(keys)
    assert c.filter_maybe(f.bits, "t", keys) == keys
    listed = bytearray(len(f.bits))
    c.filter_add(listed, "t", keys)
    assert listed == f.bits


DAMAGED_CHUNKS = [b"", b" ", b"[", b"]", b'["a"', b'["a",]', b'[,"a"]', b"[1]", b"[null]", b'[["a"]]', b'{"a": 1}', b'"a"',
                  b'["a"]x', b'["a"]]', b'["a" "b"]', b'["\\x"]', b'["\\u12"]', b'["a\\"]', b'["\xff"]', b'["\x01"]',
                  b'["\xed\xa0\x80"]', b'["\xc3"]', b'\xef\xbb\xbf["a"]', b'["a"\x00]', b'["a",\n"b"\n']


@pytest.mark.parametrize("chunk", DAMAGED_CHUNKS)
def test_a_damaged_chunk_is_a_value_error_in_both_and_adds_nothing(chunk: bytes) -> None:
    for impl in (c, ref):
        bits = bytearray(2 * BLOCK)
        with pytest.raises(ValueError):
            impl.filter_add_json(bits, "t", chunk)
        assert bits == bytearray(2 * BLOCK)


@settings(max_examples=300, deadline=None)
@given(keys=JSON_KEYS.filter(bool), cut=st.integers(0, 10**6), flips=st.lists(st.tuples(st.integers(0, 10**6),
                                                                                            st.integers(0, 255)), max_size=3))
def test_a_chunk_cut_or_changed_is_answered_as_the_reference_does(keys: list[str], cut: int, flips: list[tuple[int, int]]) -> None:
    """Damaged input is an error, never a crash or a read past the chunk (`make asan`): a chunk cut
    short or with bytes changed adds what the reference adds, or fails as it does (ValueError)."""
    chunk = bytearray(json_chunks(keys)[0])
    for at, value in flips:
        chunk[at % len(chunk)] = value
    damaged = bytes(chunk[:cut % (len(chunk) + 1)])
    got = []
    for impl in (c, ref):
        bits = bytearray(2 * BLOCK)
        try:
            got.append((impl.filter_add_json(bits, "t", damaged), bits))
        except ValueError:
            got.append((None, bits))
    assert got[0] == got[1]


@pytest.mark.parametrize("bits, topic, chunk, error", [
    (b"\0" * 64, "t", b"[]", TypeError),  # not a bytearray
    (bytearray(0), "t", b"[]", ValueError),  # no block
    (bytearray(65), "t", b"[]", ValueError),  # a cut block
    (bytearray(64), b"t", b"[]", TypeError),  # topic not a str
    (bytearray(64), "t", "[]", TypeError),  # the chunk not bytes
    (bytearray(64), "t", bytearray(b"[]"), TypeError),
    (bytearray(64), "t", memoryview(b"[]"), TypeError),
])
def test_bad_arguments_to_add_json_fail_the_same_way_in_both(bits: Any, topic: Any, chunk: Any, error: type) -> None:
    for impl in (c, ref):
        with pytest.raises(error):
            impl.filter_add_json(bits, topic, chunk)
