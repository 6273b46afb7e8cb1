"""The daemon's commands of the `delayd` CLI as a user runs them: a closed pipe is not an error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from delayd.storage.recovery import open_store
from delayd.storage.store import NewMessage, StoreConfig

from tests.support.daemon import ROOT


def test_dump_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    store, _report = open_store(tmp_path / "data", StoreConfig(), lambda: 1_000_000)
    # Far more output than a pipe buffer holds, so dump is still writing when `head` exits.
    store.append_messages([NewMessage("orders", b"x" * 50, 2_000_000 + i, key=f"k{i}") for i in range(5000)],
                          1_000_000)
    store.flush_commit()
    store.close()
    cmd = f"{sys.executable} -m delayd dump {tmp_path / 'data'} commitlog | head -n 2"
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert len(r.stdout.splitlines()) == 2
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode == 0, (r.returncode, r.stderr)
