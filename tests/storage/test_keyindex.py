"""KeyIndex: what a lookup answers from the overlay (queued writes) and from SQLite (applied
ones), and `put_run` (the compiled produce path's form) against `put_many` (the reference)."""

from __future__ import annotations

import tempfile
from array import array
from pathlib import Path

from delayd.storage.keyindex import KeyIndex
from hypothesis import given, settings
from hypothesis import strategies as st

KEYS = st.sampled_from([f"k{i}" for i in range(12)])
RUNS = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.lists(st.none() | KEYS, min_size=1, max_size=6)),
                min_size=1, max_size=8)


def rows_of(ki: KeyIndex) -> list[tuple[object, ...]]:
    return list(ki.db.execute("SELECT topic, key, seq, deliver_at, done_at FROM keys ORDER BY topic, key"))


def everything(ki: KeyIndex) -> dict[str, dict[str, tuple[int, int, int | None]]]:
    names = [f"k{i}" for i in range(12)]
    return {t: ki.lookup_many(t, names) for t in ("a", "b")}


@settings(max_examples=30, deadline=None)
@given(runs=RUNS, commit_after=st.integers(0, 8))
def test_put_run_answers_and_stores_what_put_many_does(runs: list[tuple[str, list[str | None]]],
                                                       commit_after: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        ref, run = KeyIndex(Path(d) / "ref.sqlite"), KeyIndex(Path(d) / "run.sqlite")
        try:
            seq = 1
            for n, (topic, keys) in enumerate(runs):
                dues = array("q", [1000 * seq + i for i in range(len(keys))])
                ref.put_many([(topic, k, seq + i, dues[i]) for i, k in enumerate(keys) if k is not None])
                run.put_run(topic, keys, seq, memoryview(dues.tobytes()).cast("q"))
                seq += len(keys)
                assert everything(run) == everything(ref)  # from the overlay
                if n == commit_after:  # some written to SQLite, the rest still queued
                    ref.commit(seq)
                    run.commit(seq)
                    assert everything(run) == everything(ref)
            ref.commit(seq)
            run.commit(seq)
            assert rows_of(run) == rows_of(ref)
            assert everything(run) == everything(ref)
            assert run.commit_pos == seq
        finally:
            ref.close()
            run.close()


def test_a_key_is_answered_before_and_after_its_write_and_released_by_its_own_message(tmp_path: Path) -> None:
    ki = KeyIndex(tmp_path / "keys.sqlite")
    try:
        ki.put_run("t", ["x", None, "y"], 10, [100, 101, 102])
        assert ki.lookup_many("t", ["x", "y", "z"]) == {"x": (10, 100, None), "y": (12, 102, None)}
        ki.release("t", "y", 9)  # not its holder: nothing changes
        assert ki.lookup("t", "y") == (12, 102, None)
        ops = ki.take_ops()  # being written: still answered
        assert ki.lookup("t", "y") == (12, 102, None)
        ki.apply(ops, 5)
        ki.applied()
        assert ki.lookup("t", "y") == (12, 102, None) and ki.commit_pos == 5
        ki.release("t", "x", 10)
        assert ki.lookup("t", "x") is None and ki.lookup("t", "y") == (12, 102, None)
        ki.commit(6)
        assert rows_of(ki) == [("t", "y", 12, 102, None)]
    finally:
        ki.close()
