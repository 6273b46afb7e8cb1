"""deploy/grafana: the provisioned dashboard is valid JSON for Grafana's schema, wired to the
provisioned datasource, covers the panels operators need, and every query is valid PromQL
(checked by promtool, after substituting Grafana's variables)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.tools import DEPLOY, run_ok, tool

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "delayd.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"

# What the daemon exports (see docs/operations.md); the dashboard must show each of them.
REQUIRED_METRICS = [
    "delayd_produced_total",
    "delayd_delivered_total",
    "delayd_cancelled_total",
    "delayd_acked_total",
    "delayd_nacked_total",
    "delayd_dead_total",
    "delayd_lateness_seconds_bucket",
    "delayd_stage_queue_depth",
    "delayd_scheduled_messages",
    "delayd_topic_scheduled_messages",
    "delayd_disk_bytes",
    "delayd_recovery_seconds",
    "delayd_group_backlog",
    "delayd_group_inflight",
    "delayd_group_dead",
    "delayd_group_oldest_unacked_age_seconds",
    "delayd_http_request_duration_seconds_bucket",
    "delayd_http_request_duration_seconds_count",
    "delayd_commitlog_fsync_duration_seconds_bucket",
    "delayd_build_info",
]
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h", "$job": "delayd",
                "$instance": ".*"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows nest their panels
    return out


def _exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels(dash) for t in p.get("targets", []) if t.get("expr")]


def test_dashboard_metadata(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "delayd-overview"
    assert dashboard["title"] == "delayd"
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert "id" not in dashboard or dashboard["id"] is None  # provisioned dashboards must not pin an id


def test_panels_use_the_provisioned_datasource(dashboard: dict[str, Any]) -> None:
    uid = re.search(r"^\s*uid:\s*(\S+)\s*$", DATASOURCES.read_text(), re.M)
    assert uid, "datasource provisioning has no uid"
    refs = [(p["title"], p.get("datasource")) for p in _panels(dashboard) if p["type"] != "row"]
    refs += [(p["title"], t.get("datasource")) for p in _panels(dashboard) for t in p.get("targets", [])]
    refs += [(v["name"], v.get("datasource")) for v in dashboard["templating"]["list"]]
    for title, ds in refs:
        assert ds == {"type": "prometheus", "uid": uid.group(1)}, f"{title}: datasource {ds}"


def test_panel_ids_unique_and_layout_fits(dashboard: dict[str, Any]) -> None:
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, f"{p['title']}: {g}"
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not (mine & cells), f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_required_panels(dashboard: dict[str, Any]) -> None:
    titles = {p["title"] for p in _panels(dashboard)}
    for needed in [
        "Produce rate by topic",
        "Delivery and cancel rate by topic",
        "Delivery lateness percentiles",
        "Pending by shard",
        "Pending by topic",
        "Pipeline stage queue depths",
        "Consumer backlog (due, not delivered)",
        "Dead letters by group",
    ]:
        assert needed in titles


def test_every_metric_is_shown(dashboard: dict[str, Any]) -> None:
    text = "\n".join(e for _, e in _exprs(dashboard))
    missing = [m for m in REQUIRED_METRICS if not re.search(rf"\b{m}\b", text)]
    assert not missing, f"dashboard never queries {missing}"


def test_lateness_percentiles_from_histogram(dashboard: dict[str, Any]) -> None:
    panel = next(p for p in _panels(dashboard) if p["title"] == "Delivery lateness percentiles")
    exprs = [t["expr"] for t in panel["targets"]]
    quantiles = set()
    for e in exprs:
        m = re.fullmatch(
            r"histogram_quantile\((0\.\d+), sum by \(le\) \(rate\(delayd_lateness_seconds_bucket"
            r"\{[^}]*\}\[\$__rate_interval\]\)\)\)",
            e,
        )
        assert m, f"not a histogram_quantile over the lateness buckets: {e}"
        quantiles.add(m.group(1))
    assert {"0.5", "0.99"} <= quantiles
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"


def test_stage_queue_panel_groups_by_stage(dashboard: dict[str, Any]) -> None:
    panel = next(p for p in _panels(dashboard) if p["title"] == "Pipeline stage queue depths")
    assert any(
        "by (stage)" in t["expr"] and "delayd_stage_queue_depth" in t["expr"] for t in panel["targets"]
    )


def test_counters_are_only_used_through_rate(dashboard: dict[str, Any]) -> None:
    for title, expr in _exprs(dashboard):
        for m in re.finditer(r"\b(delayd_\w+_total|delayd_lateness_seconds_bucket)\b", expr):
            before = expr[: m.start()]
            assert re.search(r"\b(rate|increase|irate)\($", before), f"{title}: raw counter in {expr}"


def test_every_query_is_valid_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    """promtool parses each expression as a recording rule: a syntax error in any panel fails here."""
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, (title, expr) in enumerate(_exprs(dashboard)):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"{title}: unknown Grafana variable in {expr}"
        lines += [f"      - record: dashboard:q{i}", f"        expr: {json.dumps(expr)}"]
    for v in dashboard["templating"]["list"]:
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.+), \w+\)", q)
        assert m, f"variable {v['name']}: unexpected query {q}"
        expr = m.group(1)
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        lines += [f"      - record: dashboard:var_{v['name']}", f"        expr: {json.dumps(expr)}"]
    rules = tmp_path / "dashboard_rules.yml"
    rules.write_text("\n".join(lines) + "\n")
    r = run_ok([tool("promtool"), "check", "rules", str(rules)])
    n = sum(1 for line in lines if line.lstrip().startswith("- record:"))
    assert f"SUCCESS: {n} rules found" in r.stdout + r.stderr, r.stdout + r.stderr


def test_no_query_needs_a_label_only_this_repository_adds(dashboard: dict[str, Any]) -> None:
    """deploy/prometheus/prometheus.yml adds a `node` label per target; another Prometheus does not,
    and its job may have another name. Shards are told apart by `instance`, selected by variables
    read from delayd_build_info (tests/deploy/test_daemon_deploy.py evaluates every query on the
    real daemon's series under another job name and without `node`)."""
    queries = [e for _, e in _exprs(dashboard)]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"]]
    for q in queries:
        assert not re.search(r"\bnode\b", q), f"query depends on the node label: {q}"
        assert 'job="delayd"' not in q, f"query assumes the job name: {q}"
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["job", "instance"]


def test_dashboard_json_is_generated() -> None:
    """deploy/grafana/gen_dashboard.py is the source; the committed JSON must be its output."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_dashboard", DEPLOY / "grafana" / "gen_dashboard.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert DASHBOARD.read_text() == module.render(), "run: python deploy/grafana/gen_dashboard.py"
