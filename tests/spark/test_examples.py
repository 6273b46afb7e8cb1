"""Both Spark examples, run as a user runs them (subprocesses), against a real daemon."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.spark.conftest import java_options, spark_env
from tests.support.daemon import ROOT, DaemonProcess, wait_until


def run_example(config: pytest.Config, script: str, *args: str, timeout_s: float = 150) -> str:
    jvm = shlex.quote("spark.driver.extraJavaOptions=" + java_options(config))
    env = {**os.environ, **spark_env(), "PYSPARK_SUBMIT_ARGS": f"--conf {jvm} pyspark-shell"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.timeout(330)
def test_schedule_orders_then_due_report(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        started = int(time.time() * 1000)
        out = run_example(pytestconfig, "spark_schedule_orders.py", "--url", d.url, "--topic", "ex.close", "--orders", "300")
        assert "orders: 300" in out and "scheduled: 300" in out and "duplicates: 0" in out, out
        m = d.request("GET", "/v1/topics/ex.close/keys/ord-00000007")[1]
        # due 30 minutes after the order, and every order was placed within the last 20 minutes
        assert started + 10 * 60_000 - 5_000 <= m["deliver_at"] <= int(time.time() * 1000) + 30 * 60_000
        assert d.request("DELETE", "/v1/topics/ex.close/keys/ord-00000007")[0] == 200  # paid

        # something delivered, for the lateness part of the report
        status, _ = d.request("POST", "/v1/topics/ex.now/messages",
                              {"messages": [{"body": f"n{i}", "delay_ms": 0} for i in range(5)]})
        assert status == 200
        wait_until(lambda: d.request("GET", "/v1/stats")[1]["topics"].get("ex.now", {}).get("delivered_total") == 5,
                   30, 0.05, "5 messages delivered")

        report = run_example(pytestconfig, "spark_due_report.py", str(d.data_dir), "--rows", "100")  # the daemon keeps running
        assert "pending messages due in the next 48 h: 299" in report, report
        assert "topic ex.close: 299" in report, report
        minutes = [line for line in report.splitlines() if line.strip().endswith("#") and "  20" in line]
        assert 1 <= len(minutes) <= 21 and sum(int(line.split()[2]) for line in minutes) == 299, report
        late = [line.split() for line in report.splitlines() if line.strip().startswith("ex.now")]
        assert len(late) == 1 and late[0][1] == "5" and 0 <= int(late[0][2]) <= int(late[0][4]), report
    finally:
        d.stop()
