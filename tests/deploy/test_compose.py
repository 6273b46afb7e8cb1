"""deploy/docker-compose.yml, resolved by a real Compose implementation (`docker-compose config`,
which needs no Docker engine), and its consistency with the Prometheus and Grafana files: etcd and
the three members of one replicated shard (s0-a, s0-b, s0-c), whose replication settings pass the
daemon's own configuration checks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from delayd.broker import config as config_mod

from tests.deploy.tools import DEPLOY, MEMBERS, ROOT, dockerfile_healthcheck_code, run_ok, tool

COMPOSE_FILE = DEPLOY / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    out = run_ok([tool("compose-config-json"), str(COMPOSE_FILE)]).stdout
    model = json.loads(out)
    assert isinstance(model, dict) and "services" in model
    return model


def _ports(svc: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host_ip, published, target) for each port; Compose v2 gives dicts, v1 strings."""
    result = []
    for p in svc.get("ports", []):
        if isinstance(p, dict):
            result.append((p.get("host_ip", ""), int(p["published"]), int(p["target"])))
        else:
            m = re.fullmatch(r"(?:(\d+\.\d+\.\d+\.\d+):)?(\d+):(\d+)(?:/tcp)?", str(p))
            assert m, f"unexpected port syntax {p!r}"
            result.append((m.group(1) or "", int(m.group(2)), int(m.group(3))))
    return result


def _mounts(svc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, source, target) for each mount."""
    result = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            result.append((v["type"], str(v.get("source", "")), v["target"]))
        else:  # v1 short form "source:target[:mode]"
            source, target = str(v).split(":")[:2]
            result.append(("bind" if source.startswith("/") else "volume", source, target))
    return result


def _command(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command")
    assert isinstance(cmd, list), f"command must be exec (list) form, got {cmd!r}"
    return cmd


def _flag(cmd: list[str], name: str) -> str:
    assert name in cmd, f"{name} missing from {cmd}"
    return cmd[cmd.index(name) + 1]


def test_services_present(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {*MEMBERS, "etcd", "prometheus", "grafana"}
    # The project name comes from deploy/.env (Compose v1 prints no name; v2 does).
    assert compose.get("name", "delayd") == "delayd"


@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_member_service(compose: dict[str, Any], name: str) -> None:
    node_id, host_port, member = MEMBERS[name]
    svc = compose["services"][name]
    cmd = _command(svc)
    assert cmd[:2] == ["delayd", "serve"]
    assert _flag(cmd, "--node-id") == node_id
    assert _flag(cmd, "--data-dir") == "/data"
    assert _flag(cmd, "--listen") == "0.0.0.0:7070"
    assert _flag(cmd, "--fsync") == "always"
    # The daemon refuses 0.0.0.0 without tokens unless --insecure; compose runs on a private network.
    assert "--insecure" in cmd
    # Built from this repository's Dockerfile.
    build = svc["build"]
    assert Path(build["context"]).resolve() == ROOT
    assert build["dockerfile"] in ("deploy/Dockerfile", str(DEPLOY / "Dockerfile"))
    # Its own named volume at /data, and its host port on loopback only.
    assert _mounts(svc) == [("volume", f"{member}-data", "/data")]
    assert _ports(svc) == [("127.0.0.1", host_port, 7070)]
    # Health: the image's /healthz probe, exactly.
    hc = svc["healthcheck"]
    assert hc["test"] == ["CMD", "python", "-c", dockerfile_healthcheck_code()]
    assert "/healthz" in hc["test"][-1]
    assert svc["stop_signal"] == "SIGTERM"
    assert svc.get("init") is True
    assert svc.get("restart") == "unless-stopped"


@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_member_replication_settings_pass_the_daemons_checks(compose: dict[str, Any], name: str) -> None:
    """The member's environment and flags, loaded by broker.config exactly as `delayd serve` loads
    them, make a valid replicated member of shard s0 that reaches etcd and advertises its own
    compose name (what a follower's 421 names)."""
    node_id, _, member = MEMBERS[name]
    svc = compose["services"][name]
    env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
    cmd = _command(svc)
    cfg = config_mod.load(env=env, flags={"node_id": _flag(cmd, "--node-id"), "listen": _flag(cmd, "--listen"),
                                          "insecure": True})
    assert cfg.replication_enabled and cfg.node_id == node_id
    assert cfg.replication_member == member
    assert cfg.replication_advertise_url == f"http://{name}:7070" and svc["hostname"] == name
    assert cfg.replication_etcd_endpoints == ("http://etcd:2379",)
    assert cfg.replication_min_insync == 2
    assert svc["depends_on"]["etcd"]["condition"] == "service_healthy"


def test_etcd_service(compose: dict[str, Any]) -> None:
    etcd = compose["services"]["etcd"]
    image, _, tag = etcd["image"].rpartition(":")
    assert image == "quay.io/coreos/etcd" and re.fullmatch(r"v3\.\d+\.\d+", tag), "a pinned etcd 3.x release"
    cmd = _command(etcd)
    assert _flag(cmd, "--advertise-client-urls") == "http://etcd:2379"
    assert _flag(cmd, "--listen-client-urls") == "http://0.0.0.0:2379"
    assert _mounts(etcd) == [("volume", "etcd-data", "/etcd-data")] and _flag(cmd, "--data-dir") == "/etcd-data"
    assert "endpoint" in etcd["healthcheck"]["test"] and "health" in etcd["healthcheck"]["test"]


def test_members_do_not_share_volumes_or_ports(compose: dict[str, Any]) -> None:
    sources = [m[1] for name in MEMBERS for m in _mounts(compose["services"][name])]
    published = [p[1] for name in MEMBERS for p in _ports(compose["services"][name])]
    assert len(set(sources)) == len(sources) == 3
    assert sorted(published) == [7071, 7072, 7073]
    names = {compose["services"][n]["environment"]["DELAYD_REPLICATION_MEMBER"] for n in MEMBERS}
    assert len(names) == 3, "member names are unique in the shard"


def test_named_volumes_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used = {m[1] for svc in compose["services"].values() for m in _mounts(svc) if m[0] == "volume"}
    assert used == {"etcd-data", "s0-a-data", "s0-b-data", "s0-c-data", "prometheus-data", "grafana-data"}
    assert used <= declared, f"undeclared volumes: {used - declared}"


def test_every_service_has_a_healthcheck(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        hc = svc.get("healthcheck")
        assert hc and hc.get("test") and not hc.get("disable"), f"{name} has no healthcheck"


def test_only_loopback_ports_published(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for host_ip, _published, _target in _ports(svc):
            assert host_ip == "127.0.0.1", f"{name} publishes a port on {host_ip or 'all interfaces'}"


def test_prometheus_and_grafana_mounts_exist(compose: dict[str, Any]) -> None:
    prom = _mounts(compose["services"]["prometheus"])
    assert ("bind", str(DEPLOY / "prometheus"), "/etc/prometheus") in prom
    graf = _mounts(compose["services"]["grafana"])
    assert ("bind", str(DEPLOY / "grafana" / "provisioning"), "/etc/grafana/provisioning") in graf
    assert ("bind", str(DEPLOY / "grafana" / "dashboards"), "/etc/grafana/dashboards") in graf
    for _type, source, _target in prom + graf:
        if _type == "bind":
            assert Path(source).is_dir(), f"bind source {source} does not exist"
    assert "--config.file=/etc/prometheus/prometheus.yml" in _command(compose["services"]["prometheus"])


def test_prometheus_scrapes_every_member(compose: dict[str, Any]) -> None:
    """Each member service is a scrape target on its container port, labelled with its node id
    (the shard) and its member name."""
    text = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    found = re.findall(r'-\s*targets:\s*\["([^"]+)"\]\s*\n\s*labels:\s*\n\s*node:\s*(\S+)\s*\n\s*member:\s*(\S+)',
                       text)
    expected = {(f"{name}:7070", node_id, member) for name, (node_id, _, member) in MEMBERS.items()}
    assert set(found) == expected
    for name in MEMBERS:
        assert _flag(_command(compose["services"][name]), "--listen").endswith(":7070")


def test_grafana_datasource_points_at_prometheus_service(compose: dict[str, Any]) -> None:
    text = (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    url = re.search(r"^\s*url:\s*(\S+)\s*$", text, re.M)
    assert url and url.group(1) == "http://prometheus:9090"
    assert "prometheus" in compose["services"]
    provider = (DEPLOY / "grafana" / "provisioning" / "dashboards" / "delayd.yml").read_text()
    path = re.search(r"^\s*path:\s*(\S+)\s*$", provider, re.M)
    assert path and path.group(1) == "/etc/grafana/dashboards"
