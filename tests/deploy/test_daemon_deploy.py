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
    "delayd_group_oldest_unacked_age_seconds": ("gauge", {"topic", "group"}),
    "delayd_http_request_duration_seconds": ("histogram", {"method", "route", "status"}),
    "delayd_commitlog_fsync_duration_seconds": ("histogram", set()),
    "delayd_build_info": ("gauge", {"version", "python", "node_id"}),
}


def _compose_flags(service: str) -> list[str]:
    """The member's compose command, minus the program name and the container-only data dir/listen
    (its replication settings are in its environment, checked by test_compose.py: a daemon started
    with them needs etcd)."""
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
    """A daemon started with exactly the flags of compose's delayd-s0-a (but on loopback, in a temp dir)."""
    fsync, extra = _fsync_and_extra(_compose_flags("delayd-s0-a"))
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


def _image_command() -> list[str]:
    """The Dockerfile's default CMD (exec form)."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    (cmd,) = [json.loads(line[4:]) for line in text.splitlines() if line.startswith("CMD ")]
    return list(cmd)


def test_image_default_command_serves_safely_with_a_generated_token(tmp_path: Path) -> None:
    """What `docker run IMAGE` does, without Docker: the CMD's flags on a non-loopback address
    (0.0.0.0 as in the image, on a free port) start a daemon that requires a token it generated
    into the data directory (0600), keeps across restarts, and never writes to the log."""
    cmd = _image_command()
    assert cmd[cmd.index("--listen") + 1].startswith("0.0.0.0:")
    fsync, extra = _fsync_and_extra(_strip(cmd))
    port = free_port()
    d = DaemonProcess(tmp_path / "data", port=port, fsync=fsync, extra_args=[*extra, "--listen", f"0.0.0.0:{port}"])
    d.start()
    try:
        token_file = tmp_path / "data" / "admin.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        assert d.request("GET", "/v1/stats")[0] == 401
        assert d.request("POST", "/v1/topics/t/messages", {"body": "x"})[0] == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert d.request("POST", "/v1/topics/t/messages", {"body": "x"}, headers=auth)[0] == 200
        assert d.request("GET", "/v1/stats", headers=auth)[0] == 200
        assert d.request("GET", "/healthz")[0] == 200, "the image's HEALTHCHECK needs no token"
        d.stop()
        d.start()  # the same token after a restart, not a new one
        assert token_file.read_text().strip() == token
        assert d.request("GET", "/v1/stats", headers=auth)[0] == 200
    finally:
        assert d.stop() == 0, d.log_tail()
    log = d.log_path.read_text()
    assert str(token_file) in log and "generated now" in log and "kept" in log
    assert token not in log, "the token must never reach the log"


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


def _series_without_node(metrics_text: str, job: str, instance: str) -> list[dict[str, str]]:
    """promtool input series from the daemon's real /metrics, as a Prometheus that adds only `job`
    and `instance` stores them: counters and histograms grow, gauges hold still."""
    out = [{"series": f'up{{job="{job}", instance="{instance}"}}', "values": "1+0x40"}]
    for fam in text_string_to_metric_families(metrics_text):
        for sample in fam.samples:
            labels = {**sample.labels, "job": job, "instance": instance}
            assert "node" not in labels
            text = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
            grows = fam.type in ("counter", "histogram") and not sample.name.endswith("_created")
            step = (sample.value or 1) if grows else 0
            out.append({"series": f"{sample.name}{{{text}}}", "values": f"{sample.value}+{step}x40"})
    return out


def test_every_dashboard_query_returns_data_on_a_prometheus_without_the_node_label(
        metrics_text: str, tmp_path: Path) -> None:
    """Each panel query and variable of the dashboard, evaluated by promtool over the real daemon's
    series scraped by a job named differently and with no `node` label, returns data."""
    from tests.deploy.test_grafana import DASHBOARD, GRAFANA_VARS, _exprs

    dashboard = json.loads(DASHBOARD.read_text())
    job, instance = "my-delayd", "10.0.0.5:7070"
    grafana = {**GRAFANA_VARS, "$job": job, "$instance": ".*"}  # what the variables resolve to here

    def resolve(expr: str) -> str:
        for var, value in grafana.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        return expr

    tests: list[dict[str, Any]] = []
    for title, expr in _exprs(dashboard):
        tests.append({"expr": f"clamp_max(count({resolve(expr)}), 1)", "eval_time": "8m",
                      "exp_samples": [{"labels": "{}", "value": 1}], "_title": title})
    for v in dashboard["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
        assert m, v
        selector, label = resolve(m.group(1)), m.group(2)
        # The variable's label must exist on the series, or the variable has no values.
        selector = selector[:-1] + f', {label}!=""}}' if selector.endswith("}") else f'{selector}{{{label}!=""}}'
        tests.append({"expr": f"clamp_max(count(count by ({label}) ({selector})), 1)", "eval_time": "8m",
                      "exp_samples": [{"labels": "{}", "value": 1}], "_title": f"variable {v['name']}"})
    titles = [t.pop("_title") for t in tests]
    spec = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": _series_without_node(metrics_text, job, instance),
        "promql_expr_test": tests}]}
    path = tmp_path / "dashboard_test.yml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    r = subprocess.run([tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"queries without data ({len(titles)} checked: {titles}):\n{r.stdout[-4000:]}{r.stderr}"
