"""The key index's write order (storage/keyindex.py `key_order`): the compiled function against
the Python reference, byte for byte, damaged input included; and what `apply` relies on: the
order is SQLite's (topic, key) order and keeps the given order of one pair's keys. `make asan`
runs this file with AddressSanitizer."""

from __future__ import annotations

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
    codes = list(array("Q", got))
    flat = [(topic, k) for topic, ks, _ in runs for k in ks]
    keys = [flat[code] for code in codes]
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
def test_damaged_input_is_the_same_error_in_both(runs: Any) -> None:
    got = outcome(c.key_order, runs)
    assert got == outcome(ref.key_order, runs)
    assert got[0] == "error"
