"""The daemon's lifecycle around its data directory: it is opened (LOCK, format check, node id)
before the port is bound; data from a newer build is refused with nothing changed; the node id is
the directory's; the pipeline reports its stages' states and drains at shutdown."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
import zlib
from pathlib import Path

from delayd.storage.commitlog import CommitLog
from delayd.storage.datadir import META_VERSION
from delayd.storage.segments import list_segments, segment_name

from tests.integration.wire import Api, call
from tests.support.daemon import ROOT, DaemonProcess, free_port

STAGES = ("enqueue_get", "enqueue_put", "dequeue_get", "dequeue_get_message", "dequeue_put")


def checksums(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def serve(data_dir: Path, *args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    """`delayd serve` in the foreground, for a daemon that is expected to refuse to start."""
    cmd = [sys.executable, "-m", "delayd", "serve", "--data-dir", str(data_dir), "--listen",
           f"127.0.0.1:{free_port()}", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_a_second_daemon_on_the_same_directory_fails_before_listening(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        r = serve(d.data_dir)
        assert r.returncode == 1, r.stderr
        assert "is in use by another process" in r.stderr and "cannot start" in r.stderr
        assert "listening" not in r.stderr, "it must not claim to listen on a directory it cannot open"
        assert call(d, "GET", "/readyz").status == 200  # the first one is untouched
    finally:
        d.stop()


def test_a_commit_log_from_a_newer_build_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """Issue 13's defect: five records, the last two of a newer format version with correct CRCs,
    no checkpoint to skip past them. This build must refuse to start and change nothing — before
    the fix, recovery took them for a torn tail and cut them ("102 bytes truncated")."""
    d = DaemonProcess(tmp_path / "data")
    d.start()
    api = Api(d)
    for i in range(5):
        api.produce("newer", {"body": f"m{i}", "delay_ms": 3_600_000})
    assert d.stop() == 0
    base = list_segments(d.data_dir / "commitlog")[-1]
    log = CommitLog(d.data_dir / "commitlog", readonly=True)
    recs = [r for r in log.scan(base) if r.topic == "newer"]
    log.close()
    seg = d.data_dir / "commitlog" / segment_name(base)
    raw = bytearray(seg.read_bytes())
    for r in recs[-2:]:
        at = r.offset - base
        raw[at + 8] = 2  # the version byte
        struct.pack_into("<I", raw, at + 4, zlib.crc32(bytes(raw[at + 8:at + r.size])))
    seg.write_bytes(bytes(raw))
    for name in ("checkpoint", "checkpoint.prev"):
        (d.data_dir / name).unlink()
    before = checksums(d.data_dir)
    r = serve(d.data_dir, "--node-id", "d")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "format version 2, but this build reads versions up to 1" in r.stderr
    assert "truncated" not in r.stderr and "cut" not in r.stderr
    assert checksums(d.data_dir) == before, "a refused start must not change any file"


def test_meta_from_a_newer_build_is_refused_before_the_port_is_bound(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    assert d.stop() == 0
    meta = d.data_dir / "meta"
    raw = bytearray(meta.read_bytes())
    struct.pack_into("<H", raw, 4, META_VERSION + 1)  # the data directory's format version
    meta.write_bytes(bytes(raw))
    before = checksums(d.data_dir)
    r = serve(d.data_dir)
    assert r.returncode == 1 and f"meta: format version {META_VERSION + 1}, but this build reads versions up to {META_VERSION}" in r.stderr
    assert "listening" not in r.stderr
    assert checksums(d.data_dir) == before


def test_the_node_id_is_generated_once_and_kept(tmp_path: Path) -> None:
    a = DaemonProcess(tmp_path / "a", node_id=None).start()
    b = DaemonProcess(tmp_path / "b", node_id=None).start()
    try:
        ida, idb = call(a, "GET", "/v1/info").body["node_id"], call(b, "GET", "/v1/info").body["node_id"]
        assert ida != idb and ida != "d" and ida.isalnum(), "two daemons on defaults are two shards"
        mid = Api(a).produce("n", {"body": "x", "delay_ms": 3_600_000})[0]["id"]
        assert mid.startswith(ida + "-")
        assert call(a, "GET", "/v1/stats").body["node_id"] == ida
        a.restart()
        assert call(a, "GET", "/v1/info").body["node_id"] == ida
        assert Api(a).state(mid) == "scheduled", "its ids still resolve after a restart"
    finally:
        a.stop()
        b.stop()
    # A different node id configured for that directory is refused: its ids would stop resolving.
    r = serve(a.data_dir, "--node-id", "other")
    assert r.returncode == 1 and f"belongs to node '{ida}'" in r.stderr and "listening" not in r.stderr
    # The same one configured is fine.
    a.node_id = ida
    a.start()
    assert call(a, "GET", "/v1/info").body["node_id"] == ida
    a.stop()


def test_a_directory_from_before_node_ids_keeps_d(tmp_path: Path) -> None:
    """Its data was written by a build that had no `meta` file and issued `d-` ids."""
    d = DaemonProcess(tmp_path / "data").start()
    mid = Api(d).produce("legacy", {"body": "x", "delay_ms": 3_600_000})[0]["id"]
    assert d.stop() == 0 and mid.startswith("d-")
    (d.data_dir / "meta").unlink()  # as the old build left it
    d.node_id = None
    d.start()
    try:
        assert call(d, "GET", "/v1/info").body["node_id"] == "d"
        assert Api(d).state(mid) == "scheduled"
    finally:
        d.stop()


def test_stats_report_each_stage_state_and_shutdown_drains(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    api = Api(d)
    states = api.stats()["pipeline_state"]
    assert set(states) == set(STAGES) and set(states.values()) <= {"running", "waiting"}
    assert set(api.stats()["pipeline"]) == set(STAGES)
    api.produce("drain", *({"body": f"{i}", "delay_ms": 0} for i in range(200)))
    assert d.stop() == 0
    log = d.log_path.read_text()
    assert "did not drain" not in log and "shutdown ◆ 200 produced" in log
    d.start()
    # Nothing was lost or doubled by the drain: every message is delivered exactly once.
    got = api.pull_until("drain", "g", 200, timeout_s=15, ack=True, max=200)
    assert sorted(int(m["body"]) for m in got) == list(range(200))
    assert api.pull("drain", "g", wait_ms=300) == []
    d.stop()
