"""The shell scripts in deploy/ pass shellcheck (the cluster script is exercised in test_cluster.py)."""

from __future__ import annotations

import os

import pytest

from tests.deploy.tools import DEPLOY, run_ok, tool

SCRIPTS = sorted(DEPLOY.glob("*.sh"))


def test_scripts_found() -> None:
    assert {p.name for p in SCRIPTS} >= {"cluster.sh", "install_tools.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script: os.PathLike[str]) -> None:
    run_ok([tool("shellcheck"), "--shell=bash", "--severity=info", str(script)])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_executable(script: os.PathLike[str]) -> None:
    assert os.access(script, os.X_OK), f"{script} is not executable (chmod +x; git keeps the bit)"
