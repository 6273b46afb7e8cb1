"""A replicated shard on loopback for tests: a real etcd (tests/support/etcd.py) and 2–3 real
daemons (tests/support/daemon.py), each a member of shard "s0" with its own data directory."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from tests.support.daemon import DaemonProcess, free_port, wait_until
from tests.support.etcd import EtcdProcess

SHARD = "s0"
LEASE_TTL_MS = 1000  # the tests' etcd (500 ms election timeout) grants 1 s leases
FENCE_MARGIN_MS = 200
MAX_LAG_MS = 3000


class Cluster:
    def __init__(self, root: Path, etcd: EtcdProcess, names: tuple[str, ...] = ("a", "b", "c"),
                 min_insync: int = 2, max_lag_ms: int = MAX_LAG_MS, config_text: str | None = None,
                 token: str | None = None) -> None:
        self.root = root
        self.etcd = etcd
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}  # for the views below
        self.prefix = f"/t-{uuid.uuid4().hex[:10]}"
        self.members: dict[str, DaemonProcess] = {}
        for name in names:
            port = free_port()
            env = {
                "DELAYD_REPLICATION_ENABLED": "true",
                "DELAYD_REPLICATION_MEMBER": name,
                "DELAYD_REPLICATION_ADVERTISE_URL": f"http://127.0.0.1:{port}",
                "DELAYD_REPLICATION_ETCD_ENDPOINTS": etcd.endpoint,
                "DELAYD_REPLICATION_ETCD_TIMEOUT_MS": "500",
                "DELAYD_REPLICATION_LEASE_TTL_MS": str(LEASE_TTL_MS),
                "DELAYD_REPLICATION_FENCE_MARGIN_MS": str(FENCE_MARGIN_MS),
                "DELAYD_REPLICATION_KEY_PREFIX": self.prefix,
                "DELAYD_REPLICATION_MIN_INSYNC": str(min_insync),
                "DELAYD_REPLICATION_MAX_LAG_MS": str(max_lag_ms),
                "DELAYD_LOG_LEVEL": "info",
            }
            self.members[name] = DaemonProcess(root / name, port=port, env=env, node_id=SHARD,
                                               config_text=config_text)
        self.stopped: set[str] = set()  # SIGSTOPped

    # -- processes ----------------------------------------------------------------------------
    def start(self, *names: str) -> Cluster:
        for n in names or tuple(self.members):
            self.members[n].start(wait_ready=False)
        for n in names or tuple(self.members):
            self.members[n].wait_ready(60)
        return self

    def kill9(self, name: str) -> None:
        if name in self.stopped:
            self.cont(name)
        self.members[name].kill9()

    def restart(self, name: str) -> None:
        self.members[name].start(wait_ready=True, timeout_s=60)

    def stop(self, name: str) -> None:
        """SIGSTOP: frozen, as a paused VM or a partition from everything."""
        proc = self.members[name].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        self.stopped.add(name)

    def cont(self, name: str) -> None:
        proc = self.members[name].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGCONT)
        self.stopped.discard(name)

    def alive(self, name: str) -> bool:
        p = self.members[name].proc
        return p is not None and p.poll() is None

    def shutdown(self) -> None:
        for n in list(self.stopped):
            self.cont(n)
        for d in self.members.values():
            try:
                d.stop(timeout_s=10)
            except Exception:  # noqa: BLE001 - teardown: kill whatever did not stop
                d.kill9()

    # -- views --------------------------------------------------------------------------------
    def get(self, name: str, path: str, timeout_s: float = 2.0) -> tuple[int, Any]:
        try:
            req = urllib.request.Request(self.members[name].url + path, headers=self.headers)
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")
        except (OSError, ValueError):
            return 0, None

    def role(self, name: str) -> str | None:
        if not self.alive(name) or name in self.stopped:
            return None
        status, body = self.get(name, "/v1/info", 1.0)
        return body.get("role") if status == 200 and isinstance(body, dict) else None

    def primaries(self) -> list[str]:
        return [n for n in self.members if self.role(n) == "primary"]

    def wait_primary(self, timeout_s: float = 15.0, exclude: str | None = None) -> str:
        def one() -> str | None:
            p = [n for n in self.primaries() if n != exclude]
            return p[0] if len(p) == 1 else None
        return str(wait_until(one, timeout_s, 0.05, "one primary"))

    def cluster_view(self, name: str) -> dict[str, Any] | None:
        """`name`'s GET /v1/cluster; None while it answers 503 `unavailable` (the coordinator did
        not answer it in time, as on a loaded machine after a fault): for polls, where that is
        "not yet". Any other failed answer fails at once."""
        status, body = self.get(name, "/v1/cluster")
        if status == 503 and isinstance(body, dict) and body.get("error", {}).get("code") == "unavailable":
            return None
        assert status == 200, (status, body)
        return dict(body)

    def cluster(self, name: str) -> dict[str, Any]:
        view = self.cluster_view(name)
        assert view is not None, f"{name}: /v1/cluster answered 503 unavailable"
        return view

    def isr(self, primary: str) -> list[str]:
        return list(self.cluster(primary)["isr"]["members"])

    def wait_isr(self, primary: str, size: int, timeout_s: float = 15.0) -> list[str]:
        """The primary's in-sync set once it has `size` members (a 503 `unavailable` is "not yet",
        like a set of the wrong size: `cluster_view`)."""
        def members() -> list[str] | None:
            view = self.cluster_view(primary)
            m = list(view["isr"]["members"]) if view is not None else []
            return m if len(m) == size else None
        return list(wait_until(members, timeout_s, 0.05, f"an in-sync set of {size}"))

    def describe(self, log_lines: int = 25) -> str:
        """What each member says of itself now (role, pipeline stages and depths, groups, counts)
        and the tail of its log: printed with a torture failure, so that a stall can be placed."""
        out = []
        for name, d in self.members.items():
            status, stats = self.get(name, "/v1/stats", 2.0)
            if status == 200 and isinstance(stats, dict):
                keep = ("scheduled", "produced_total", "delivered_total", "pipeline", "pipeline_state", "groups")
                said = json.dumps({k: stats.get(k) for k in keep}, sort_keys=True)
            else:
                said = f"/v1/stats: {status}"
            out.append(f"--- {name}: role {self.role(name)}, alive {self.alive(name)}, stopped {name in self.stopped}\n"
                       f"{said}\n{d.log_tail(log_lines)}")
        return "\n".join(out)

    def log_bytes(self, name: str) -> bytes:
        d = self.root / name / "commitlog"
        return b"".join((d / f).read_bytes() for f in sorted(os.listdir(d)))

    def log_end(self, name: str) -> int:
        d = self.root / name / "commitlog"
        files = sorted(os.listdir(d))
        return int(files[-1]) + (d / files[-1]).stat().st_size if files else 0
