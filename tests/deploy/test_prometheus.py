"""deploy/prometheus: the scrape config and alert rules pass promtool, and the alerts fire as meant."""

from __future__ import annotations

from tests.deploy.tools import DEPLOY, run_ok, tool

PROM = DEPLOY / "prometheus"


def test_promtool_check_config() -> None:
    r = run_ok([tool("promtool"), "check", "config", str(PROM / "prometheus.yml")])
    out = r.stdout + r.stderr
    assert "SUCCESS" in out and "1 rule files found" in out, out


def test_promtool_check_rules() -> None:
    r = run_ok([tool("promtool"), "check", "rules", str(PROM / "alerts.yml")])
    assert "SUCCESS" in r.stdout + r.stderr


def test_alert_rules_unit_tests() -> None:
    r = run_ok([tool("promtool"), "test", "rules", str(PROM / "alerts_test.yml")])
    assert "SUCCESS" in r.stdout + r.stderr
