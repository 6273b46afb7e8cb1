"""A full disk and failing fsyncs against the real daemon (fault file, see storage.segments.FAULTS).

Semantics under test (docs/reliability.md):
- ENOSPC on an append: produce answers 507 `disk_full` and stores nothing; a cancel answers 507
  and the message stays scheduled (it is delivered unless cancelled again later); the torn half
  of the write is cut off, so the data directory stays clean; the pipeline waits for room
  instead of dying, and once there is room again everything proceeds without a restart.
- A failed fsync: the request answers 507 (its outcome is unknown, as after a timeout: the
  record may still be there); the next durable answer fsyncs those appends again.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from delayd.storage import segments
from delayd.storage.errors import DiskFull, NotDurable
from delayd.storage.recovery import open_store
from delayd.storage.store import NewMessage

from tests.integration.wire import MSGPACK, Api, call, daemon_log_clean, now_ms, schedule_matches_scheduled
from tests.support.daemon import ROOT, DaemonProcess, wait_until

CONFIG = "precision_ms = 100\ncheckpoint_interval_ms = 200\n"


def check_dir(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """`delayd check DIR --config F`: with the daemon's config, for its storage geometry."""
    config = data_dir.parent / f"{data_dir.name}-check.toml"
    config.write_text(CONFIG)
    return subprocess.run([sys.executable, "-m", "delayd", "check", str(data_dir), "--config", str(config)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture
def faulty(tmp_path):
    fault = tmp_path / "faults"
    d = DaemonProcess(tmp_path / "data", config_text=CONFIG, env={"DELAYD_FAULT_FILE": str(fault)}).start()
    yield d, fault
    d.stop()


def test_enospc_refuses_cleanly_and_recovers_without_restart(faulty, tmp_path):
    d, fault = faulty
    api = Api(d)
    api.subscribe("full", "g")
    soon = api.produce("full", *({"body": f"soon{i}", "delay_ms": 1500} for i in range(20)))
    later = api.produce("full", *({"body": f"later{i}", "delay_ms": 60_000} for i in range(3)))
    api.produce("full", *({"body": f"far{i}", "delay_ms": 3 * 86_400_000} for i in range(2)))  # rolled
    t_soon = max(m["deliver_at"] for m in soon)

    fault.write_text("enospc\n")
    # Produce: 507 disk_full in either format, single or batch, and nothing stored.
    before = api.stats()["produced_total"]
    for fmt in ("application/json", MSGPACK):
        r = call(d, "POST", "/v1/topics/full/messages", {"messages": [{"body": "x"}, {"body": "y"}]}, fmt=fmt)
        assert r.status == 507 and r.body["error"]["code"] == "disk_full", (r.status, r.raw)
    assert api.stats()["produced_total"] == before

    # Cancel: 507, and the message is not reported cancelled afterwards (nothing half-done).
    victim = later[0]["id"]
    r = call(d, "DELETE", f"/v1/messages/{victim}")
    assert r.status == 507 and r.body["error"]["code"] == "disk_full", (r.status, r.raw)
    assert api.state(victim) == "scheduled"
    assert api.stats()["cancelled_total"] == 0

    # The pipeline cannot release `soon` into the ready queue meanwhile: it must wait, not die.
    wait_until(lambda: now_ms() > t_soon + 300, 10, what="the held messages to fall due")
    assert call(d, "GET", "/healthz").status == 200
    assert call(d, "GET", "/readyz").status == 200, "the daemon gave up under a full disk"
    assert d.proc is not None and d.proc.poll() is None
    assert api.pull("full", "g", max=100) == [], "released while every append fails?"

    # Room again: no restart, produce and cancel work, every held message arrives once.
    fault.write_text("")
    new = api.produce("full", {"body": "after"})
    assert api.call("DELETE", f"/v1/messages/{victim}").status == 200
    assert api.state(victim) == "cancelled"
    got = api.pull_until("full", "g", 21, timeout_s=15, ack=True, max=100)
    assert sorted(m["id"] for m in got) == sorted([m["id"] for m in soon] + [new[0]["id"]])
    assert all(m["delivered_at"] >= m["deliver_at"] for m in got)
    assert api.pull("full", "g", wait_ms=300) == []
    schedule_matches_scheduled(d)
    daemon_log_clean(d)

    # No partial record anywhere: recovery finds nothing to cut and `delayd check` is clean.
    assert d.stop() == 0
    result = check_dir(d.data_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    d.start()
    line = [ln for ln in d.log_tail(5).splitlines() if "recovery done" in ln][-1]
    assert " 0 bytes truncated, 0 damaged records" in line, line
    assert api.state(victim) == "cancelled"
    assert api.state(later[1]["id"]) == "scheduled"
    assert api.pull("full", "g", wait_ms=300) == [], "acked messages came back after the restart"
    schedule_matches_scheduled(d)


def test_schedule_counts_once_when_indexing_hit_a_full_disk(faulty):
    """Issue 17, item 4: produce goes on (the commit log has room) while enqueue-put cannot write
    the TimerLog and retries every 0.5 s; once there is room, /v1/schedule counts each pending
    message once — also after a kill -9 and restart (the counts are in the checkpoint)."""
    d, fault = faulty
    api = Api(d)
    fault.write_text("enospc@timerlog\n")
    ids = []
    for b in range(4):
        ids += [m["id"] for m in api.produce("sched", *({"body": f"{b}-{i}", "delay_ms": 120_000 + i}
                                                          for i in range(50)))]
        ids += [m["id"] for m in api.produce("sched", *({"body": f"far{b}-{i}", "delay_ms": 5 * 86_400_000 + i}
                                                          for i in range(10)))]
    # enqueue-put has failed and retried (it logs the first failure); nothing is indexed meanwhile.
    wait_until(lambda: "enqueue_put: DiskFull" in d.log_path.read_text(errors="replace"), 10, 0.05,
               "enqueue-put to hit the full disk")
    wait_until(lambda: api.stats()["pipeline"]["enqueue_put"] > 0 or api.stats()["pipeline"]["enqueue_get"] > 0,
               5, 0.05, "records waiting to be indexed")
    t_retry = now_ms() + 1200
    wait_until(lambda: now_ms() > t_retry, 5, 0.05, "two more retries")
    fault.write_text("")
    schedule_matches_scheduled(d)
    assert api.stats()["scheduled"] == len(ids) == 240
    d.kill9()
    d.start()
    schedule_matches_scheduled(d)
    assert api.stats()["scheduled"] == 240
    daemon_log_clean(d)


def test_enospc_on_ack_answers_507_and_keeps_at_least_once(faulty):
    """An ack that cannot be logged answers 507; its outcome is then unknown (as after a
    timeout): it may hold (the in-memory state can reach a checkpoint) or the messages come back
    after a crash. Either way each message was delivered, and nothing breaks."""
    d, fault = faulty
    api = Api(d)
    ids = {m["id"] for m in api.produce("acks", *({"body": str(i)} for i in range(5)))}
    got = api.pull_until("acks", "g", 5, timeout_s=10, lease_ms=1000)
    fault.write_text("enospc")
    r = call(d, "POST", "/v1/topics/acks/subscriptions/g/ack", {"receipts": [m["receipt"] for m in got]})
    assert r.status == 507 and r.body["error"]["code"] == "disk_full", (r.status, r.raw)
    fault.write_text("")
    d.kill9()
    d.start()
    again = api.pull("acks", "g", wait_ms=1500, max=100)
    assert {m["id"] for m in again} <= ids and len(again) == len({m["id"] for m in again})
    assert all(m["attempt"] == 1 for m in again)
    if again:
        assert api.ack("acks", "g", [m["receipt"] for m in again])["acked"] == len(again)
    assert api.pull("acks", "g", wait_ms=300) == []



def test_a_msgpack_ack_of_one_pull_answers_once_it_is_durable(faulty):
    """The ack the batch core reads in place (one pull's receipts, msgpack: Broker.ack_raw) waits
    for the fsync of its record like every ack: a failed fsync answers 507, not 200."""
    d, fault = faulty
    api = Api(d)
    api.produce("acks", *({"body": str(i)} for i in range(5)))
    api.pull_until("acks", "probe", 5)  # all five are ready: the pull below is one lease
    got = api.pull("acks", "g", fmt=MSGPACK, max=5, lease_ms=60_000)
    assert len(got) == 5
    fault.write_text("fsync-eio")
    r = call(d, "POST", "/v1/topics/acks/subscriptions/g/ack", {"receipts": [m["receipt"] for m in got]}, fmt=MSGPACK)
    assert r.status == 507 and r.body["error"]["code"] == "disk_full", (r.status, r.raw)
    fault.write_text("")
    r = call(d, "POST", "/v1/topics/acks/subscriptions/g/ack", {"receipts": [m["receipt"] for m in got]}, fmt=MSGPACK)
    assert r.status == 200 and r.body["acked"] + len(r.body["stale"]) == 5, (r.status, r.raw)
    assert api.pull("acks", "g", wait_ms=300) == []


def test_fsync_failure_answers_507_then_recovers(faulty):
    d, fault = faulty
    api = Api(d)
    keep = api.produce("fs", {"body": "keep", "delay_ms": 60_000})[0]["id"]
    fault.write_text("fsync-eio")
    r = call(d, "POST", "/v1/topics/fs/messages", {"body": "unsure"})
    assert r.status == 507 and r.body["error"]["code"] == "disk_full", (r.status, r.raw)
    r = call(d, "DELETE", f"/v1/messages/{keep}")
    assert r.status == 507 and r.body["error"]["code"] == "disk_full", (r.status, r.raw)
    assert call(d, "GET", "/healthz").status == 200
    fault.write_text("")
    # The cancel's outcome was unknown; a retry settles it and answers 200 (idempotent).
    assert api.call("DELETE", f"/v1/messages/{keep}").status == 200
    assert api.state(keep) == "cancelled"
    assert api.produce("fs", {"body": "fine"})
    daemon_log_clean(d)


async def test_group_commit_refsyncs_after_a_failed_fsync(tmp_path, monkeypatch):
    """In process: after a failed fsync, a waiter with no new append of its own must still get
    a real fsync of the earlier appends before it is told they are durable."""
    from delayd.broker.pipeline import GroupCommit

    fault = tmp_path / "faults"
    monkeypatch.setattr(segments, "FAULTS", segments.Faults(str(fault)))
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(segments.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    store, _report = open_store(tmp_path / "data")
    gc = GroupCommit(store, "always", 1000)
    task = asyncio.create_task(gc.run())
    try:
        store.append_messages([NewMessage("t", b"x", 0)], 0)
        fault.write_text("fsync-eio")
        with pytest.raises(NotDurable):
            await gc.durable()
        fault.write_text("")
        synced.clear()
        await gc.durable()  # nothing appended since the failure
        assert synced, "a durable() after a failed fsync returned without fsyncing the commit log"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()


def test_fault_hook_cuts_the_torn_half(tmp_path, monkeypatch):
    """In process: an append that hits ENOSPC half way leaves the segment as it was."""
    fault = tmp_path / "faults"
    monkeypatch.setattr(segments, "FAULTS", segments.Faults(str(fault)))
    store, _report = open_store(tmp_path / "data")
    try:
        store.append_messages([NewMessage("t", b"a" * 100, 0)], 0)
        end = store.commit.end
        fault.write_text("enospc")
        with pytest.raises(DiskFull):
            store.append_messages([NewMessage("t", b"b" * 1000, 0)], 0)
        assert store.commit.end == end
        seg = sorted((tmp_path / "data" / "commitlog").iterdir())[-1]
        assert seg.stat().st_size == end
    finally:
        store.close()
