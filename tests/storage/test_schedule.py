"""Schedule.snapshot: what a checkpoint's thread packs is the counts of the snapshot's moment."""

from __future__ import annotations

import zlib
from array import array

from delayd.storage.schedule import Schedule


def counts(packed: bytes) -> list[int]:
    return list(array("i", zlib.decompress(packed)))


def test_a_pack_holds_the_counts_of_its_snapshot_not_later_ones() -> None:
    s = Schedule(1000, 8)
    s.apply([1, 1, 3], [])
    pack, _ = s.snapshot()
    s.apply([5], [1])  # after the snapshot, before its pack (the loop goes on meanwhile)
    assert counts(pack()) == [0, 2, 0, 1, 0, 0, 0, 0]
    again, _ = s.snapshot()  # changed since: copied and packed again
    assert counts(again()) == [0, 1, 0, 1, 0, 1, 0, 0]


def test_unchanged_counts_are_not_packed_again() -> None:
    s = Schedule(1000, 8)
    s.count(array("I", [2, 2, 7]).tobytes())
    first, _ = s.snapshot()
    packed = first()
    s.take_slot(4_000)  # slot 4 held nothing: no change
    s.count(b"")
    same, _ = s.snapshot()
    assert same() is packed
    s.take_slot(2_000)
    emptied, _ = s.snapshot()
    assert counts(emptied()) == [0, 0, 0, 0, 0, 0, 0, 1]


def test_a_snapshot_taken_before_the_last_one_is_packed_copies_into_a_buffer_of_its_own() -> None:
    s = Schedule(1000, 4)
    s.snapshot()[0]()  # (a pack done: its buffer is kept for the next snapshot)
    s.apply([0], [])
    older, _ = s.snapshot()
    s.apply([1], [])
    newer, _ = s.snapshot()  # (a checkpoint whose pack never ran: a failed write)
    assert counts(newer()) == [1, 1, 0, 0]
    assert counts(older()) == [1, 0, 0, 0]


def test_restored_counts_are_packed_again() -> None:
    s = Schedule(1000, 4)
    pack, far = s.snapshot()
    packed = pack()
    s.restore(zlib.compress(array("i", [0, 3, 0, 0]).tobytes()), {7: 2})
    again, far = s.snapshot()
    assert again() != packed and counts(again()) == [0, 3, 0, 0] and far == {7: 2}
