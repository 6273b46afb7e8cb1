"""The deploy files against the real daemon: the flags compose and systemd pass are accepted, the
image's HEALTHCHECK probe works, and /metrics passes `promtool check metrics` and exports every
metric the dashboard and alert rules query."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.tools import DEPLOY, dockerfile_healthcheck_code, run_ok, tool
from tests.support.daemon import DaemonProcess, free_port, wait_until

TOPIC = "deploy-check"

# family name -> (type, label names that its samples must carry); counters are named without _total.
EXPECTED: dict[str, tuple[str, set[str]]] = {
    "delayd_produced": ("counter", {"topic"}),
    "delayd_delivered": ("counter", {"topic"}),
    "delayd_cancelled": ("counter", {"topic"}),
    "delayd_acked": ("counter", {"topic", "group"}),
    "delayd_nacked": ("counter", {"topic", "group"}),
    "delayd_dead": ("counter", {"topic", "group"}),
    "delayd_lateness_seconds": ("histogram", set()),
    "delayd_stage_queue_depth": ("gauge", {"stage"}),
    "delayd_scheduled_messages": ("gauge", set()),
    "delayd_topic_scheduled_messages": ("gauge", {"topic"}),
    "delayd_disk_bytes": ("gauge", set()),
    "delayd_recovery_seconds": ("gauge", set()),
    "delayd_group_backlog": ("gauge", {"topic", "group"}),
    "delayd_group_inflight": ("gauge", {"topic", "group"}),
    "delayd_group_dead": ("gauge", {"topic", "group"}),
}


def _compose_flags(service: str) -> list[str]:
    """The shard's compose command, minus the program name and the container-only data dir/listen."""
    model = json.loads(run_ok([tool("compose-config-json"), str(DEPLOY / "docker-compose.yml")]).stdout)
    return _strip(model["services"][service]["command"])


def _systemd_flags() -> list[str]:
    line = next(x for x in (DEPLOY / "delayd.service").read_text().splitlines() if x.startswith("ExecStart="))
    return _strip(line.removeprefix("ExecStart=").split())


def _strip(cmd: list[str]) -> list[str]:
    assert cmd[1] == "serve", cmd
    rest, out, i = cmd[2:], [], 0
    while i < len(rest):
        if rest[i] in ("--data-dir", "--listen"):
            i += 2
            continue
        out.append(rest[i])
        i += 1
    return out


def _fsync_and_extra(flags: list[str]) -> tuple[str, list[str]]:
    if "--fsync" in flags:
        k = flags.index("--fsync")
        return flags[k + 1], flags[:k] + flags[k + 2 :]
    return "always", flags


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon started with exactly the flags of compose's delayd-s0 (but on loopback, in a temp dir)."""
    fsync, extra = _fsync_and_extra(_compose_flags("delayd-s0"))
    d = DaemonProcess(tmp_path_factory.mktemp("compose-s0") / "data", fsync=fsync, extra_args=extra)
    d.start()
    try:
        yield d
    finally:
        d.stop()


def test_compose_flags_are_accepted(shard: DaemonProcess) -> None:
    status, info = shard.request("GET", "/v1/info")
    assert status == 200 and info["node_id"] == "s0", (status, info, shard.log_tail())


def test_systemd_flags_are_accepted(tmp_path: Path) -> None:
    flags = _systemd_flags()
    fsync, extra = _fsync_and_extra(flags)
    d = DaemonProcess(tmp_path / "data", fsync=fsync, extra_args=extra).start()
    try:
        status, info = d.request("GET", "/v1/info")
        assert status == 200 and info["node_id"] == flags[flags.index("--node-id") + 1]
    finally:
        assert d.stop() == 0, d.log_tail()


def test_dockerfile_healthcheck_probe(shard: DaemonProcess) -> None:
    code = dockerfile_healthcheck_code()
    ok = subprocess.run(
        [sys.executable, "-c", code.replace("127.0.0.1:7070", f"127.0.0.1:{shard.port}")],
        capture_output=True,
        timeout=10,
    )
    assert ok.returncode == 0, ok.stderr
    down = subprocess.run(
        [sys.executable, "-c", code.replace("127.0.0.1:7070", f"127.0.0.1:{free_port()}")],
        capture_output=True,
        timeout=10,
    )
    assert down.returncode != 0, "the probe must fail when nothing answers"


def _traffic(d: DaemonProcess) -> None:
    """Touch every labelled counter: produce, deliver, ack, nack, cancel."""
    status, body = d.request(
        "POST", f"/v1/topics/{TOPIC}/messages", {"messages": [{"body": "a"}, {"body": "b"}]}
    )
    assert status == 200, body
    status, body = d.request("POST", f"/v1/topics/{TOPIC}/messages", {"body": "later", "delay_ms": 3_600_000})
    assert status == 200, body
    later_id = body["messages"][0]["id"]
    status, body = d.request("DELETE", f"/v1/messages/{later_id}")
    assert status == 200, body

    got: list[dict[str, Any]] = []

    def pulled() -> bool:
        s, b = d.request("POST", f"/v1/topics/{TOPIC}/subscriptions/g/pull", {"max": 10, "wait_ms": 1000})
        assert s == 200, b
        got.extend(b["messages"])
        return len(got) >= 2

    wait_until(pulled, 20, 0.01, "two due messages pulled")
    s, b = d.request("POST", f"/v1/topics/{TOPIC}/subscriptions/g/ack", {"receipts": [got[0]["receipt"]]})
    assert s == 200 and b["acked"] == 1, b
    s, b = d.request(
        "POST",
        f"/v1/topics/{TOPIC}/subscriptions/g/nack",
        {"receipts": [got[1]["receipt"]], "delay_ms": 3_600_000},
    )
    assert s == 200, b


def _scrape(d: DaemonProcess) -> str:
    import urllib.request

    with urllib.request.urlopen(d.url + "/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers.get_content_type() == "text/plain"
        return r.read().decode()


@pytest.fixture(scope="module")
def metrics_text(shard: DaemonProcess) -> str:
    _traffic(shard)

    def settled() -> str | None:
        text = _scrape(shard)
        needed = [
            f'delayd_acked_total{{group="g",topic="{TOPIC}"}}',
            f'delayd_nacked_total{{group="g",topic="{TOPIC}"}}',
            f'delayd_cancelled_total{{topic="{TOPIC}"}}',
        ]
        flat = re.sub(r"\{([^}]*)\}", lambda m: "{" + ",".join(sorted(m.group(1).split(","))) + "}", text)
        return text if all(n in flat for n in needed) else None

    return str(wait_until(settled, 20, 0.05, "ack/nack/cancel counters in /metrics"))


def test_promtool_check_metrics(metrics_text: str) -> None:
    r = subprocess.run(
        [tool("promtool"), "check", "metrics"], input=metrics_text, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, f"promtool check metrics:\n{r.stdout}{r.stderr}"


def test_expected_families_types_and_labels(metrics_text: str) -> None:
    families = {f.name: f for f in text_string_to_metric_families(metrics_text)}
    problems = []
    for name, (kind, labels) in EXPECTED.items():
        fam = families.get(name)
        if fam is None:
            problems.append(f"{name}: not exported")
            continue
        if fam.type != kind:
            problems.append(f"{name}: type {fam.type}, expected {kind}")
        for sample in fam.samples:
            have = set(sample.labels) - {"le"}
            if have != labels:
                problems.append(f"{sample.name}: labels {sorted(have)}, expected {sorted(labels)}")
                break
    assert not problems, "\n".join(problems)
    lateness = families["delayd_lateness_seconds"]
    assert any(s.name == "delayd_lateness_seconds_count" and s.value >= 2 for s in lateness.samples)
    stages = {s.labels["stage"] for s in families["delayd_stage_queue_depth"].samples}
    assert len(stages) >= 3, f"expected one series per pipeline stage, got {stages}"


def _exported_series_names(text: str) -> set[str]:
    names = set()
    for fam in text_string_to_metric_families(text):
        suffixes = {
            "counter": ["_total"],
            "histogram": ["_bucket", "_sum", "_count"],
            "summary": ["_sum", "_count", ""],
            "gauge": [""],
            "untyped": [""],
        }.get(fam.type, [""])
        names |= {fam.name + s for s in suffixes}
    return names


def test_dashboard_and_alerts_query_only_exported_metrics(metrics_text: str) -> None:
    exported = _exported_series_names(metrics_text)
    dashboard = (DEPLOY / "grafana" / "dashboards" / "delayd.json").read_text()
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    used = set(re.findall(r"\bdelayd_[a-z_]+\b", dashboard + alerts)) - {"delayd_overview"}
    assert used, "no delayd metric referenced?"
    assert used <= exported, f"queried but not exported by the daemon: {sorted(used - exported)}"
