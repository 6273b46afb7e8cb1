"""The layering as a checked contract: import-linter's contracts in pyproject.toml (storage imports
neither broker nor client, broker does not import client, the SDK imports neither, no import cycle
inside storage), and no module outside storage/store.py reaches into the Store's private state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("broker", "storage", "client")  # pyproject maps delayd.<part> to the folder <part>/

# import-linter finds a package's modules by walking its folder, and delayd's parts live beside it
# (pyproject's package-dir mapping), so it reads a tree laid out as the installed wheel is: a
# `delayd` folder of links (the Makefile builds the same for mypy). The editable install's finder
# is taken off sys.meta_path there, or `import delayd` would find the repository's own folder.
RUN = r"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path.insert(0, sys.argv[1])
from importlinter import cli
sys.exit(cli.lint_imports(config_filename=sys.argv[2], no_cache=True))
"""


def wheel_tree(base: Path) -> Path:
    pkg = base / "delayd"
    pkg.mkdir(parents=True)
    for f in (ROOT / "delayd").iterdir():
        if f.suffix == ".py" or f.name == "py.typed":
            (pkg / f.name).symlink_to(f)
    for part in PARTS:
        (pkg / part).symlink_to(ROOT / part, target_is_directory=True)
    return base


def test_import_contracts_are_kept(tmp_path: Path) -> None:
    pytest.importorskip("importlinter")
    tree = wheel_tree(tmp_path / "tree")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", RUN, str(tree), str(ROOT / "pyproject.toml")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Contracts: 4 kept, 0 broken." in out, out


def test_the_contracts_catch_a_forbidden_import(tmp_path: Path) -> None:
    """The check itself works: a storage module that imports the broker breaks it."""
    pytest.importorskip("importlinter")
    tree = tmp_path / "tree"
    pkg = tree / "delayd"
    pkg.mkdir(parents=True)
    for f in (ROOT / "delayd").iterdir():
        if f.suffix == ".py":
            (pkg / f.name).symlink_to(f)
    for part in ("broker", "client"):
        (pkg / part).symlink_to(ROOT / part, target_is_directory=True)
    storage = pkg / "storage"
    storage.mkdir()
    for f in (ROOT / "storage").glob("*.py"):
        (storage / f.name).symlink_to(f)
    (storage / "zz_bad.py").write_text("from delayd.broker import errors\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", RUN, str(tree), str(ROOT / "pyproject.toml")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0 and "delayd.storage.zz_bad -> delayd.broker.errors" in r.stdout, r.stdout + r.stderr


def test_nothing_outside_the_store_reaches_into_its_private_state() -> None:
    r = subprocess.run(["git", "grep", "-n", r"store\._", "--", ".", ":!storage/store.py"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == "", f"private Store state used outside storage/store.py:\n{r.stdout}"
