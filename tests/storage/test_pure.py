"""The Python reference of the batch core carries the whole storage engine on its own.

`DELAYD_PURE=1` makes `storage.native.compiled()` answer None, so every batch function runs its
Python reference (storage/batch.py). The storage suite runs once more that way, in a child
process (the compiled module is already imported in this one), without the differential tests,
which compare the two.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.mark.timeout(600)
def test_storage_suite_passes_on_the_python_reference() -> None:
    env = {**os.environ, "DELAYD_PURE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(HERE),
         "--ignore", str(HERE / Path(__file__).name), "--ignore", str(HERE / "test_batch_differential.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail


def test_the_reference_is_what_runs_under_delayd_pure() -> None:
    code = ("import delayd.storage.native as n, sys; "
            "sys.exit(0 if n.compiled() is None else 3)")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DELAYD_PURE": "1"}, cwd=ROOT)
    assert proc.returncode == 0
    proc = subprocess.run([sys.executable, "-c", code], env={k: v for k, v in os.environ.items() if k != "DELAYD_PURE"},
                          cwd=ROOT)
    assert proc.returncode == 3, "the compiled core is not built: `pip install -e .` builds it"
