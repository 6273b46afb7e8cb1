"""Locate the validation tools installed by deploy/install_tools.sh, and small shared helpers.

A missing tool is a test failure with instructions, never a skip: `make test` runs the install
script first, so a missing tool means the environment is broken, not that the check is optional.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TOOLS_DIR = Path(os.environ.get("DELAYD_TOOLS_DIR", ROOT / ".tools" / "bin"))
# docker-compose.yml: the members of replicated shard s0, service -> (node id, host port, member name).
MEMBERS = {"delayd-s0-a": ("s0", 7071, "s0-a"), "delayd-s0-b": ("s0", 7072, "s0-b"),
           "delayd-s0-c": ("s0", 7073, "s0-c")}


def tool(name: str) -> str:
    """Absolute path of `name` from $DELAYD_TOOLS_DIR (default .tools/bin), else PATH; fail if absent."""
    candidate = TOOLS_DIR / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(
        f"required tool {name!r} not found in {TOOLS_DIR} or on PATH; "
        f"run deploy/install_tools.sh (make test runs it)",
        pytrace=False,
    )


def run(
    cmd: list[str],
    *,
    input_text: str | None = None,
    timeout_s: float = 60,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, input=input_text, capture_output=True, text=True, timeout=timeout_s, cwd=cwd or ROOT, env=env
    )


def run_ok(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    r = run(cmd, **kw)
    assert r.returncode == 0, (
        f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    )
    return r


def dockerfile_healthcheck_code() -> str:
    """The Python source run by the Dockerfile's HEALTHCHECK (exec form: python -c CODE)."""
    text = (DEPLOY / "Dockerfile").read_text()
    m = re.search(
        r'^HEALTHCHECK[^\n]*(?:\\\n[^\n]*)*?CMD \["python", "-c", "((?:[^"\\]|\\.)*)"\]', text, re.M
    )
    assert m, 'Dockerfile has no exec-form HEALTHCHECK CMD ["python", "-c", ...]'
    return m.group(1)
