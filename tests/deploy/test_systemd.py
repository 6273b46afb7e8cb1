"""deploy/delayd.service: systemd accepts it, and its sandboxing scores well."""

from __future__ import annotations

import re
from pathlib import Path

from tests.deploy.tools import DEPLOY, run, run_ok, tool

UNIT = DEPLOY / "delayd.service"


def _settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _testable_copy(tmp_path: Path) -> Path:
    # verify checks that ExecStart's binary exists; /opt/delayd is not installed here.
    unit = tmp_path / "delayd.service"
    unit.write_text(UNIT.read_text().replace("/opt/delayd/bin/delayd", "/bin/true"))
    return unit


def test_unit_contents() -> None:
    s = _settings()
    assert s["Type"] == ["simple"]
    assert s["User"] == ["delayd"]
    assert s["Restart"] == ["on-failure"]
    assert int(s["LimitNOFILE"][0]) >= 65536
    assert s["NoNewPrivileges"] == ["yes"] and s["ProtectSystem"] == ["strict"]
    assert s["ReadWritePaths"] == ["/var/lib/delayd"]
    execstart = s["ExecStart"][0].split()
    assert execstart[1] == "serve"
    assert execstart[execstart.index("--data-dir") + 1] == "/var/lib/delayd"
    assert re.fullmatch(r"127\.0\.0\.1:\d+", execstart[execstart.index("--listen") + 1])
    assert "--insecure" not in execstart


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    r = run_ok([tool("systemd-analyze"), "verify", str(_testable_copy(tmp_path))])
    assert r.stderr.strip() == "", r.stderr


def test_sandbox_exposure_at_most_2(tmp_path: Path) -> None:
    # --threshold is exposure x 10: fail if the overall exposure level is above 2.0 ("OK").
    r = run(
        [
            tool("systemd-analyze"),
            "security",
            "--offline=true",
            "--threshold=20",
            str(_testable_copy(tmp_path)),
        ]
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
