"""The daemon-vs-Redis benchmark still runs: every workload in its smallest configuration
(`--smoke`) against the real daemon and a real redis-server, end to end through the CLI, and
every result field the table and BENCHMARKS.md rely on is there and sane.

This keeps the benchmark from rotting while the daemon changes; it measures nothing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.daemon_vs_redis import build_workloads, parse_args
from bench.workloads import SECTIONS, Accuracy, AccuracyLoad, Burst, Pending, Produce
from tests.support.daemon import ROOT, DaemonProcess

SIDES = ("delayd", "redis")


def number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/install-test-deps.sh installs it)")
    tmp = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, "-m", "bench.daemon_vs_redis", "--smoke", "--json", str(tmp / "out.json"),
           "--markdown-out", str(tmp / "out.md"), "--tmp-dir", str(tmp)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = json.loads((tmp / "out.json").read_text())
    out["markdown"] = (tmp / "out.md").read_text()
    out["tmp_left"] = [p.name for p in tmp.iterdir() if p.is_dir()]
    return out


def result(out: dict[str, Any], section: str, side: str) -> dict[str, Any]:
    r = out["results"][section][side]
    assert "error" not in r, r["error"]
    return dict(r)


def test_every_workload_ran_on_both_systems(smoke_run: dict[str, Any]) -> None:
    assert smoke_run["errors"] == {}
    assert set(smoke_run["results"]) == set(SECTIONS)
    for section in SECTIONS:
        assert set(smoke_run["results"][section]) == set(SIDES)
        for side in SIDES:
            env = result(smoke_run, section, side)["env"]
            assert env["wall_s"] > 0 and number(env["other_processes_cpu_share_pct"])
    assert smoke_run["tmp_left"] == [], "the benchmark's temp data dirs were not removed"


@pytest.mark.parametrize("side", SIDES)
def test_throughput_results_carry_server_cpu_per_message(smoke_run: dict[str, Any], side: str) -> None:
    produce = result(smoke_run, "produce", side)
    assert produce["messages"] == Produce.smoke().n and produce["msg_per_s"] > 0
    assert produce["server_cpu_s"] >= 0
    assert produce["server_cpu_us_per_msg"] == pytest.approx(produce["server_cpu_s"] * 1e6 / produce["messages"])
    assert produce["batch_rtt_p50_ms"] > 0 and produce["client_encode_s"] > 0 and produce["disk_bytes"] > 0
    burst = result(smoke_run, "burst", side)
    assert burst["fill_server_cpu_us_per_msg"] == pytest.approx(burst["fill_server_cpu_s"] * 1e6 / burst["messages"])
    drain = burst["drain"]
    assert drain["server_cpu_us_per_msg"] == pytest.approx(drain["server_cpu_s"] * 1e6 / burst["received"])
    memory = result(smoke_run, "memory", side)
    assert memory["fill_server_cpu_us_per_msg"] == pytest.approx(memory["fill_server_cpu_s"] * 1e6 / memory["pending"])


@pytest.mark.parametrize("side", SIDES)
def test_every_message_arrives_and_none_early(smoke_run: dict[str, Any], side: str) -> None:
    for section, n in (("accuracy", Accuracy.smoke().n), ("accuracy_load", AccuracyLoad.smoke().n)):
        acc = result(smoke_run, section, side)
        assert acc["received"] == acc["messages"] == n
        assert acc["duplicates"] == 0 and acc["early"] == 0
        assert 0 <= acc["p50_ms"] <= acc["p99_ms"] <= acc["max_ms"]
        assert acc["late_shape"]["late_by_ms_in_second_100ms_buckets"] and "worst_windows" in acc["late_shape"]
    load = result(smoke_run, "accuracy_load", side)
    # The concurrent producer ran in its own process, at about half the measured produce rate.
    assert load["load_messages"] > 0 and load["load_target_msg_per_s"] > 0
    assert 0 < load["load_msg_per_s"] <= 1.5 * load["load_target_msg_per_s"]
    burst = result(smoke_run, "burst", side)
    assert burst["received"] == burst["messages"] == Burst.smoke().m
    assert burst["fill_finished_before_due"] is True and burst["early"] == 0 and burst["duplicates"] == 0
    assert burst["all_pulled_after_due_s"] >= 0 and burst["drain_msg_per_s"] > 0


def test_system_specific_facts(smoke_run: dict[str, Any]) -> None:
    p = Pending.smoke().p
    d_acc, d_burst = result(smoke_run, "accuracy", "delayd"), result(smoke_run, "burst", "delayd")
    assert d_acc["acked"] == d_acc["messages"] and d_burst["acked"] == d_burst["messages"]
    assert d_burst["all_acked_after_due_s"] >= d_burst["all_pulled_after_due_s"]
    assert "error" not in result(smoke_run, "produce", "delayd")["stats_after"]
    d_mem = result(smoke_run, "memory", "delayd")
    assert d_mem["indexed"] is True and d_mem["scheduled_reported"] == p
    r_mem = result(smoke_run, "memory", "redis")
    assert r_mem["stored"] == p and r_mem["used_memory_bytes"] > r_mem["used_memory_idle_bytes"]
    assert result(smoke_run, "produce", "redis")["stored"] == Produce.smoke().n
    assert result(smoke_run, "restart", "redis")["stored_after_restart"] == p
    assert result(smoke_run, "restart", "delayd")["scheduled_after_restart"] >= p


@pytest.mark.parametrize("side", SIDES)
def test_memory_and_restart(smoke_run: dict[str, Any], side: str) -> None:
    mem = result(smoke_run, "memory", side)
    assert mem["pending"] == Pending.smoke().p
    assert mem["rss_bytes"] > 0 and mem["rss_idle_bytes"] > 0 and mem["disk_bytes"] > 0
    restart = result(smoke_run, "restart", side)
    assert restart["probe_delivered"] is True
    if side == "redis":  # it is killed only once its AOF buffer is written (see wait_written)
        assert isinstance(restart["probe_unwritten_at_ack"], bool) and restart["probe_write_wait_ms"] >= 0
    assert restart["probe_lateness_ms"] >= 0  # never before its deliver_at
    assert 0 < restart["spawn_to_ready_s"] <= restart["ready_after_kill_s"]


def test_table_and_markdown(smoke_run: dict[str, Any]) -> None:
    rows = smoke_run["table"]
    assert {r["workload"] for r in rows} == set(SECTIONS)
    for r in rows:
        assert r["delayd"] is not None and r["redis"] is not None, r
    metrics = {(r["workload"], r["metric"]) for r in rows}
    for wanted in [("produce", "server CPU per message"), ("burst", "drain server CPU per delivered message"),
                   ("burst", "fill server CPU per message"), ("memory", "fill server CPU per message")]:
        assert wanted in metrics
    md = smoke_run["markdown"]
    assert "| workload | metric | unit | delayd | redis | delayd/redis | target | ok |" in md
    assert "python -m bench.daemon_vs_redis --smoke" in md
    assert md.count("\n| ") == len(rows) + 1


def test_only_selects_sections() -> None:
    wls = build_workloads(parse_args(["--only", "restart,produce", "--scale", "0.5"]))
    assert [type(w) for w in wls] == [Produce, Pending]
    produce, pending = wls
    assert isinstance(produce, Produce) and produce.n == 100_000
    assert isinstance(pending, Pending) and pending.sections == ("restart",) and pending.p == 500_000
    with pytest.raises(SystemExit):
        parse_args(["--only", "nonsense"])


def test_daemon_process_command_prefix_and_session(tmp_path: Path) -> None:
    """The bench runs other builds through `command_prefix` and keeps Ctrl-C to itself with
    `new_session`."""
    d = DaemonProcess(tmp_path / "data", command_prefix=[sys.executable, "-X", "utf8", "-m", "delayd"],
                      new_session=True).start()
    try:
        assert d.proc is not None
        cmdline = Path(f"/proc/{d.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:6] == [b"-X", b"utf8", b"-m", b"delayd", b"serve"]
        assert os.getsid(d.proc.pid) == d.proc.pid != os.getsid(0)
    finally:
        d.stop()


def test_a_keyed_load_gives_each_message_of_the_load_a_key_of_its_own(tmp_path: Path) -> None:
    """`--keyed-load`: accuracy_load's concurrent producer gives every message a key of its own, on
    both systems; delayd's key index (read from the kept data directory after the stop) holds
    one row a message of the load."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/install-test-deps.sh installs it)")
    cmd = [sys.executable, "-m", "bench.daemon_vs_redis", "--smoke", "--only", "accuracy_load", "--keyed-load",
           "--json", str(tmp_path / "out.json"), "--tmp-dir", str(tmp_path), "--keep-dirs"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["errors"] == {}
    for side in SIDES:
        r = result(out, "accuracy_load", side)
        assert r["load_keyed"] is True and r["load_messages"] > 0 and r["early"] == 0
    [index] = list(tmp_path.rglob("keys.sqlite"))
    db = sqlite3.connect(index)
    try:
        keys = [k for (k,) in db.execute("SELECT key FROM keys WHERE topic = 'bench-load' UNION ALL "
                                          "SELECT key FROM recent WHERE topic = 'bench-load'")]
    finally:
        db.close()
    assert len(keys) == len(set(keys)) >= result(out, "accuracy_load", "delayd")["load_messages"]
    assert all(k.startswith("order-") for k in keys)
