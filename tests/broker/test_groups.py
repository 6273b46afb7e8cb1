"""Consumer-group state on a real store: leases, the ack floor, backoff, dead letters,
redrive, and the snapshot + event replay that a restart relies on."""

from __future__ import annotations

import pytest
from delayd.broker.groups import Delivery, Groups, backoff_ms
from delayd.storage.recovery import open_store
from delayd.storage.store import NewMessage, StoreConfig

from tests.storage.driver import release_now


def rc(d: Delivery) -> str:
    """The full receipt as the API hands it out: `<message id>.<index>.<token>`."""
    return f"d-{d.unit.seq:x}.{d.receipt}"


@pytest.fixture
def env(tmp_path):
    now = [1_000_000]
    store, _report = open_store(tmp_path, StoreConfig(), lambda: now[0])
    events = []
    groups = Groups(store, lambda: now[0], lambda t, g, ev: events.append((t, g, ev)), default_max_attempts=3)
    seqs = store.append_messages([NewMessage("t", f"m{i}".encode(), now[0], tag="a" if i % 2 else "b")
                                  for i in range(6)], now[0])
    release_now(store, seqs, now[0])
    yield store, groups, events, now
    store.close()


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
