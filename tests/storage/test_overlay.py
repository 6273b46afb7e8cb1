"""The key index's overlay (storage/overlay.py): the compiled `overlay_put`/`overlay_find` against
the Python reference, byte for byte, damaged input included; and the Overlay's answers (the newest
entry of a key, across tables, whatever pairs share a hash). `make asan` runs this file with
AddressSanitizer."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from delayd.storage import overlay as ref
from delayd.storage.overlay import HEADER, Overlay, Released, Rows, Run, new_table
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.shrinking import refill

c = pytest.importorskip("delayd.storage._batch", reason="the compiled batch core is built by pip install")

TOPICS = st.sampled_from(["t", "orders", "ü-topic", ""])
KEYS = st.lists(st.none() | st.sampled_from(["a", "b", "c"]) | st.text(max_size=12) | st.integers(-2**70, 2**70),
                max_size=40)


def both(name: str, table: bytearray, *args: Any) -> Any:
    """Call the compiled and the reference function on copies of `table`: the same answer (or the
    same error) and the same bytes after; the table takes the bytes."""
    t_c, t_ref = bytearray(table), bytearray(table)
    answers = []
    for impl, t in ((c, t_c), (ref, t_ref)):
        try:
            answers.append(getattr(impl, name)(t, *args))
        except Exception as e:  # noqa: BLE001 - compared below
            answers.append(type(e))
    assert answers[0] == answers[1]
    assert t_c == t_ref
    table[:] = t_c
    return answers[0]


@settings(max_examples=300, deadline=None)
@given(room=st.integers(1, 20), topic=TOPICS, puts=st.lists(st.tuples(KEYS, st.integers(0, 45)), max_size=8),
       asked=KEYS)
def test_compiled_put_and_find_match_the_reference(room: int, topic: str, puts: list[tuple[list[Any], int]],
                                                   asked: list[Any]) -> None:
    table = new_table(room)
    for number, (keys, start) in enumerate(puts):
        start = min(start, len(keys))
        got = both("overlay_put", table, topic, keys, number, start)
        named = [i for i in range(start, len(keys)) if keys[i] is not None]
        taken = [i for i in named if i < got]
        assert got == len(keys) or got in named  # all taken, or the first key the room lacked
        assert struct.unpack_from("<Q", table)[0] <= (len(table) - HEADER) // 32
        assert {(i, number, i) for i in taken} <= {(i, e, at) for i, e, at in both("overlay_find", table, topic, keys)}
    both("overlay_find", table, topic, asked)
    both("overlay_find", table, topic, tuple(asked))


def test_a_full_table_takes_no_more_and_says_where_it_stopped() -> None:
    for impl in (c, ref):
        table = new_table(4)  # (8 slots: room for 4 keys)
        assert impl.overlay_put(table, "t", ["a", None, "b"], 0, 0) == 3
        assert impl.overlay_put(table, "t", [None, "c", None, "d", None, "e"], 1, 0) == 5  # "e" found no room
        assert impl.overlay_put(table, "t", [None, "x"], 2, 0) == 1
        assert impl.overlay_put(table, "t", [None, None], 2, 0) == 2  # nothing to take: all done
        assert impl.overlay_put(table, "t", ["d", "e"], 2, 2) == 2
        assert sorted(impl.overlay_find(table, "t", ["a", "b", "c", "d"])) == [(0, 0, 0), (1, 0, 2), (2, 1, 1), (3, 1, 3)]


FULL = bytearray(new_table(2))
for _s in range(4):
    struct.pack_into("<QII", FULL, HEADER + 16 * _s, _s, 1, 0)  # every slot taken, the header says none


@pytest.mark.parametrize("table, topic, keys, entry, start, error", [
    (b"\0" * 48, "t", ["k"], 0, 0, TypeError),  # not a bytearray
    (memoryview(new_table(1)), "t", ["k"], 0, 0, TypeError),
    (bytearray(0), "t", ["k"], 0, 0, ValueError),  # no header
    (bytearray(32), "t", ["k"], 0, 0, ValueError),  # one slot
    (bytearray(16 + 3 * 16), "t", ["k"], 0, 0, ValueError),  # not a power of two
    (bytearray(16 + 4 * 16 + 1), "t", ["k"], 0, 0, ValueError),  # a cut slot
    (bytearray(b"\x03" + bytes(15 + 4 * 16)), "t", ["k"], 0, 0, ValueError),  # more held than there is room for
    (FULL, "t", ["k"], 0, 0, ValueError),  # no free slot
    (new_table(1), b"t", ["k"], 0, 0, TypeError),  # topic not a str
    (new_table(1), "t", "k", 0, 0, TypeError),  # keys not a list or tuple
    (new_table(1), "t", iter(["k"]), 0, 0, TypeError),
    (new_table(4), "t", ["k", ["unhashable"]], 0, 0, TypeError),
    (new_table(1), "t", ["k"], -1, 0, ValueError),  # entry out of range
    (new_table(1), "t", ["k"], 0xFFFFFFFF, 0, ValueError),
    (new_table(1), "t", ["k"], 0, 2, ValueError),  # start past the keys
    (new_table(1), "t", ["k"], 0, -1, ValueError),
    (new_table(1), "t", ["k"], 0.0, 0, TypeError),  # not ints
    (new_table(1), "t", ["k"], 0, "0", TypeError),
])
def test_damaged_input_fails_the_same_way_in_both(table: Any, topic: Any, keys: Any, entry: Any, start: Any,
                                                  error: type) -> None:
    for impl in (c, ref):
        with pytest.raises(error):
            impl.overlay_put(bytearray(table) if isinstance(table, bytearray) else table, topic, keys, entry, start)


@pytest.mark.parametrize("table, topic, keys, error", [
    (b"\0" * 48, "t", ["k"], TypeError),
    (bytearray(32), "t", ["k"], ValueError),
    (bytearray(16 + 3 * 16), "t", ["k"], ValueError),
    (bytearray(b"\x03" + bytes(15 + 4 * 16)), "t", ["k"], ValueError),
    (new_table(1), b"t", ["k"], TypeError),
    (new_table(1), "t", "k", TypeError),
    (new_table(1), "t", ["k", ["unhashable"]], TypeError),
])
def test_damaged_input_fails_find_the_same_way_in_both(table: Any, topic: Any, keys: Any, error: type) -> None:
    for impl in (c, ref):
        with pytest.raises(error):
            impl.overlay_find(table, topic, keys)


def test_a_damaged_full_table_is_searched_once_around_not_forever() -> None:
    for impl in (c, ref):
        assert impl.overlay_find(bytearray(FULL), "t", ["k"]) == []


def test_the_keys_before_an_unhashable_one_are_put_as_in_the_reference() -> None:
    """The compiled put hashes keys in groups before it fills their slots: a key that cannot be
    hashed, in the middle of a group, still leaves the keys before it in the table, as the
    reference does."""
    for at in (0, 5, 16, 21, 40):
        keys: list[Any] = [f"k{i}" for i in range(40)]
        keys.insert(at, ["unhashable"])
        t_c, t_ref = new_table(64), new_table(64)
        for impl, t in ((c, t_c), (ref, t_ref)):
            with pytest.raises(TypeError):
                impl.overlay_put(t, "t", keys, 0, 0)
        assert t_c == t_ref
        assert struct.unpack_from("<Q", t_c)[0] == at


def test_a_key_whose_hash_changes_the_list_is_not_read_past_its_end() -> None:
    keys: list[Any] = []
    for impl in (c, ref):
        table = new_table(8)
        assert impl.overlay_put(table, "t", refill(keys), 0, 0) == 1
        assert len(impl.overlay_find(table, "t", refill(keys))) == 1


class Same:
    """A key whose hash is every Same's: pairs that share a hash in a table."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        return 12345

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.name == self.name


def test_the_overlay_answers_the_newest_entry_of_a_key_across_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ref, "SLICE", 2)  # a table holds two keys: most entries span tables
    o = Overlay()
    o.put(Run("t", ["a", None, "b", "c"], 10, [100, 101, 102, 103]))
    o.put(Rows("t", [("t", "b", 20, 200), ("t", "d", 21, 201), ("t", "b", 22, 202)]))
    o.put(Run("u", ["a"], 30, [300]))  # another topic
    o.put(Released("t", "c"))
    assert o.tables == []  # filled when a key is first looked for
    assert o.find("t", ["a", "b", "c", "d", "e"]) == {"a": (10, 100), "b": (22, 202), "c": None, "d": (21, 201)}
    assert len(o.tables) > 2
    assert o.find("u", ["a", "b"]) == {"a": (30, 300)}
    assert o.find("v", ["a"]) == {}
    assert o.keys() == [("t", ["a", None, "b", "c"]), ("t", ["b", "d", "b"]), ("u", ["a"]), ("t", ["c"])]
    newer = Overlay()
    newer.put(Run("t", ["e", "a"], 40, [400, 401]))
    o.absorb(newer)
    assert o.find("t", ["a", "b", "e"]) == {"a": (41, 401), "b": (22, 202), "e": (40, 400)}
    o.put(Run("t", ["b"], 50, [500]))  # put after a look: in the tables at the next
    assert o.find("t", ["b", "e"]) == {"b": (50, 500), "e": (40, 400)}


def test_pairs_that_share_a_hash_are_told_apart_by_their_keys() -> None:
    o = Overlay()
    x, y, z = Same("x"), Same("y"), Same("z")
    o.put(Run("t", [x, y], 1, [10, 11]))
    o.put(Run("t", [Same("x")], 5, [50]))
    assert o.find("t", [y, z, x]) == {y: (2, 11), x: (5, 50)}
    assert o.find("u", [x]) == {}  # the same keys in another topic


def test_an_empty_overlay_has_no_table_and_holds_nothing() -> None:
    o = Overlay()
    assert not o and o.tables == [] and o.find("t", ["a"]) == {}
    o.put(Run("t", [None, None], 1, [10, 11]))  # a batch of keyless messages
    assert o and o.find("t", ["a"]) == {}
