"""KeyIndex: what a lookup answers from the overlay (queued writes) and from SQLite (applied
ones), `put_run` (the compiled produce path's form) against `put_many` (the reference), and the
key filter in front of both: built in a thread, never missing a key put meanwhile."""

from __future__ import annotations

import json
import sqlite3
import struct
import tempfile
import time
from array import array
from collections.abc import Sequence
from pathlib import Path

import pytest
from delayd.storage import batch, keyfilter, keyindex, overlay
from delayd.storage.farindex import FarIndex
from delayd.storage.keyindex import FilterBuild, KeyIndex
from hypothesis import given, settings
from hypothesis import strategies as st

KEYS = st.sampled_from([f"k{i}" for i in range(12)])
RUNS = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.lists(st.none() | KEYS, min_size=1, max_size=6)),
                min_size=1, max_size=8)


def rows_of(ki: KeyIndex) -> list[tuple[object, ...]]:
    """The index's rows as one table: a pair's row in `recent` over its older row in `keys`."""
    rows = {}
    for table in ("keys", "recent"):
        for row in ki.db.execute(f"SELECT topic, key, seq, deliver_at, done_at FROM {table}"):
            rows[row[:2]] = row
    return sorted(rows.values())


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


FEW = st.sampled_from(["k0", "k1", "k2"])  # so that operations meet on the same keys
TOPIC = st.sampled_from(["a", "b"])
PUTS = (st.tuples(st.just("put"), st.lists(st.tuples(TOPIC, FEW), min_size=1, max_size=5)),
        st.tuples(st.just("run"), TOPIC, st.lists(st.none() | FEW, min_size=1, max_size=5), st.booleans()))
OPS = st.lists(st.one_of(
    *PUTS,
    st.tuples(st.just("release"), TOPIC, FEW, st.none() | st.integers(1, 40)),
    st.tuples(st.just("delivered"), TOPIC, FEW, st.none() | st.integers(1, 40)),
    st.tuples(st.just("expire"), st.integers(0, 60)),
    st.just(("commit",))), max_size=25)


def packed(keys: list[str | None]) -> Sequence[str | None]:
    """`keys` as storage.batch `record_keys` gives them: packed by the compiled core, else a list."""
    return batch.ops.Keys(keys) if batch.ops is not batch else keys


def put_run(ki: KeyIndex, claim: bool, topic: str, keys: Sequence[str | None], seq: int, dues: list[int]) -> None:
    """ki.put_run, the keys claimed first when `claim` (as a produce puts them: asked and added
    to the filter in one pass, see KeyIndex.claim_many)."""
    claimed = None
    if claim:
        named = [k for k in keys if k is not None]
        ki.claim_many(topic, named)
        claimed = len(named)
    ki.put_run(topic, keys, seq, dues, claimed)


def put(ki: KeyIndex, op: tuple, seq: int) -> tuple[list[tuple[str, str, int, int]], int]:
    """Carry out a "put" or "run" of PUTS with messages numbered from `seq` (due 100 + their
    number; a run claimed or not): the rows (topic, key, seq, due) it put, None keys left out, and
    the messages it took."""
    if op[0] == "put":
        rows = [(t, k, seq + i, 100 + seq + i) for i, (t, k) in enumerate(op[1])]
        ki.put_many(rows)
        return rows, len(rows)
    _, t, keys, claim = op
    put_run(ki, claim, t, keys, seq, [100 + seq + i for i in range(len(keys))])
    return [(t, k, seq + i, 100 + seq + i) for i, k in enumerate(keys) if k is not None], len(keys)


@pytest.mark.parametrize(("params_per_statement", "merge", "stretch"), [
    (4, None, keyindex.JSON_ROWS), (8, None, 1), (keyindex.INSERT_PARAMS, None, keyindex.JSON_ROWS),
    (keyindex.INSERT_PARAMS, (1, 1), 2), (8, (2, 1), 1), (4, (3, 2), keyindex.JSON_ROWS)])
@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(ops=OPS)
def test_the_written_index_is_what_the_operations_say_in_their_order(ops: list[tuple], params_per_statement: int,
                                                                    merge: tuple[int, int] | None, stretch: int) -> None:
    """What `apply` writes, in whatever way it writes it: a later put of a key wins over an
    earlier one (in one INSERT of many rows, and across them), and a release, a delivery or an
    expiry sees exactly the puts queued before it. `merge` (MERGE_MIN, MERGE_SLICE): `recent`
    moves into `keys` after every few rows, a slice of a row or two each checkpoint, so that a
    pair's older row waits in `keys` while its newer one is in `recent`, and the two tables
    together answer as the one table of the model, at every checkpoint. `stretch` (JSON_ROWS):
    a run's keys are written a key or two at a time, each stretch that falls in a gap of both
    tables straight into `keys`, the others into `recent`."""
    model: dict[tuple[str, str], tuple[int, int, int | None]] = {}
    seq = 1
    with tempfile.TemporaryDirectory() as d:
        ki = KeyIndex(Path(d) / "keys.sqlite")
        saved = keyindex.INSERT_PARAMS, keyindex.MERGE_MIN, keyindex.MERGE_SLICE, keyindex.MERGE_SCALE, keyindex.JSON_ROWS
        keyindex.INSERT_PARAMS, keyindex.JSON_ROWS = params_per_statement, stretch
        if merge is not None:
            keyindex.MERGE_MIN, keyindex.MERGE_SLICE, keyindex.MERGE_SCALE = *merge, 0
        try:
            for op in ops:
                if op[0] in ("put", "run"):
                    rows, n = put(ki, op, seq)
                    model.update({(t, k): (s, due, None) for t, k, s, due in rows})
                    seq += n
                elif op[0] == "release":  # of the key's holder (None), or of some message
                    _, t, k, s = op
                    s = model.get((t, k), (0,))[0] if s is None else s
                    ki.release(t, k, s)
                    if model.get((t, k), (None,))[0] == s:
                        del model[(t, k)]
                elif op[0] == "delivered":
                    _, t, k, s = op
                    s = model.get((t, k), (0,))[0] if s is None else s
                    if s % 2:  # (as a release marks them: packed keys and their seqs, a None among them)
                        ki.delivered_keys(s, t, packed([None, k]), struct.pack("<QQ", 0, s))
                    else:
                        ki.delivered([(s, t, k, s)])
                    if model.get((t, k), (None,))[0] == s:
                        model[(t, k)] = (*model[(t, k)][:2], s)
                elif op[0] == "expire":
                    ki.expire(op[1])
                    model = {tk: v for tk, v in model.items() if v[2] is None or v[2] >= op[1]}
                else:
                    ki.commit(seq)
                    assert rows_of(ki) == sorted((t, k, *v) for (t, k), v in model.items())
                    assert unfiltered_answers(ki) == model
            ki.commit(seq)
            assert rows_of(ki) == sorted((t, k, *v) for (t, k), v in model.items())
            assert unfiltered_answers(ki) == model
        finally:
            keyindex.INSERT_PARAMS, keyindex.MERGE_MIN, keyindex.MERGE_SLICE, keyindex.MERGE_SCALE, keyindex.JSON_ROWS = saved
            ki.close()


def unfiltered_answers(ki: KeyIndex) -> dict[tuple[str, str], tuple[int, int, int | None]]:
    """`answers` by pair (the model's shape), with no filter between."""
    ki._filter = None  # (every key asked of the tables; the filter has its own tests)
    return {(t, k): v for t, found in answers(ki).items() for k, v in found.items()}


def answers(ki: KeyIndex) -> dict[str, dict[str, tuple[int, int, int | None]]]:
    return {t: ki.lookup_many(t, ["k0", "k1", "k2"]) for t in ("a", "b")}


def wanted(model: dict[tuple[str, str], tuple[int, int]]) -> dict[str, dict[str, tuple[int, int, None]]]:
    return {t: {k: (*v, None) for (mt, k), v in model.items() if mt == t} for t in ("a", "b")}


ANSWER_OPS = st.lists(st.one_of(
    *PUTS,
    st.tuples(st.just("release"), TOPIC, FEW),
    st.sampled_from([("take",), ("written",), ("applied",), ("failed",), ("lookup",), ("lookup",)])), max_size=30)


@pytest.mark.parametrize(("slice_keys", "with_filter"), [(1, True), (2, True), (overlay.SLICE, True), (2, False)])
@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(ops=ANSWER_OPS)
def test_lookups_answer_what_the_operations_say_at_every_step_of_a_write(ops: list[tuple], slice_keys: int,
                                                                         with_filter: bool) -> None:
    """Whatever the overlay keeps where (runs, single puts, releases, the part being written, in
    one slice or many), a lookup answers the latest put of a key that was not released: before
    the write, while it runs, after the database holds it, and after a failed write. And
    `unwritten` counts the keys put that the database does not hold yet (what the broker's
    backpressure reads). Also without a key filter (as while the first one is built after a
    restart): then every key is looked up and the filter does not count the keys put."""
    model: dict[tuple[str, str], tuple[int, int]] = {}
    seq, taken, written = 1, None, False
    queued = writing = 0
    with tempfile.TemporaryDirectory() as d:
        ki = KeyIndex(Path(d) / "keys.sqlite")
        if not with_filter:
            ki._filter = None
        default, overlay.SLICE = overlay.SLICE, slice_keys
        try:
            for op in ops:
                if op[0] in ("put", "run"):
                    rows, n = put(ki, op, seq)
                    model.update({(t, k): (s, due) for t, k, s, due in rows})
                    seq += n
                    queued += len(rows)
                elif op[0] == "release":  # by the key's holder, as a cancel does
                    _, t, k = op
                    ki.release(t, k, model.pop((t, k), (0,))[0])
                elif op[0] == "take" and taken is None:
                    taken, written = ki.take_ops(), False
                    queued, writing = 0, writing + queued
                elif op[0] == "written" and taken is not None and not written:
                    ki.apply(taken, seq)  # the worker's write; the overlay still answers too
                    written = True
                elif op[0] == "applied" and written:
                    ki.applied()
                    taken, writing = None, 0
                elif op[0] == "failed" and taken is not None and not written:
                    ki.requeue(taken)
                    taken, queued, writing = None, queued + writing, 0
                elif op[0] == "lookup":
                    assert answers(ki) == wanted(model)
                assert ki.unwritten == queued + writing, op
            assert answers(ki) == wanted(model)
        finally:
            overlay.SLICE = default
            ki.close()


@settings(max_examples=100, deadline=None, database=None)
@given(batches=st.lists(st.lists(st.sampled_from([f"k{i}" for i in range(12)]), max_size=10), max_size=6))
def test_a_claim_rules_out_no_key_that_repeats_in_its_batch(batches: list[list[str]]) -> None:
    """The broker skips its repeat check over a whole batch when none of the keys a claim could not
    rule out repeats (broker.service `repeats`): every key that repeats must be among them, new to
    the filter or not."""
    with tempfile.TemporaryDirectory() as d:
        ki = KeyIndex(Path(d) / "keys.sqlite")
        try:
            seq = 1
            for named in batches:
                found, maybe = ki.claim_many("t", named)
                assert maybe is not None and {k for k in named if named.count(k) > 1} <= set(maybe)
                fresh = list(dict.fromkeys(k for k in named if k not in found))  # as a produce stores them
                ki.put_run("t", fresh, seq, [0] * len(fresh), len(fresh))
                seq += len(fresh)
            ki._filter = None  # no filter (as while the first one is built): not known
            assert ki.claim_many("t", ["k0", "k0"])[1] is None
        finally:
            ki.close()


def test_after_a_failed_write_both_parts_keep_answering(tmp_path: Path) -> None:
    ki = KeyIndex(tmp_path / "keys.sqlite")
    try:
        ki.put_run("t", ["a0", "a1"], 1, [10, 11])
        ops = ki.take_ops()
        ki.requeue(ops)  # the write failed
        ki.put_run("t", ["b0", "b1"], 3, [12, 13])  # waits in the new part
        ki.put_run("t", ["a1"], 5, [14])  # a later put of a key of the failed part wins
        want = {"a0": (1, 10, None), "a1": (5, 14, None), "b0": (3, 12, None), "b1": (4, 13, None)}
        ops = ki.take_ops()  # the retry: both parts together
        assert ki.lookup_many("t", ["a0", "a1", "b0", "b1"]) == want
        ki.apply(ops, 6)
        ki.applied()
        assert ki.lookup_many("t", ["a0", "a1", "b0", "b1"]) == want
    finally:
        ki.close()


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


# -- the key filter (storage.keyfilter) in front of the lookups ------------------------------------
def queries(ki: KeyIndex) -> list[str]:
    seen: list[str] = []
    ki.db.set_trace_callback(seen.append)
    return seen


def held_index(path: Path, keys: list[str]) -> None:
    ki = KeyIndex(path)
    ki.put_run("t", keys, 1, list(range(len(keys))))
    ki.commit(len(keys))
    ki.close()


def reopened_with_a_pending_build(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[KeyIndex, FilterBuild]:
    """An index holding "old", opened again with its filter build begun but not run: the test
    runs the scan itself, at the moment it means to."""
    monkeypatch.setattr(FilterBuild, "start", lambda self: None)
    held_index(path, ["old"])
    ki = KeyIndex(path)
    assert ki._build is not None
    return ki, ki._build


def test_new_keys_are_answered_from_the_filter_without_a_query(tmp_path: Path) -> None:
    held_index(tmp_path / "keys.sqlite", ["old"])
    ki = KeyIndex(tmp_path / "keys.sqlite")  # not empty: the filter is built in a thread
    try:
        assert ki.lookup_many("t", ["old", "new"]) == {"old": (1, 0, None)}  # answered meanwhile too
        deadline = time.monotonic() + 10
        while not ki.filter_ready:
            assert time.monotonic() < deadline, "the key filter was never built"
            time.sleep(0.01)
        seen = queries(ki)
        assert ki.lookup_many("t", [f"new-{i}" for i in range(100)]) == {}
        assert not [q for q in seen if q.startswith("SELECT")]  # a false "maybe" or two at most would query
        assert ki.lookup_many("t", ["old"]) == {"old": (1, 0, None)}
        assert [q for q in seen if q.startswith("SELECT")]
    finally:
        ki.close()


@pytest.mark.parametrize("claim", [False, True])
def test_keys_put_while_the_filter_is_built_are_never_missed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              claim: bool) -> None:
    """The hard case: a key put after the build began, written to the database after the scan's
    snapshot, then dropped from the overlay. Only the build's recorded keys know it."""
    ki, build = reopened_with_a_pending_build(tmp_path / "keys.sqlite", monkeypatch)
    try:
        assert not ki.filter_ready
        put_run(ki, claim, "t", ["in-overlay"], 2, [2])  # before the second build begins: in its overlay
        build.scan()  # the snapshot: "old" only
        assert build.caught_up == len(build.recorded) > 0 and build.result is not None  # recorded so far: added by
        assert build.result.maybe("t", ["in-overlay"]) == ["in-overlay"]                # the build's thread
        put_run(ki, claim, "t", ["after-scan"], 3, [3])
        ki.commit(3)  # both written, the overlay dropped
        assert ki.filter_ready  # the first filter: scan + recorded keys
        assert ki.lookup_many("t", ["old", "in-overlay", "after-scan"]) == {
            "old": (1, 0, None), "in-overlay": (2, 2, None), "after-scan": (3, 3, None)}

        put_run(ki, claim, "t", ["queued"], 4, [4])  # in the overlay when the next build begins
        ki._start_build()
        second = ki._build
        assert second is not None
        second.scan()  # "queued" is not in this snapshot
        put_run(ki, claim, "t", ["later"], 5, [5])
        ki.commit(5)
        assert ki.filter_ready and ki._filter is second.result
        assert set(ki.lookup_many("t", ["old", "in-overlay", "after-scan", "queued", "later"])) == {
            "old", "in-overlay", "after-scan", "queued", "later"}
    finally:
        ki.close()


def test_a_full_filter_is_built_again_bigger_and_still_knows_every_key(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyfilter, "MIN_CAPACITY", 64)
    ki = KeyIndex(tmp_path / "keys.sqlite")
    try:
        first = ki._filter
        assert first is not None and first.capacity == 64
        names = [f"k{i}" for i in range(400)]
        for i in range(0, 400, 20):  # 20 a batch, written every other batch
            ki.put_run("t", names[i:i + 20], 1 + i, list(range(20)))
            if i % 40:
                ki.commit(i)
            assert set(ki.lookup_many("t", names[:i + 20])) == set(names[:i + 20])
        deadline = time.monotonic() + 10
        while ki._build is not None or ki._filter is first:
            assert time.monotonic() < deadline, "the full filter was never built again"
            ki.lookup_many("t", ["poll"])
            time.sleep(0.01)
        assert ki._filter is not None and ki._filter.capacity > 64
        assert set(ki.lookup_many("t", names)) == set(names)
    finally:
        ki.close()


@pytest.mark.parametrize("claim", [False, True])
def test_the_batch_that_fills_the_filter_is_in_the_next_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            claim: bool) -> None:
    monkeypatch.setattr(keyfilter, "MIN_CAPACITY", 64)
    monkeypatch.setattr(FilterBuild, "start", lambda self: None)  # this test runs the scan itself
    ki = KeyIndex(tmp_path / "keys.sqlite")
    try:
        names = [f"k{i}" for i in range(65)]
        put_run(ki, claim, "t", names, 1, list(range(65)))  # fills the first filter: a build begins
        build = ki._build
        assert build is not None
        build.scan()  # before the batch is written: not in the snapshot
        ki.commit(65)
        assert ki.filter_ready and ki._filter is build.result
        assert set(ki.lookup_many("t", names)) == set(names)
    finally:
        ki.close()


@pytest.mark.parametrize("claim", [False, True])
def test_a_filter_that_filled_up_while_it_was_built_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   claim: bool) -> None:
    monkeypatch.setattr(keyfilter, "MIN_CAPACITY", 64)
    ki, first = reopened_with_a_pending_build(tmp_path / "keys.sqlite", monkeypatch)
    try:
        first.scan()  # sized for the one key it saw
        names = [f"k{i}" for i in range(100)]
        put_run(ki, claim, "t", names, 2, list(range(100)))  # recorded: more than the filter was sized for
        assert ki.filter_ready and ki._filter is first.result and first.result.full
        second = ki._build
        assert second is not None and second is not first  # begun at once, not at the next put
        second.scan()
        ki.commit(101)
        assert ki.filter_ready and ki._filter is second.result and not second.result.full
        assert set(ki.lookup_many("t", ["old", *names])) == {"old", *names}
    finally:
        ki.close()


def test_a_finished_build_is_installed_by_puts_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower only puts and never looks a key up: the build must not wait for a lookup, or
    its recorded keys would pile up in memory."""
    ki, build = reopened_with_a_pending_build(tmp_path / "keys.sqlite", monkeypatch)
    try:
        build.scan()
        ki.put_run("t", ["new"], 2, [2])
        assert ki._build is None and ki._filter is build.result and build.recorded == []
        ki.put_many([("t", "newer", 3, 3)])
        ki.commit(3)
        assert set(ki.lookup_many("t", ["old", "new", "newer", "never"])) == {"old", "new", "newer"}
    finally:
        ki.close()


SCANNED = {("recent", "a"): ["a\x00b", "k1", "k3"], ("keys", "a"): ["\x00", "a\x00", "a\x00b", "k2", "é", "𝄞", "\u2028"],
           ("keys", "b"): [f"k{i:02}" for i in range(7)], ("recent", "c"): ['q"', "back\\", "\n\t\r\b\f", "\x01\x1f\x7f"]}


def json_chunks(db: sqlite3.Connection, table: str, topic: str) -> list[list[str]]:
    """A topic's keys read as a build reads them as JSON (`key_chunk`, each after the last key of the
    one before), a list of keys a chunk (the empty one past the end left out)."""
    chunks, last = [], None
    while keys := json.loads(keyindex.key_chunk(db, table, topic, last)):
        chunks.append(keys)
        last = keys[-1]
    return chunks


@pytest.mark.parametrize("chunk", [1, 2, 3, keyindex.SCAN_CHUNK])
def test_a_build_scans_every_key_of_every_topic_in_both_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               chunk: int) -> None:
    """A build reads each topic's keys a chunk at a time, each after the last key of the one
    before: as JSON where SQLite has it, as rows where not, the same keys in the same order
    (odd keys, keys at a chunk's edges, a pair in both tables, a topic in one table only)."""
    monkeypatch.setattr(keyindex, "SCAN_CHUNK", chunk)
    monkeypatch.setattr(FilterBuild, "start", lambda self: None)  # this test runs the scans itself
    path = tmp_path / "keys.sqlite"
    KeyIndex(path).close()
    with sqlite3.connect(path) as db:
        for (table, topic), keys in SCANNED.items():
            db.executemany(f"INSERT INTO {table} (topic, key, seq, deliver_at) VALUES (?, ?, 1, 1)",
                           [(topic, k) for k in keys])
    db.close()
    db = keyindex.connect(path, 2048)
    try:
        db.execute("BEGIN")
        if sqlite3.sqlite_version_info >= (3, 38):
            assert keyindex.has_json(db)  # built in since 3.38: the JSON form is the one that runs
        ways = (True, False) if keyindex.has_json(db) else (False,)
        for (table, topic), keys in SCANNED.items():
            for as_json in ways:
                chunks = json_chunks(db, table, topic) if as_json else list(keyindex.scan_keys(db, table, topic))
                assert [k for c in chunks for k in c] == sorted(keys)  # (code points order as UTF-8 bytes do)
                assert [len(c) for c in chunks] == [chunk] * (len(keys) // chunk) + [len(keys) % chunk] * bool(len(keys) % chunk)
    finally:
        db.close()
    ki = KeyIndex(path)
    try:
        assert ki._build is not None and ki._build.as_json == ki.json_rows  # as the index writes them
        for as_json in ways:
            build = FilterBuild(path, [], as_json)
            build.scan()
            assert build.result is not None
            for topic in "abc":
                held = sorted({k for (_, t), keys in SCANNED.items() if t == topic for k in keys})
                assert build.result.maybe(topic, held) == held
            assert build.result.added == sum(map(len, SCANNED.values()))
    finally:
        ki.close()


def test_reset_forgets_the_filter_too(tmp_path: Path) -> None:
    held_index(tmp_path / "keys.sqlite", ["old"])
    ki = KeyIndex(tmp_path / "keys.sqlite")
    try:
        ki.reset()
        assert ki.filter_ready and ki.lookup_many("t", ["old"]) == {}
        ki.put_run("t", ["old"], 7, [7])
        ki.commit(7)
        assert ki.lookup("t", "old") == (7, 7, None)
    finally:
        ki.close()


def test_a_checkpoint_with_nothing_new_adds_nothing_to_the_write_ahead_log(tmp_path: Path) -> None:
    """An idle daemon checkpoints every second: with no change and the same log position, the
    key and far indexes' commits write no page (each wrote its meta page, 16 KiB a second)."""
    ki, far = KeyIndex(tmp_path / "keys.sqlite"), FarIndex(tmp_path / "far.sqlite")
    try:
        for index in (ki, far):
            wal = Path(f"{index.path}-wal")
            index.commit(5)
            size = wal.stat().st_size
            for _ in range(3):
                if index is ki:
                    ki.expire(1_000)  # (queued by every checkpoint; nothing is old enough here)
                index.commit(5)
            assert wal.stat().st_size == size and index.commit_pos == 5
            index.commit(6)
            assert wal.stat().st_size > size and index.commit_pos == 6
            index.reset()  # (forgets the position: the next commit records it again)
            assert index.commit_pos == 0
            index.commit(6)
            assert index.commit_pos == 6
    finally:
        ki.close()
        far.close()


ODD_KEYS = ["a\x00b", "\x00", 'q"', "back\\", "\n\t\r\b\f", "\x01\x1f\x7f", "\u2028", "é", "𝄞", "plain", "a\x00b"]


@pytest.mark.parametrize(("json_rows", "stretch"), [(True, keyindex.JSON_ROWS), (True, 2), (True, 3), (False, 2)])
def test_put_run_stores_any_key_as_put_many_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_rows: bool,
                                                 stretch: int) -> None:
    """The JSON rows (`key_rows_json`) and the bound rows they fall back to (a key holding a NUL,
    which SQLite's JSON functions cut short; an SQLite without them) store the same table; also
    in short stretches (JSON_ROWS), some in a gap of both tables with a NUL key at their ends."""
    monkeypatch.setattr(keyindex, "JSON_ROWS", stretch)
    ref, run = KeyIndex(tmp_path / "ref.sqlite"), KeyIndex(tmp_path / "run.sqlite")
    try:
        if sqlite3.sqlite_version_info >= (3, 38):
            assert run.json_rows  # built in since 3.38: the probe must see them
        run.json_rows = json_rows
        for topic, first in (("a", 1), ("b", 100), ("a", 200)):
            keys: list[str | None] = [*ODD_KEYS, None, f"k{first}"]
            dues = array("q", [7 * first + i for i in range(len(keys))])
            ref.put_many([(topic, k, first + i, dues[i]) for i, k in enumerate(keys) if k is not None])
            run.put_run(topic, keys, first, memoryview(dues.tobytes()).cast("q"))
        ref.commit(300)
        run.commit(300)
        assert rows_of(run) == rows_of(ref)
        assert len(rows_of(run)) == 2 * (len(set(ODD_KEYS)) + 1) + 1
        if json_rows:  # (the first put of each topic fell in a gap: into `keys`; the third is in `recent`)
            assert {t for t, in run.writer.execute("SELECT topic FROM keys")} == {"a", "b"}
            assert run.writer.execute("SELECT count(*) FROM recent WHERE topic = 'a' AND seq >= 200").fetchone()[0]
        assert run.lookup_many("a", ["a\x00b", "\x00"]) == {"a\x00b": (210, 1400 + 10, None), "\x00": (201, 1401, None)}
    finally:
        ref.close()
        run.close()


@pytest.mark.parametrize("gone_by", ["release", "expire"])
def test_a_pairs_older_row_in_keys_goes_with_its_newer_row_in_recent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    gone_by: str) -> None:
    """A pair put again while its older row is in `keys` (moved there from `recent`): lookups
    answer the newer row, and once that row is released or expires the older one does not
    answer in its place (with one table the newer row had replaced it)."""
    monkeypatch.setattr(keyindex, "MERGE_MIN", 1)
    monkeypatch.setattr(keyindex, "MERGE_SCALE", 0)
    ki = KeyIndex(tmp_path / "keys.sqlite")
    try:
        ki.put_many([("t", "k", 1, 100)])
        ki.commit(1)  # ... and moved into `keys` by the same checkpoint
        assert [r[:3] for r in ki.writer.execute("SELECT topic, key, seq FROM keys")] == [("t", "k", 1)]
        ki.put_many([("t", "k", 2, 200)])
        ki.commit(2)  # `recent` holds one row, under MERGE_MIN... then moves too: stop that
        ki.put_many([("t", "k", 3, 300)])
        monkeypatch.setattr(keyindex, "MERGE_MIN", 10)
        ki.commit(3)
        assert [r[:3] for r in ki.writer.execute("SELECT topic, key, seq FROM recent")] == [("t", "k", 3)]
        assert [r[:3] for r in ki.writer.execute("SELECT topic, key, seq FROM keys")] == [("t", "k", 2)]
        assert ki.lookup("t", "k") == (3, 300, None)
        if gone_by == "release":
            ki.release("t", "k", 3)
        else:
            ki.delivered([(1000, "t", "k", 3)])
            ki.expire(1001)
        ki.commit(4)
        ki._filter = None  # (asked of the tables, not the filter)
        assert ki.lookup("t", "k") is None
        assert rows_of(ki) == []
    finally:
        ki.close()


def test_keys_in_a_gap_of_both_tables_go_straight_into_keys_the_others_into_recent(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys that arrive in order skip `recent` and its move into `keys`: a checkpoint's stretch of
    keys (JSON_ROWS, here 3) under which neither table holds a row goes into `keys`; a stretch
    that a held pair falls in goes into `recent`, where a put of a pair held in `recent` must go
    too (in `keys` it would answer under the older row), and the row counts that decide the move
    follow them."""
    monkeypatch.setattr(keyindex, "JSON_ROWS", 3)
    ki = KeyIndex(tmp_path / "keys.sqlite")
    if not ki.json_rows:
        ki.close()
        pytest.skip("an SQLite without JSON functions: every key is bound into `recent`")

    def table(name: str) -> list[tuple[str, str, int]]:
        return [r for r in ki.writer.execute(f"SELECT topic, key, seq FROM {name} ORDER BY topic, key")]
    try:
        ki.put_run("t", ["k10", "k11", "k12", "k13"], 1, [1, 2, 3, 4])  # stretches k10-k12, k13
        ki.commit(4)
        assert table("keys") == [("t", "k10", 1), ("t", "k11", 2), ("t", "k12", 3), ("t", "k13", 4)]
        assert table("recent") == [] and ki._rows == [0, 4]
        # In key order k115 k20 k21 (k12 and k13 lie between), then k30 k31 (a gap), and u's k10.
        ki.put_run("t", ["k20", "k21", "k115", "k30", "k31"], 5, [5, 6, 7, 8, 9])
        ki.put_run("u", ["k10"], 10, [10])
        ki.put_many([("t", "k50", 11, 11)])  # (a single put: always into `recent`)
        ki.commit(11)
        assert table("recent") == [("t", "k115", 7), ("t", "k20", 5), ("t", "k21", 6), ("t", "k50", 11)]
        assert table("keys")[-3:] == [("t", "k30", 8), ("t", "k31", 9), ("u", "k10", 10)]
        assert ki._rows == [4, 7] == keyindex.table_rows(ki.writer)
        ki.put_run("t", ["k50"], 12, [12])  # held in `recent` only
        ki.commit(12)
        assert ("t", "k50", 12) in table("recent") and all(r[1] != "k50" for r in table("keys"))
        ki._filter = None  # (asked of the tables)
        assert ki.lookup_many("t", ["k50", "k30", "k115"]) == {"k50": (12, 12, None), "k30": (8, 8, None),
                                                               "k115": (7, 7, None)}
    finally:
        ki.close()


def test_a_version_1_index_is_read_as_it_is_and_marked_version_2(tmp_path: Path) -> None:
    """An index written before `recent` existed: its rows answer from `keys`, new rows go to
    `recent`, and the file says version 2 from then on (so version 1 refuses it)."""
    path = tmp_path / "keys.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE keys (topic TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, "
               "deliver_at INTEGER NOT NULL, done_at INTEGER, PRIMARY KEY (topic, key)) WITHOUT ROWID")
    db.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER) WITHOUT ROWID")
    db.execute("INSERT INTO keys VALUES ('t', 'old', 7, 70, NULL)")
    db.execute("INSERT INTO meta VALUES ('commit_pos', 5)")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    ki = KeyIndex(path)
    try:
        assert keyindex.stored_version(path) == keyindex.KEYINDEX_VERSION == 2
        assert ki.commit_pos == 5 and ki.count() == 1
        ki.put_many([("t", "new", 8, 80)])
        ki.commit(6)
        assert list(ki.db.execute("SELECT key FROM recent")) == [("new",)]
        assert ki.lookup_many("t", ["old", "new", "none"]) == {"old": (7, 70, None), "new": (8, 80, None)}
    finally:
        ki.close()
    ki = KeyIndex(path)  # a filter built from both tables
    try:
        deadline = time.monotonic() + 10
        while not ki.filter_ready:
            assert time.monotonic() < deadline, "the key filter was never built"
            time.sleep(0.01)
        assert ki._filter is not None and ki._filter.maybe("t", ["old", "new"]) == ["old", "new"]
        assert ki.lookup_many("t", ["old", "new", "none"]) == {"old": (7, 70, None), "new": (8, 80, None)}
    finally:
        ki.close()


def test_a_new_index_has_big_pages_and_one_made_with_small_pages_keeps_them(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A new index (keys or far) is made with PAGE_SIZE pages; an index made with SQLite's 4 KiB
    pages (every index before them) keeps them, and is read and written as before."""
    def page_size(db: sqlite3.Connection) -> int:
        return int(db.execute("PRAGMA page_size").fetchone()[0])

    ki, far = KeyIndex(tmp_path / "new-keys.sqlite"), FarIndex(tmp_path / "new-far.sqlite")
    try:
        assert page_size(ki.db) == page_size(ki.writer) == page_size(far.db) == keyindex.PAGE_SIZE > 4096
    finally:
        ki.close()
        far.close()
    path = tmp_path / "keys.sqlite"
    with monkeypatch.context() as m:
        m.setattr(keyindex, "PAGE_SIZE", 4096)
        ki = KeyIndex(path)
        ki.put_many([("t", "old", 7, 70)])
        ki.commit(5)
        ki.close()
    ki = KeyIndex(path)
    try:
        assert page_size(ki.db) == page_size(ki.writer) == 4096
        ki.put_run("t", ["new", None], 8, array("q", [80, 90]))
        ki.commit(6)
        assert ki.lookup_many("t", ["old", "new", "none"]) == {"old": (7, 70, None), "new": (8, 80, None)}
        assert ki.commit_pos == 6 and ki.count() == 2
    finally:
        ki.close()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.sampled_from(["a", "b", "é"]), st.text(min_size=1, max_size=4),
                          st.integers(1, 99)), max_size=30))
def test_deliveries_are_written_in_key_order_every_one_of_them(rows: list[tuple[int, str, str, int]]) -> None:
    """`delivery_order` keeps every row and puts them in the primary key's order (topic, then key,
    as UTF-8 bytes: SQLite's BINARY collation); rows of one pair keep their order."""
    got = keyindex.delivery_order(rows)
    assert sorted(got) == sorted(rows)
    assert got == sorted(rows, key=lambda r: (r[1].encode(), r[2].encode()))  # (a stable sort)
