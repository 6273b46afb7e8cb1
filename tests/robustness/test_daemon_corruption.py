"""Damage a stopped data directory of the real daemon, start it again, and check what it says
and what it delivers (the storage-level variants are in test_storage_corruption.py; this is
the same idea one level up: the real process, its log line, its HTTP answers, `delayd check`).

The directory is built once: 40 messages delivered and acked, 200 pending (due a few seconds
after the build) of which 20 were cancelled, several commit-log segments, and a graceful stop
(so there is a checkpoint and a checkpoint.prev). Each case copies it, injects one fault, runs
`delayd check` (exit 1, the fault named), starts the daemon and requires that it starts, logs a
recovery line that says what it repaired, serves nothing corrupt, delivers every message it can
still read exactly once, never delivers a cancelled or acked one, and leaves a directory that
`delayd check` passes after a clean stop.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from storage.commitlog import Record, RecordType
from storage.inspect import ReadOnlySegments, scan_records
from tests.integration.wire import Api, call, now_ms
from tests.support.daemon import ROOT, DaemonProcess, wait_until

CONFIG = "precision_ms = 100\ncheckpoint_interval_ms = 200\nsegment_bytes = 16384\n"
TOPIC = "dmg"


@dataclass
class Built:
    dir: Path
    bodies: dict[str, str] = field(default_factory=dict)  # id -> body of every produced message
    acked: set[str] = field(default_factory=set)
    pending: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)


def seq_of(mid: str) -> int:
    return int(mid.split("-", 1)[1], 16)


def delayd_check(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", "check", str(data_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def records(data_dir: Path) -> list[tuple[int, Record | Exception, int]]:
    segs = ReadOnlySegments(data_dir / "commitlog")
    try:
        return list(scan_records(segs))
    finally:
        segs.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    root = tmp_path_factory.mktemp("corrupt")
    d = DaemonProcess(root / "data", config_text=CONFIG).start()
    b = Built(root / "data")
    api = Api(d)
    api.subscribe(TOPIC, "g")
    for m, body in zip(api.produce(TOPIC, *({"body": f"early-{i}-" + "e" * 60} for i in range(40))),
                       (f"early-{i}-" + "e" * 60 for i in range(40)), strict=True):
        b.bodies[m["id"]] = body
    got = api.pull_until(TOPIC, "g", 40, timeout_s=15, ack=True, max=100)
    b.acked = {m["id"] for m in got}
    due = now_ms() + 4000
    bodies = [f"pending-{i}-" + "p" * (40 + i % 50) for i in range(200)]
    for chunk in range(0, 200, 50):
        out = api.produce(TOPIC, *({"body": x, "deliver_at": due + i} for i, x in
                                   enumerate(bodies[chunk:chunk + 50], chunk)))
        for m, x in zip(out, bodies[chunk:chunk + 50], strict=True):
            b.bodies[m["id"]] = x
            b.pending.add(m["id"])
    for mid in sorted(b.pending, key=seq_of)[::10]:
        assert api.call("DELETE", f"/v1/messages/{mid}").status == 200
        b.cancelled.add(mid)
    assert d.stop() == 0
    assert (b.dir / "checkpoint").exists() and (b.dir / "checkpoint.prev").exists()
    segments = sorted((b.dir / "commitlog").iterdir())
    assert len(segments) >= 3, segments
    clean = delayd_check(b.dir)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    return b


# -- faults -----------------------------------------------------------------------------------------
def flip_message_bytes(data_dir: Path) -> None:
    """Flip bytes inside the body of a pending message in a middle segment."""
    segs = sorted((data_dir / "commitlog").iterdir())
    middle = segs[len(segs) // 2]
    base = int(middle.name)
    for off, rec, _n in records(data_dir):
        if isinstance(rec, Record) and rec.type == RecordType.MESSAGE and off > base + 200 \
                and rec.body.startswith(b"pending") and off + rec.size < base + middle.stat().st_size:
            with open(middle, "r+b") as f:
                f.seek(off - base + rec.size - 5)
                f.write(bytes(x ^ 0xFF for x in f.read(3)))
            return
    raise AssertionError("no pending message in the middle segment")


def truncate_tail(data_dir: Path) -> None:
    """Cut the last record of the last segment in half (a torn write)."""
    last = sorted((data_dir / "commitlog").iterdir())[-1]
    off, rec, _n = records(data_dir)[-1]
    assert isinstance(rec, Record)
    with open(last, "r+b") as f:
        f.truncate(off - int(last.name) + rec.size // 2)


def delete(*names: str):
    def fault(data_dir: Path) -> None:
        for name in names:
            p = data_dir / name
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    fault.__name__ = "delete " + " ".join(names)
    return fault


FAULTS = {
    "flip-bytes": (flip_message_bytes, "damaged records"),
    "truncate-tail": (truncate_tail, "bytes truncated"),
    "no-timerwheel": (delete("timerwheel"), "wheel rebuilt"),
    "no-checkpoint": (delete("checkpoint"), "checkpoint fell back"),
    "no-checkpoints": (delete("checkpoint", "checkpoint.prev"), "checkpoint none"),
    "no-msgtable": (delete("msgtable"), None),
    "no-timerlog": (delete("timerlog"), None),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_then_restart(built, tmp_path, fault):
    inject, says = FAULTS[fault]
    data = tmp_path / "data"
    shutil.copytree(built.dir, data)
    inject(data)
    # What the fault left readable is what must be delivered: intact messages minus intact cancels.
    intact = [rec for _off, rec, _n in records(data) if isinstance(rec, Record)]
    readable = {f"d-{r.seq:x}" for r in intact if r.type == RecordType.MESSAGE} & built.pending
    cancelled = {f"d-{r.seq:x}" for r in intact if r.type == RecordType.CANCEL}
    lost = built.pending - readable
    if fault in ("flip-bytes", "truncate-tail"):
        assert lost or cancelled != built.cancelled, "the fault destroyed nothing"
    else:
        assert not lost and cancelled == built.cancelled
    report = delayd_check(data)
    assert report.returncode == 1, f"`delayd check` did not notice {fault}:\n{report.stdout}{report.stderr}"
    assert "PROBLEM" in report.stdout

    d = DaemonProcess(data, config_text=CONFIG).start()
    try:
        lines = [ln for ln in d.log_path.read_text().splitlines() if "recovery done" in ln]
        assert lines, d.log_tail()
        if says is not None:
            assert says in lines[-1], f"the recovery line does not say what it repaired:\n{lines[-1]}"
        api = Api(d)
        want = readable - cancelled
        got = api.pull_until(TOPIC, "g", len(want), timeout_s=30, ack=True, max=1000)
        ids = [m["id"] for m in got]
        assert len(ids) == len(set(ids)), "delivered twice"
        assert set(ids) == want, (f"missing {len(want - set(ids))}, unexpected "
                                  f"{sorted(set(ids) - want, key=seq_of)[:10]}")
        for m in got:
            assert m["body"] == built.bodies[m["id"]], "served a corrupt body"
            assert m["delivered_at"] >= m["deliver_at"]
        assert api.pull(TOPIC, "g", wait_ms=500) == [], "acked or cancelled messages came back"
        for mid in sorted(cancelled, key=seq_of)[:5]:
            assert api.state(mid) == "cancelled"
        for mid in lost:
            r = call(d, "GET", f"/v1/messages/{mid}")
            assert r.status == 404 or r.body.get("body") == built.bodies[mid], r.raw[:200]
        wait_until(lambda: api.stats()["scheduled"] == 0, 10, what="nothing left scheduled")
        assert "unexpected failure" not in d.log_path.read_text()
    finally:
        assert d.stop() == 0
    after = delayd_check(data)
    assert after.returncode == 0, f"still damaged after recovery and a clean stop:\n{after.stdout}"


def test_clean_directory_checks_clean(built):
    result = delayd_check(built.dir)
    assert result.returncode == 0 and "OK" in result.stdout.splitlines()[0], result.stdout
