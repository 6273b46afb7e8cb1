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

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from delayd.storage.commitlog import CommitLog, Record, RecordType
from delayd.storage.inspect import scan_items

from tests.integration.wire import Api, call, now_ms
from tests.support.daemon import ROOT, DaemonProcess

CONFIG = "precision_ms = 100\nroll_window_ms = 60000\ncheckpoint_interval_ms = 200\nsegment_bytes = 16384\n"
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
    """`delayd check DIR --config F`: with the daemon's config, for its storage geometry."""
    config = data_dir.parent / f"{data_dir.name}-check.toml"
    config.write_text(CONFIG)
    return subprocess.run([sys.executable, "-m", "delayd", "check", str(data_dir), "--config", str(config)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def records(data_dir: Path) -> list[tuple[int, Record | Exception, int]]:
    log = CommitLog(data_dir / "commitlog", readonly=True)
    try:
        return list(scan_items(log))
    finally:
        log.close()


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


# fault -> (inject, what the daemon log must say about it). A flipped byte in a record that was
# indexed before the checkpoint is not rescanned at recovery (restart is checkpoint + bounded
# rescan): it is found, named and dropped when its slot is dispatched.
FAULTS = {
    "flip-bytes": (flip_message_bytes, r"record at \d+ is unreadable \(ChecksumMismatch"),
    "truncate-tail": (truncate_tail, r"recovery done .* [1-9]\d* bytes truncated"),
    "no-timerwheel": (delete("timerwheel"), r"recovery done .*wheel rebuilt \(missing\)"),
    "no-checkpoint": (delete("checkpoint"), r"recovery done .*checkpoint fell back to checkpoint.prev"),
    "no-checkpoints": (delete("checkpoint", "checkpoint.prev"), r"recovery done .*checkpoint none"),
    # Not a fault: the previous checkpoint is only a fallback (a directory with one checkpoint
    # has none), so `delayd check` passes and recovery uses the current one.
    "no-checkpoint-prev": (delete("checkpoint.prev"), r"recovery done .*checkpoint ok"),
    "no-msgtable": (delete("msgtable"), r"recovery done .*message table (lacks entries|is missing).*full rescan"),
    "no-timerlog": (delete("timerlog"), r"recovery done .*TimerLog of \d+ bytes, found 0"),
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
    # A torn tail holds a write that was never answered: its effect may go either way.
    torn = built.cancelled - cancelled if fault == "truncate-tail" else set()
    if fault in ("flip-bytes", "truncate-tail"):
        assert lost or torn, "the fault destroyed nothing"
    else:
        assert not lost and cancelled == built.cancelled
    report = delayd_check(data)
    if fault == "no-checkpoint-prev":
        assert report.returncode == 0, report.stdout + report.stderr
    else:
        assert report.returncode == 1, f"`delayd check` did not notice {fault}:\n{report.stdout}{report.stderr}"
        assert "PROBLEM" in report.stdout

    d = DaemonProcess(data, config_text=CONFIG).start()
    try:
        assert "recovery done" in d.log_path.read_text(), d.log_tail()
        api = Api(d)
        want = readable - cancelled - torn
        got = api.pull_until(TOPIC, "g", len(want), timeout_s=30, ack=True, max=1000)
        got += api.pull(TOPIC, "g", wait_ms=500)  # nothing more: no duplicate, acked or cancelled one
        ids = [m["id"] for m in got]
        assert len(ids) == len(set(ids)), "delivered twice"
        assert want <= set(ids) <= want | torn, (f"missing {len(want - set(ids))}, unexpected "
                                                 f"{sorted(set(ids) - want, key=seq_of)[:10]}")
        log_text = d.log_path.read_text()
        assert re.search(says, log_text), f"the log does not say what was repaired:\n{d.log_tail(8)}"
        for m in got:
            assert m["body"] == built.bodies[m["id"]], "served a corrupt body"
            assert m["delivered_at"] >= m["deliver_at"]
        for mid in sorted(cancelled, key=seq_of)[:5]:
            assert api.state(mid) == "cancelled"
        for mid in lost:
            r = call(d, "GET", f"/v1/messages/{mid}")
            assert r.status == 404 or r.body.get("body") == built.bodies[mid], r.raw[:200]
        assert "unexpected failure" not in log_text and "fatal" not in log_text, d.log_tail()
    finally:
        assert d.stop() == 0
    after = delayd_check(data)
    if fault == "flip-bytes":
        # The damaged record stays where it is (mid-segment) until retention deletes the segment.
        problems = [ln for ln in after.stdout.splitlines() if "PROBLEM" in ln]
        assert len(problems) == 1 and "damaged record" in problems[0], after.stdout
    else:
        assert after.returncode == 0, f"still damaged after recovery and a clean stop:\n{after.stdout}"


def test_clean_directory_checks_clean(built):
    result = delayd_check(built.dir)
    assert result.returncode == 0 and "OK" in result.stdout.splitlines()[0], result.stdout
