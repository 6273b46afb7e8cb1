"""The key index's write order and rows (storage/keyindex.py `key_order`, `key_rows_json`): the
compiled functions against the Python references, byte for byte, damaged input included; and
what `apply` relies on: the order is SQLite's (topic, key) order and keeps the given order of one
pair's keys, and the JSON rows put into SQLite are the rows bound one by one would be. `make asan`
runs this file with AddressSanitizer."""

from __future__ import annotations

import json
import sqlite3
from array import array
from typing import Any

import pytest
from delayd.storage import keyindex as ref
from hypothesis import given, settings
from hypothesis import strategies as st

c = pytest.importorskip("delayd.storage._batch", reason="the compiled batch core is built by pip install")

TOPICS = st.sampled_from(["t", "orders", "ü-topic", "", "t2"])
TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=8)  # (SQLite takes no lone surrogates)
KEYS = st.lists(st.none() | st.sampled_from(["k", "k0", "K", "é", "€", "𝄞"]) | TEXT, max_size=12)
RUNS = st.lists(st.tuples(TOPICS, KEYS | KEYS.map(tuple), st.integers(0, 10)), max_size=8)


def outcome(f: Any, *args: Any) -> Any:
    try:
        return ("ok", f(*args))
    except Exception as e:  # noqa: BLE001 - the kind of failure is what is compared
        return ("error", type(e))


@settings(max_examples=300, deadline=None)
@given(runs=RUNS)
def test_compiled_order_matches_the_reference_and_sqlite(runs: list[tuple[str, Any, int]]) -> None:
    got = c.key_order(runs)
    assert got == ref.key_order(runs)
    assert c.key_order(runs, True) == ref.key_order(runs, True)
    codes = list(array("Q", got))
    flat = [(topic, k) for topic, ks, _ in runs for k in ks]
    keys = [flat[code] for code in codes]
    # with `text`: the same order, and the keys' UTF-8 in it, each between its bounds
    order, text, bounds = c.key_order(runs, True)
    assert order == got
    assert text == b"".join(k.encode() for _, k in keys)
    assert list(array("Q", bounds)) == [len(b"".join(k.encode() for _, k in keys[:i])) for i in range(len(keys) + 1)]
    # every key once, None left out
    assert sorted(codes) == [i for i, (_, k) in enumerate(flat) if k is not None]
    # SQLite's own order of the primary key, and one pair's keys in their given order
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE k (topic TEXT, key TEXT, n INTEGER, PRIMARY KEY (topic, key, n)) WITHOUT ROWID")
    db.executemany("INSERT INTO k VALUES (?, ?, ?)", [(t, k, n) for n, (t, k) in enumerate(keys)])
    assert [n for (n,) in db.execute("SELECT n FROM k ORDER BY topic, key")] == list(range(len(keys)))
    for j in range(len(codes) - 1):
        if keys[j] == keys[j + 1]:
            assert codes[j] < codes[j + 1]


# Suffixes the compiled sort tells apart by their first 8 bytes past the prefix every key shares,
# or not: ends within those 8, NULs where the padding is, equal first 8 and a difference after.
SUFFIX = st.lists(st.sampled_from(["", "\x00", "a", "a\x00", "a\x00\x00", "ab", "é", "\x7f", "12345678", "123456789",
                                   "12345678\x00", "123456780", "zzzzzzzz"]), max_size=4).map("".join)


@settings(max_examples=300, deadline=None)
@given(shared=st.sampled_from(["", "k", "order-2026-11-", "\x00\x00", "é" * 5]),
       runs=st.lists(st.tuples(TOPICS, st.lists(st.none() | SUFFIX, max_size=30), st.just(0)), max_size=4))
def test_keys_sharing_a_prefix_sort_as_in_the_reference(shared: str, runs: list[tuple[str, Any, int]]) -> None:
    runs = [(t, [None if k is None else shared + k for k in ks], n) for t, ks, n in runs]
    assert c.key_order(runs) == ref.key_order(runs)
    assert c.key_order(runs, True) == ref.key_order(runs, True)


@pytest.mark.parametrize("runs", [
    ("t", ["k"]),  # not a list
    [["t", ["k"]]],  # a run that is not a tuple
    [("t",)],  # no keys
    [(b"t", ["k"])],  # topic not a str
    [("t", "k")],  # keys a str
    [("t", {"k"})],  # keys a set
    [("t", ["k", 5])],  # a key that is neither str nor None
    [("t", ["k", b"k"])],
    [("t", ["\ud800"])],  # not encodable
    [("\udfff", ["k"])],
    [("t", ["a"]), None],
])
@pytest.mark.parametrize("text", [False, True])
def test_damaged_input_is_the_same_error_in_both(runs: Any, text: bool) -> None:
    got = outcome(c.key_order, runs, text)
    assert got == outcome(ref.key_order, runs, text)
    assert got[0] == "error"


# Keys json.dumps escapes, and the NUL that SQLite's JSON functions cut a string at.
ODD = st.sampled_from(["a\x00b", "\x00", 'q"', "back\\", "\n\t\r\b\f", "\x01\x1f\x7f", "\u2028", "é", "𝄞"])
ROW_KEYS = st.lists(st.none() | ODD | st.sampled_from(["k", "k0", "K"]) | TEXT.filter(bool), max_size=12)
ROW_RUNS = st.lists(st.tuples(TOPICS, ROW_KEYS | ROW_KEYS.map(tuple), st.integers(0, 2**40)), max_size=8)
I64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=300, deadline=None)
@given(runs=ROW_RUNS, data=st.data(), limit=st.integers(1, 5), stretch=st.integers(1, 7))
def test_compiled_rows_match_the_reference_and_sqlite_stores_them(runs: list[tuple[str, Any, int]],
                                                                    data: st.DataObject, limit: int, stretch: int) -> None:
    n = sum(len(keys) for _, keys, _ in runs)
    dues = array("q", data.draw(st.lists(I64, min_size=n, max_size=n)))
    order, text, bounds = ref.key_order(runs, True)
    got = c.key_rows_json(runs, order, dues, limit, text, bounds)
    assert got == ref.key_rows_json(runs, order, dues, limit, text, bounds)
    chunks, rest = got
    flat = [(topic, k, first + i) for topic, keys, first in runs for i, k in enumerate(keys)]
    assert all(1 <= len(json.loads(text)) <= limit and len(numbers) == 2 * ref.NUMBER_DIGITS * len(json.loads(text))
               for _, text, numbers in chunks)
    # Written as apply writes them: the JSON chunks, then the rest bound; the same table as
    # every row bound in key order (a later row of a pair replacing an earlier one).
    tables = []
    for via_json in (True, False, "stretches"):
        db = sqlite3.connect(":memory:")
        db.execute("CREATE TABLE recent (topic TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, "
                   "deliver_at INTEGER NOT NULL, done_at INTEGER, PRIMARY KEY (topic, key)) WITHOUT ROWID")
        places = array("Q", rest if via_json is True else order)
        if via_json is True:
            for chunk in chunks:
                db.execute(ref.PUT_JSON, chunk)
        elif via_json == "stretches":  # as `_put_runs` calls it: a stretch of the order at a time
            nul = []
            for i in range(0, len(order), 8 * stretch):
                args = (runs, order[i:i + 8 * stretch], dues, limit, text, bounds[i:i + 8 * stretch + 8])
                part = c.key_rows_json(*args)
                assert part == ref.key_rows_json(*args)
                for chunk in part[0]:
                    db.execute(ref.PUT_JSON, chunk)
                nul.append(part[1])
            places = array("Q", b"".join(nul))
        ref.put_rows(db, [(flat[p][0], flat[p][1], flat[p][2], dues[p]) for p in places])
        tables.append(db.execute("SELECT topic, key, seq, deliver_at, done_at FROM recent ORDER BY topic, key").fetchall())
    assert tables[0] == tables[1] == tables[2]
    assert sorted(array("Q", rest)) == sorted(p for p in array("Q", order) if "\x00" in flat[p][1])


ROWS_OK = ([("t", ["a", None, "b"], 5)], array("Q", [0, 2]).tobytes(), array("q", [1, 2, 3]).tobytes(), 2, b"ab",
           array("Q", [0, 1, 2]).tobytes())


@pytest.mark.parametrize("args", [
    (("t", ["k"], 1), *ROWS_OK[1:]),  # runs not a list
    ([["t", ["k"], 1]], *ROWS_OK[1:]),  # a run that is not a tuple
    ([("t", ["k"])], *ROWS_OK[1:]),  # no first_seq
    ([(b"t", ["k"], 1)], *ROWS_OK[1:]),
    ([("t", "k", 1)], *ROWS_OK[1:]),
    ([("t", ["k"], 1.0)], *ROWS_OK[1:]),
    ([("t", ["k"], -1)], *ROWS_OK[1:]),
    ([("t", ["k"], 2**63 - 1)], *ROWS_OK[1:]),  # its seq would not fit an i64
    ([("t", ["k"], 2**70)], *ROWS_OK[1:]),
    ([("\udfff", ["a", None, "b"], 5)], *ROWS_OK[1:]),  # a topic with no UTF-8
    ([*ROWS_OK[0], ("\udfff", [], 9)], *ROWS_OK[1:]),  # (every run's topic is read)
    (ROWS_OK[0], ROWS_OK[1], array("q", [1, 2]).tobytes(), *ROWS_OK[3:]),  # a due time missing
    (ROWS_OK[0], ROWS_OK[1], None, *ROWS_OK[3:]),
    (ROWS_OK[0], ROWS_OK[1][:-1], *ROWS_OK[2:]),  # order cut short
    (ROWS_OK[0], "abcdefgh", *ROWS_OK[2:]),
    (ROWS_OK[0], "abc", *ROWS_OK[2:]),
    (ROWS_OK[0], 8, *ROWS_OK[2:]),
    (ROWS_OK[0], array("Q", [0, 3]).tobytes(), *ROWS_OK[2:]),  # past the end
    (ROWS_OK[0], array("Q", [0, 2**64 - 1]).tobytes(), *ROWS_OK[2:]),
    (*ROWS_OK[:3], 0, *ROWS_OK[4:]),
    (*ROWS_OK[:3], -(2**70), *ROWS_OK[4:]),
    (*ROWS_OK[:3], 2.0, *ROWS_OK[4:]),
    (*ROWS_OK[:4], None, ROWS_OK[5]),  # no text
    (*ROWS_OK[:4], "ab", ROWS_OK[5]),
    (*ROWS_OK[:5], array("Q", [0, 1]).tobytes()),  # a bound missing
    (*ROWS_OK[:5], array("Q", [0, 1, 2, 2]).tobytes()),  # one too many
    (*ROWS_OK[:5], array("Q", [1, 0, 2]).tobytes()),  # out of order
    (*ROWS_OK[:5], array("Q", [0, 1, 3]).tobytes()),  # past the text
    (*ROWS_OK[:5], array("Q", [0, 1, 2**64 - 1]).tobytes()),
    (*ROWS_OK[:5], None),
    (*ROWS_OK[:4], b"a\xff", ROWS_OK[5]),  # a key that is not UTF-8
    (*ROWS_OK[:4], b"a\xed\xa0\x80", array("Q", [0, 1, 4]).tobytes()),  # a surrogate's bytes
])
def test_damaged_rows_input_is_the_same_error_in_both(args: tuple[Any, ...]) -> None:
    assert outcome(c.key_rows_json, *ROWS_OK) == outcome(ref.key_rows_json, *ROWS_OK)
    got = outcome(c.key_rows_json, *args)
    assert got == outcome(ref.key_rows_json, *args)
    assert got[0] == "error"


def test_no_key_str_is_read_only_the_text() -> None:
    """(A checkpoint's keys are written a stretch at a time, from key_order's text: the runs give
    their topics, first seqs and sizes.)"""
    runs = [("t", ["a", 5, "\ud800", "b"], 1)]
    dues = array("q", [1, 2, 3, 4]).tobytes()
    args = (runs, array("Q", [0, 3]).tobytes(), dues, 10, b"xab", array("Q", [1, 2, 3]).tobytes())
    assert c.key_rows_json(*args) == ref.key_rows_json(*args) == (
        [("t", '["a","b"]', b"%020d%020d%020d%020d" % (1, 1, 4, 4))], b"")


def test_the_ends_of_the_i64_range_are_read_back_by_sqlite() -> None:
    """The fixed-width digits `PUT_JSON` cuts each row's numbers from: any i64, a '-' first."""
    runs = [("t", ["a", "b", "c", "d"], 2**63 - 5)]
    dues = array("q", [-(2**63), 2**63 - 1, -1, 0])
    order, text, bounds = ref.key_order(runs, True)
    got = c.key_rows_json(runs, order, dues, 10, text, bounds)
    assert got == ref.key_rows_json(runs, order, dues, 10, text, bounds)
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE recent (topic TEXT, key TEXT, seq INTEGER, deliver_at INTEGER, done_at INTEGER)")
    db.execute(ref.PUT_JSON, got[0][0])
    assert db.execute("SELECT topic, key, seq, deliver_at, typeof(seq), typeof(deliver_at) FROM recent").fetchall() == [
        ("t", k, 2**63 - 5 + i, dues[i], "integer", "integer") for i, k in enumerate("abcd")]
