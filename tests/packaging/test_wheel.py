"""The wheel as a user gets it: built from the tracked files, installed into a fresh virtualenv
outside the repository, then used from a directory outside the repository — `delayd serve`,
`delayd send`, `delayd consume`, `from delayd import Client`, and `mypy --strict` on a user's
script that uses the SDK (sync and async) against the installed, typed package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import ROOT, free_port, wait_until

USER_SCRIPT = '''\
"""A user's script: typed use of the SDK, checked by mypy --strict."""
import asyncio
from datetime import UTC, datetime, timedelta

from delayd import AsyncClient, Client, ReceivedMessage, SendResult


def schedule(url: str) -> SendResult:
    with Client(url) as c:
        result: SendResult = c.send("orders", b"close 42", delay_ms=timedelta(seconds=1), key="o-42")
        c.cancel_key("orders", "o-42")
        return result


async def consume(url: str) -> list[str]:
    async with AsyncClient(url, encoding="json") as c:
        await c.send("orders", "close 43", deliver_at=datetime.now(UTC))
        got: list[ReceivedMessage] = await c.pull("orders", "closer", max=10, wait_ms=2_000)
        await c.ack("orders", "closer", got)
        return [m.text for m in got]


if __name__ == "__main__":
    print(schedule("http://127.0.0.1:7070").id)
    print(asyncio.run(consume("http://127.0.0.1:7070")))
'''


def run(cmd: list[str], cwd: Path, timeout_s: float = 300, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, **kw)  # type: ignore[call-overload]
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def outside() -> Iterator[Path]:
    """A directory outside the repository (pytest's basetemp may be anywhere, so not that)."""
    d = Path(tempfile.mkdtemp(prefix="delayd-wheel-"))
    assert ROOT not in d.parents
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def wheel(outside: Path) -> Path:
    # A copy of the tracked files: the wheel must build from what a clone has, and the build's
    # scratch files (build/, *.egg-info) stay out of the working tree.
    src = outside / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    r = run([sys.executable, "-m", "build", "--wheel", "--outdir", str(outside / "dist"), str(src)], outside)
    # The metadata is current: no deprecation (the license as an SPDX expression, not a table).
    assert "deprecat" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    # Every folder shipped is a declared package (setuptools warns of one that is not, as of broker/ui).
    assert "absent from the `packages` configuration" not in r.stdout + r.stderr, r.stdout + r.stderr
    (whl,) = (outside / "dist").glob("delayd-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(outside: Path, wheel: Path) -> Path:
    v = outside / "venv"
    run([sys.executable, "-m", "venv", str(v)], outside)
    run([str(v / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], outside)
    return v


def test_wheel_holds_one_delayd_package_and_its_marker(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.startswith("delayd-")}
    assert tops == {"delayd"}, f"only the delayd package is installed, not {tops}"
    assert "delayd/py.typed" in names
    assert {"delayd/broker/http.py", "delayd/storage/commitlog.py", "delayd/client/aio.py"} <= set(names)
    console = {f"delayd/broker/ui/{p.name}" for p in (ROOT / "broker" / "ui").iterdir()}
    assert console and console <= set(names), f"the web console's files are shipped: {sorted(console - set(names))}"
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: Apache-2.0" in text and "Project-URL: " in text


@pytest.mark.slow
def test_installed_wheel_serves_sends_consumes_and_types_check(venv: Path, outside: Path) -> None:
    work = outside / "work"
    work.mkdir()
    bin_ = venv / "bin"
    where = run([str(bin_ / "python"), "-c", "import delayd; print(delayd.__file__)"], work).stdout.strip()
    assert Path(where).is_relative_to(venv), f"delayd imported from {where}, not the fresh virtualenv"
    assert run([str(bin_ / "delayd"), "--version"], work).stdout.strip().startswith("delayd ")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (work / "daemon.log").open("wb")
    daemon = subprocess.Popen([str(bin_ / "delayd"), "serve", "--data-dir", "data", "--listen", f"127.0.0.1:{port}"],
                              cwd=work, stdout=log, stderr=subprocess.STDOUT,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        def ready() -> bool:
            assert daemon.poll() is None, (work / "daemon.log").read_text()
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_until(ready, 60, 0.05, "the installed daemon")
        sent = run([str(bin_ / "delayd"), "send", "wheel", "hello from the wheel", "--url", url, "--json"], work)
        mid = json.loads(sent.stdout)["id"]
        got = run([str(bin_ / "delayd"), "consume", "wheel", "g", "--count", "1", "--json", "--url", url], work)
        (line,) = got.stdout.splitlines()
        assert json.loads(line)["id"] == mid and json.loads(line)["body"] == "hello from the wheel"
        sdk = run([str(bin_ / "python"), "-c",
                   "from delayd import Client, __version__\n"
                   f"with Client({url!r}) as c:\n"
                   "    r = c.send('wheel-sdk', b'x')\n"
                   "    (m,) = c.pull('wheel-sdk', 'g', wait_ms=5000)\n"
                   "    assert m.id == r.id and c.ack('wheel-sdk', 'g', m).acked == 1\n"
                   "    print(__version__, c.info()[0].version)"], work)
        version, served = sdk.stdout.split()
        assert version == served
        script = work / "user_script.py"
        script.write_text(USER_SCRIPT.replace("http://127.0.0.1:7070", url))
        out = run([str(bin_ / "python"), str(script)], work).stdout.splitlines()
        assert out[1] == "['close 43']"
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0, (work / "daemon.log").read_text()
        log.close()
    # The repository's mypy, the fresh virtualenv's packages: the installed delayd is typed.
    r = run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable",
             str(bin_ / "python"), str(script)], work)
    assert "Success: no issues found in 1 source file" in r.stdout
