"""Every code block of README.md, CONTRIBUTING.md and docs/*.md that claims to run does run.

A fenced block in `python`, `sh`, `bash` or `shell` claims to be runnable. Each one is run as
written against a fresh real daemon (the address `127.0.0.1:7070` / `localhost:7070` of the docs
is replaced by the test daemon's; `DELAYD_URL` points the CLI at it), from an empty directory
outside the repository, and must exit 0. A block that cannot run here (it needs Docker, systemd,
or starts the daemon itself) says so in an HTML comment on the line before it:
`<!-- not run: REASON -->` - the reason is required. `toml` blocks are loaded as daemon config.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from delayd.broker import config as config_mod

from tests.support.daemon import ROOT, DaemonProcess

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"python", "sh", "bash", "shell"}
FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<info>[^\n`]*)\n(?P<code>.*?)^(?P=indent)```[ ]*$", re.M | re.S)
NOT_RUN = re.compile(r"<!--\s*not run:(?P<why>[^>]*)-->\s*$")
DOC_ADDRESS = re.compile(r"(127\.0\.0\.1|localhost):7070")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, when the doc says the block is not run

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    out = []
    for m in FENCE.finditer(text):
        indent = len(m.group("indent"))
        code = "\n".join(line[indent:] for line in m.group("code").splitlines()) + "\n"
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        why = NOT_RUN.search(before)
        out.append(Block(doc, line, m.group("info").split()[0] if m.group("info").strip() else "", code,
                         why.group("why").strip() if why else None))
    return out


ALL = [b for doc in DOCS for b in blocks(doc)]
TO_RUN = [b for b in ALL if b.lang in RUNNABLE and b.not_run is None]
TRY_IT = next(b for b in TO_RUN if b.doc.name == "README.md" and b.lang == "sh")


def test_the_docs_are_there_and_every_exception_says_why() -> None:
    assert all(doc.is_file() for doc in DOCS), [str(d) for d in DOCS if not d.is_file()]
    for b in ALL:
        if b.not_run is not None:
            assert b.lang in RUNNABLE, f"{b.name}: 'not run' on a {b.lang or 'plain'} block, which never runs"
            assert len(b.not_run) >= 10, f"{b.name}: say why the block is not run"
    names = {b.name.split(":")[0] for b in TO_RUN}
    assert {"README.md", "docs/client.md"} <= names, names
    # Indented code blocks cannot say their language, so they cannot be checked: fences only.
    for doc in (ROOT / "README.md", ROOT / "docs" / "client.md"):
        outside = FENCE.sub("", doc.read_text())
        assert not re.search(r"\n\n    \S[^\n]*\n", outside), f"{doc.name} has an indented code block"


@pytest.fixture
def daemon(tmp_path: Path):
    d = DaemonProcess(tmp_path / "data").start()
    yield d
    assert d.stop() == 0, d.log_tail()


def run_block(b: Block, d: DaemonProcess, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = DOC_ADDRESS.sub(f"127.0.0.1:{d.port}", b.code)
    env = {**os.environ, "DELAYD_URL": d.url, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)  # the installed package, as a user has it
    if b.lang == "python":
        script = cwd / "block.py"
        script.write_text(code)
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-e", "-u", "-o", "pipefail", "-c", code]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=90)


# The README's "Try it" runs in its own test below, which also checks what it prints.
@pytest.mark.parametrize("block", [b for b in TO_RUN if b is not TRY_IT], ids=[b.name for b in TO_RUN if b is not TRY_IT])
def test_block_runs(block: Block, daemon: DaemonProcess, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = run_block(block, daemon, cwd)
    assert r.returncode == 0, f"{block.name} exited {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "toml"], ids=lambda b: b.name)
def test_toml_blocks_are_valid_daemon_config(block: Block, tmp_path: Path) -> None:
    f = tmp_path / "delayd.toml"
    f.write_text(block.code)
    config_mod.load(str(f), env={})


def test_readme_try_it_delivers_and_acks_as_shown(daemon: DaemonProcess, tmp_path: Path) -> None:
    """The README's first shell block, step by step: produced with a 2 s delay, delivered by the
    long-poll no earlier than due, acked; the outputs have the shape its comments show."""
    b = TRY_IT
    assert '"delay_ms": 2000' in b.code and "/pull" in b.code and "/ack" in b.code
    r = run_block(b, daemon, tmp_path)
    assert r.returncode == 0, r.stderr
    produced, pulled, acked = (json.loads(line) for line in r.stdout.splitlines() if line.strip())
    (p,) = produced["messages"]
    (m,) = pulled["messages"]
    assert m["id"] == p["id"] and m["body"] == "close order 42 if unpaid" and m["attempt"] == 1
    assert m["delivered_at"] >= m["deliver_at"] == p["deliver_at"], "never early"
    assert acked == {"acked": 1, "stale": []}
    # Each output comment (continued on lines starting "#   ") is the real answer's shape.
    comments = re.findall(r"^# (\{.*?\})$", re.sub(r"\n#   ", "", b.code), re.M)
    shown = [json.loads(c) for c in comments]
    assert len(shown) == 3
    assert set(shown[0]) == set(produced) and set(shown[0]["messages"][0]) == set(p)
    assert set(shown[1]["messages"][0]) == set(m), "the pull comment shows every field"
    assert shown[2] == acked
    status, _ = daemon.request("POST", "/v1/topics/orders/subscriptions/closer/pull", {"wait_ms": 0})
    assert status == 200
    assert daemon.request("POST", "/v1/topics/orders/subscriptions/closer/pull", {})[1] == {"messages": []}, \
        "acked: not delivered again"
