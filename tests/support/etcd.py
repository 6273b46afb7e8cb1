"""A real single-member etcd on loopback for tests (Debian's `etcd-server`, 3.4).

Free client and peer ports, its own data directory, and short raft timings (heartbeat 50 ms,
election 500 ms) so that etcd accepts 1 s leases: etcd raises any lease TTL to
ceil(1.5 * election timeout), which is 2 s with its default 1 s election timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.daemon import free_port, wait_until

ETCD = shutil.which("etcd")
HEARTBEAT_MS = 50
ELECTION_MS = 500
START_TIMEOUT_S = 20.0

STARTED: list[EtcdProcess] = []  # tests/conftest.py kills leftovers


class EtcdProcess:
    def __init__(self, data_dir: Path, name: str = "etcd-test") -> None:
        self.data_dir = Path(data_dir)
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def command(self) -> list[str]:
        assert ETCD is not None, "etcd is not installed (scripts/install-test-deps.sh installs etcd-server)"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [ETCD, "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{self.name}={peer}", "--initial-cluster-state", "new",
                "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_MS),
                "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"]

    def start(self) -> EtcdProcess:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        if self not in STARTED:
            STARTED.append(self)
        wait_until(self.healthy, timeout_s=START_TIMEOUT_S, interval_s=0.05, what=f"etcd at {self.endpoint}")
        return self

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as r:
                return b'"health":"true"' in r.read()
        except (OSError, urllib.error.URLError):
            return False

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> EtcdProcess:
        """Start again on the same ports and data directory."""
        self.kill9()
        return self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()
        if self in STARTED:
            STARTED.remove(self)
