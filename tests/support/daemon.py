"""Start the real delayd daemon as a child process on loopback, for integration tests.

Every integration test talks HTTP to a real `python -m delayd serve` process; nothing is mocked.
Waiting is always "poll until a condition, with a deadline" — never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


# free_port's ports lie below Linux's ephemeral range (32768-60999 by default), so no client
# connection's local port takes one between the pick and the server's bind; each pytest-xdist
# worker (PYTEST_XDIST_WORKER gw0, gw1, ...; none when pytest runs alone) draws from its own
# PORTS_PER_WORKER of them, so two workers never hand out the same port. Within a process the
# ports are handed out in turn from a random start, so a port handed out and not bound yet (a
# cluster picks all its members' ports before it starts any) is not handed out again until the
# whole range has been.
FIRST_PORT = 10000
PORTS_PER_WORKER = 1000
_picker = random.Random()
_turn: list[int] = []  # the place in the range the next pick starts from, once drawn


def port_range(worker: str | None) -> range:
    """The ports free_port draws from in the xdist worker `worker` ("gw3"; None: no worker)."""
    n = int(worker.removeprefix("gw")) + 1 if worker and worker.startswith("gw") else 0
    start = FIRST_PORT + n * PORTS_PER_WORKER
    if start + PORTS_PER_WORKER > 32768:
        raise RuntimeError(f"xdist worker {worker}: more workers than free_port has port ranges for")
    return range(start, start + PORTS_PER_WORKER)


def free_port() -> int:
    """A loopback port nothing is bound to now, from this process's own range (port_range), the
    next in turn."""
    ports = port_range(os.environ.get("PYTEST_XDIST_WORKER"))
    if not _turn:
        _turn.append(_picker.randrange(len(ports)))
    for _ in range(len(ports)):
        port = ports[_turn[0] % len(ports)]
        _turn[0] += 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports}")


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.01,
               what: str = "condition") -> Any:
    """Poll `predicate` until it returns a truthy value; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


async def until(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition",
                interval_s: float = 0.01) -> Any:
    """`wait_until` for a test running on an event loop: poll `predicate` (sync) until it returns
    a truthy value, letting the loop run in between; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


STARTED: list[DaemonProcess] = []  # every daemon a test started; tests/conftest.py reaps leftovers


def files_open(pid: int | str, root: Path) -> list[str]:
    """The files under `root` that process `pid` ("self": this one) holds open, each once,
    relative to `root`."""
    fd_dir = f"/proc/{pid}/fd"
    prefix = str(Path(root).resolve()) + os.sep
    paths = set()
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith(prefix):
            paths.add(target[len(prefix):])
    return sorted(paths)


class DaemonProcess:
    """One `delayd serve` process with its own data directory and port.

    `restart()` keeps the data directory, so crash tests can `kill9()` and come back.
    `command_prefix` replaces `python -m delayd` (the benchmark runs other builds that way);
    `new_session` puts the daemon in its own session, so a Ctrl-C in the terminal reaches only the
    parent, which then stops the daemon itself.
    `node_id` is passed as `--node-id` (default "d", so tests about something else can spell
    message ids); None leaves it unset, for the daemon to record or generate one.
    `rlimit_nofile` starts the daemon with that RLIMIT_NOFILE (soft and hard).
    """

    def __init__(self, data_dir: Path, *, port: int | None = None, fsync: str = "always",
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 config_text: str | None = None, command_prefix: list[str] | None = None,
                 new_session: bool = False, node_id: str | None = "d", rlimit_nofile: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.node_id = node_id
        self.rlimit_nofile = rlimit_nofile
        self.port = port or free_port()
        self.fsync = fsync
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.config_text = config_text
        self.command_prefix = list(command_prefix or [sys.executable, "-m", "delayd"])
        self.new_session = new_session
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-daemon.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [*self.command_prefix, "serve", "--data-dir", str(self.data_dir),
               "--listen", f"127.0.0.1:{self.port}", "--fsync", self.fsync]
        if self.config_text is not None:
            cfg = self.data_dir.parent / f"{self.data_dir.name}-config.toml"
            cfg.write_text(self.config_text)
            cmd += ["--config", str(cfg)]
        if self.node_id is not None and "--node-id" not in self.extra_args:
            cmd += ["--node-id", self.node_id]
        return cmd + self.extra_args

    def start(self, wait_ready: bool = True, timeout_s: float = 30.0) -> DaemonProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        limit = self.rlimit_nofile

        def preexec() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        self.proc = subprocess.Popen(self.command(), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=self.new_session,
                                     preexec_fn=preexec if limit is not None else None)
        log.close()
        STARTED.append(self)
        if wait_ready:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as r:
                    return r.status == 200
            except (urllib.error.URLError, ConnectionError, OSError):
                return False
        wait_until(ready, timeout_s, 0.02, "daemon /readyz")

    def open_fds(self) -> int:
        """How many descriptors the daemon process holds now (Linux /proc)."""
        assert self.proc is not None
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def open_files(self) -> list[str]:
        """The files of its data directory it holds open, each once, relative to the directory
        (sockets, pipes and logs left out: a busy event loop closes finished connections late,
        which says nothing about its files). Each file once: a checkpoint fsyncs through
        short-lived duplicates of the descriptors it already holds, which open no new file."""
        assert self.proc is not None
        return files_open(self.proc.pid, self.data_dir)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait: the graceful path. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise
        return int(self.proc.returncode)

    def restart(self, wait_ready: bool = True) -> DaemonProcess:
        self.kill9()
        return self.start(wait_ready)

    # Small synchronous JSON helpers so tests read plainly.
    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                timeout_s: float = 30.0) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")
