"""Consumer-group state on a real store: leases, the ack floor, backoff, dead letters,
redrive, and the snapshot + event replay that a restart relies on."""

from __future__ import annotations

import copy
import itertools

import pytest
from delayd.broker.groups import Delivery, Group, Groups, backoff_ms
from delayd.storage import batch
from delayd.storage.recovery import open_store
from delayd.storage.store import NewMessage, StoreConfig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.driver import release_now


def rc(d: Delivery) -> str:
    """The full receipt as the API hands it out: `<message id>.<index>.<token>`."""
    return f"d-{d.unit.seq:x}.{d.receipt}"


def _groups_over(tmp_path, n: int):
    """A store with `n` released messages on topic t (tags b, a, b, a, ...) and Groups over it."""
    now = [1_000_000]
    store, _report = open_store(tmp_path, StoreConfig(), lambda: now[0])
    events = []
    groups = Groups(store, lambda: now[0], lambda t, g, ev: events.append((t, g, ev)), default_max_attempts=3)
    seqs = store.append_messages([NewMessage("t", f"m{i}".encode(), now[0], tag="a" if i % 2 else "b")
                                  for i in range(n)], now[0])
    release_now(store, seqs, now[0])
    yield store, groups, events, now
    store.close()


@pytest.fixture
def env(tmp_path):
    yield from _groups_over(tmp_path, 6)


def test_lease_ack_floor_and_redelivery(env):
    store, groups, events, now = env
    g = groups.get_or_create("t", "g")
    got = groups.take(g, 4, lease_ms=1000, tags=None)
    assert [d.unit.index for d in got] == [0, 1, 2, 3] and {d.attempt for d in got} == {1}
    n, stale = groups.ack(g, [rc(got[1]), rc(got[0]), "nonsense"])
    assert (n, stale) == (2, ["nonsense"]) and g.floor == 2
    assert groups.ack(g, [rc(got[0])]) == (0, [rc(got[0])]), "a second ack is stale"
    now[0] += 1000  # leases of 2 and 3 expire
    again = groups.take(g, 10, lease_ms=1000, tags=None)
    assert sorted((d.unit.index, d.attempt) for d in again) == [(2, 2), (3, 2), (4, 1), (5, 1)]
    assert groups.ack(g, [rc(got[2])]) == (0, [rc(got[2])]), "an expired lease's receipt is stale"


def test_nack_backoff_dead_letters_and_redrive(env):
    store, groups, events, now = env
    g = groups.get_or_create("t", "g")
    assert backoff_ms(1) == 1000 and backoff_ms(2) == 2000 and backoff_ms(30) == 600_000
    for attempt in (1, 2, 3):
        (d,) = groups.take(g, 1, lease_ms=5000, tags=None)
        assert (d.unit.index, d.attempt) == (0, attempt)
        assert groups.nack(g, [rc(d)], delay_ms=10) == (1, [])
        assert groups.take(g, 1, lease_ms=5000, tags=None)[0].unit.index != 0 or attempt == 3
        for other in list(g.leases):
            if other != 0:
                g.leases.pop(other)
                g.mark_done(other)
        now[0] += 10
    assert 0 in g.dead and g.dead[0].reason == "nacked" and g.dead[0].attempt == 3
    assert any(ev["op"] == "dead" for _t, _g, ev in events)
    assert groups.redrive(g, None) == 1 and not g.dead
    (d,) = groups.take(g, 1, lease_ms=5000, tags=None)
    assert (d.unit.index, d.attempt) == (0, 1), "redrive starts the count again"


def test_tags_skip_messages_for_the_group(env):
    store, groups, events, now = env
    g = groups.get_or_create("t", "tagged")
    got = groups.take(g, 10, lease_ms=1000, tags=["a"])
    assert [d.unit.index for d in got] == [1, 3, 5]
    assert groups.take(g, 10, lease_ms=1000, tags=None) == [], "skipped ones count as consumed here"


def test_snapshot_and_events_restore_state(env):
    store, groups, events, now = env
    g = groups.get_or_create("t", "g")
    got = groups.take(g, 6, lease_ms=1000, tags=None)
    groups.ack(g, [rc(got[0]), rc(got[2])])
    snap = groups.snapshot()
    groups.ack(g, [rc(got[1])])  # after the snapshot: must come back from the event log
    later = [ev for ev in events if ev[2]["op"] == "ack"][-1:]
    fresh = Groups(store, lambda: now[0], lambda *a: None, default_max_attempts=3)
    fresh.restore(snap, later)
    h = fresh.groups["t/g"]
    assert h.floor == 3 and h.cursor == 3, "acked 0,1,2; everything else is delivered again"
    redo = fresh.take(h, 10, lease_ms=1000, tags=None)
    assert [d.unit.index for d in redo] == [3, 4, 5] and {d.attempt for d in redo} == {1}


def test_delete_logs_an_event_and_replay_removes_the_group(env):
    store, groups, events, now = env
    g = groups.get_or_create("t", "g")
    (d,) = groups.take(g, 1, lease_ms=1000, tags=None)
    snap = groups.snapshot()
    assert groups.delete("t", "g") is True
    assert "t/g" not in groups.groups and g.deleted and not g.leases
    assert events[-1] == ("t", "g", {"op": "delete"})
    assert groups.delete("t", "g") is False, "a second delete finds nothing"
    assert len([ev for ev in events if ev[2]["op"] == "delete"]) == 1
    assert groups.needed() == {}, "a deleted group no longer pins the topic's segments"
    # A restart from a snapshot taken before the delete replays the delete.
    fresh = Groups(store, lambda: now[0], lambda *a: None, default_max_attempts=3)
    fresh.restore(snap, [events[-1]])
    assert fresh.groups == {}
    # Re-created after the delete: a new group from the start, not the old position.
    fresh2 = Groups(store, lambda: now[0], lambda *a: None, default_max_attempts=3)
    fresh2.restore(snap, [events[-1], ("t", "g", {"op": "create", "start": 0, "mode": "earliest",
                                                  "max_attempts": 5})])
    assert fresh2.groups["t/g"].max_attempts == 5 and fresh2.groups["t/g"].floor == 0


def test_oldest_unacked_due_time(env):
    store, groups, events, now = env
    g = groups.get_or_create("t", "g")
    first = store.queue("t").read(0, 1)[0]
    assert groups.oldest_unacked_due_ms(g) == first.deliver_at
    got = groups.take(g, 6, lease_ms=1000, tags=None)
    assert groups.oldest_unacked_due_ms(g) == first.deliver_at, "leased is not acked"
    groups.ack(g, [rc(d) for d in got])
    assert groups.oldest_unacked_due_ms(g) is None


# -- the ack of a whole take (Groups.ack_whole) against the ack receipt by receipt ----------------

@pytest.fixture
def env40(tmp_path):
    yield from _groups_over(tmp_path, 40)


def _state(g) -> tuple:
    return (g.floor, g.cursor, sorted(g.done), sorted((i, lease.token, lease.out) for i, lease in g.leases.items()),
            dict(g.attempts), g.acked_total)


_NAMES = itertools.count()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_ack_fast_path_matches_ack_receipt_by_receipt(env40, data) -> None:
    """Takes of several leases, some expired, some messages already acked out of order; then an
    ack of any mix of their receipts (whole takes, parts, repeats, strangers, garbage): `ack`
    (which takes the whole-take path when it can) and `_ack_each` leave the same group state,
    answer the same and log the same record."""
    store, groups, events, now = env40
    g = groups.get_or_create("t", f"g{next(_NAMES)}")
    takes: list[list[str]] = []
    for _ in range(data.draw(st.integers(1, 4), "takes")):
        got = groups.take(g, data.draw(st.integers(1, 12), "n"), lease_ms=data.draw(st.sampled_from([1, 1000])),
                          tags=None)
        takes.append([rc(d) for d in got])
    receipts = [r for t in takes for r in t]
    if receipts and data.draw(st.booleans(), "ack some first"):
        groups.ack(g, data.draw(st.lists(st.sampled_from(receipts), max_size=8)))
    now[0] += data.draw(st.integers(0, 2), "later")  # leases of 1 ms expire
    if takes and data.draw(st.booleans(), "one whole take"):
        picks = list(data.draw(st.sampled_from(takes)))
    else:
        picks = data.draw(st.lists(st.sampled_from(receipts) if receipts else st.just("x.1.y"), max_size=30))
    picks += data.draw(st.lists(st.sampled_from(["nonsense", "d-0.0.zz", "d-1.zz.", ""]), max_size=2), "junk")
    twin = copy.deepcopy(g)
    at = len(events)
    answer = groups.ack(g, picks)
    logged = events[at:]
    del events[at:]
    assert answer == groups._ack_each(twin, picks, now[0])
    assert logged == events[at:]
    assert _state(g) == _state(twin)


def _two_takes(env, second_lease_ms: int) -> tuple:
    """Two takes of 10 (leases of 1 s and `second_lease_ms`), their receipts, and `whole`:
    Groups.ack_whole of some receipts, now."""
    store, groups, events, now = env
    g = groups.get_or_create("t", "g")
    first = [rc(d) for d in groups.take(g, 10, lease_ms=1000, tags=None)]
    second = [rc(d) for d in groups.take(g, 10, lease_ms=second_lease_ms, tags=None)]

    def whole(receipts: list[str]) -> int | None:
        return groups.ack_whole(g, batch.ops.parse_receipts(receipts), now[0])

    return g, first, second, whole


def test_ack_of_a_whole_take_takes_the_fast_path(env40) -> None:
    store, groups, events, now = env40
    g, first, second, whole = _two_takes(env40, 1000)
    assert whole(first[:1] + second[:1]) is None, "two leases: receipt by receipt"
    assert whole(first + first[:1]) is None, "a repeat: the second is stale"
    assert whole([]) is None
    assert whole(list(reversed(second))) == 10
    assert g.floor == 0 and sorted(g.done) == list(range(10, 20))
    assert whole(first) == 10
    assert g.floor == 20 and not g.done and not g.leases
    assert [ev["idx"] for _t, _g, ev in events if ev["op"] == "ack"] == [list(range(19, 9, -1)), list(range(10))]


def test_the_ack_of_a_take_in_its_order_is_whole_only_while_all_of_it_is_out_and_live(env40) -> None:
    """The ack that names exactly a take's messages in their order (recognised by the take's
    packed indexes) is refused as a whole once one of them was settled or the lease expired."""
    store, groups, events, now = env40
    g, first, second, whole = _two_takes(env40, 5)
    assert groups.ack(g, first[3:4]) == (1, [])
    assert whole(first) is None, "one of them is no longer out"
    now[0] += 5
    assert whole(second) is None, "its lease expired"
    assert whole(first[:3] + first[4:]) == 9
    assert g.floor == 10 and not g.done
    assert groups.ack(g, first) == (0, first)


@settings(max_examples=300, deadline=None)
@given(floor=st.integers(0, 50), done=st.sets(st.integers(0, 120), max_size=20),
       attempts=st.dictionaries(st.integers(0, 120), st.integers(1, 3), max_size=3),
       indexes=st.lists(st.integers(0, 120), max_size=40), run=st.integers(0, 40))
def test_mark_done_many_in_order_matches_one_by_one(floor, done, attempts, indexes, run) -> None:
    """mark_done_many of a list that is exactly [floor, floor + n) skips the per-index steps;
    any list comes out as the same indexes one by one would."""
    g = Group("t", "g", 3, floor, floor + 60, done={i for i in done if i >= floor}, attempts=dict(attempts),
              revived={i for i in done if i < floor})
    twin = copy.deepcopy(g)
    batch = list(range(floor, floor + run)) if run % 2 else indexes  # in order, or anything
    g.mark_done_many(batch, ascending=run % 2 == 1)  # (a range is strictly ascending)
    twin.mark_done_many(iter(batch))
    assert (g.floor, g.cursor, g.done, g.attempts, g.revived) == (twin.floor, twin.cursor, twin.done, twin.attempts,
                                                                   twin.revived)
