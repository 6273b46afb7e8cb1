"""deploy/cluster.sh: three shards as local processes (DELAYD_CLUSTER_MODE=shards), on free ports,
started and stopped idempotently; and its default mode, etcd plus one replicated shard of three
members, whose settings pass the daemon's own checks."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from delayd.broker import config as config_mod

from tests.deploy.tools import DEPLOY, ROOT
from tests.support.daemon import free_port, wait_until

SCRIPT = DEPLOY / "cluster.sh"
NODES = ["s0", "s1", "s2"]
MEMBERS = ["s0-a", "s0-b", "s0-c"]


def _ports() -> list[int]:
    ports: list[int] = []
    while len(ports) < len(NODES):
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Cluster:
    def __init__(self, data: Path, mode: str = "shards") -> None:
        self.dir = data
        self.mode = mode
        self.ports = _ports()
        self.names = NODES if mode == "shards" else MEMBERS
        self.env = {
            **os.environ,
            "DELAYD_CLUSTER_MODE": mode,
            "DELAYD_CLUSTER_DIR": str(data),
            "DELAYD_CLUSTER_NODES": " ".join(NODES),
            "DELAYD_CLUSTER_ETCD_PORT": str(free_port()),
            "DELAYD_CLUSTER_ETCD_PEER_PORT": str(free_port()),
            "DELAYD_CLUSTER_PORTS": " ".join(map(str, self.ports)),
            "DELAYD_PYTHON": sys.executable,
            "DELAYD_CLUSTER_TIMEOUT": "30",
            "DELAYD_CLUSTER_STOP_TIMEOUT": "20",
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), *args], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=90
        )

    def pids(self) -> dict[str, int]:
        out = {}
        for n in [*self.names, "etcd"]:
            pf = self.dir / f"{n}.pid"
            if pf.exists():
                out[n] = int(pf.read_text().strip())
        return out

    def get(self, port: int, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


def _cleanup(c: Cluster) -> None:
    pids = c.pids()
    c.run("stop")
    for pid in pids.values():  # last resort, by id, if the script failed to stop them
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster-data")
    try:
        yield c
    finally:
        _cleanup(c)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster-data", mode="replicas")
    try:
        yield c
    finally:
        _cleanup(c)


def test_start_status_stop(cluster: Cluster) -> None:
    r = cluster.run("start")
    assert r.returncode == 0, r.stdout + r.stderr
    pids = cluster.pids()
    assert set(pids) == set(NODES)
    for node, port in zip(NODES, cluster.ports, strict=True):
        assert (cluster.dir / node).is_dir() and (cluster.dir / f"{node}.log").is_file()
        assert cluster.get(port, "/readyz")[0] == 200
        status, body = cluster.get(port, "/v1/info")
        assert status == 200 and json.loads(body)["node_id"] == node

    # Idempotent: a second start keeps the same processes.
    r = cluster.run("start")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "already running" in r.stdout
    assert cluster.pids() == pids

    r = cluster.run("status")
    assert r.returncode == 0 and r.stdout.count("readyz=200") == 3, r.stdout + r.stderr

    r = cluster.run("stop")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SIGKILL" not in r.stderr, "shards must exit on SIGTERM"
    assert not any(_alive(pid) for pid in pids.values())
    assert cluster.pids() == {}

    # Idempotent: stopping a stopped cluster is fine; status reports it stopped.
    assert cluster.run("stop").returncode == 0
    r = cluster.run("status")
    assert r.returncode != 0 and r.stdout.count("stopped") == 3


def test_restart_replaces_a_killed_shard_and_keeps_data(cluster: Cluster) -> None:
    assert cluster.run("start").returncode == 0
    s1_port = cluster.ports[1]
    status, body = cluster.get(s1_port, "/readyz")
    assert status == 200
    req = urllib.request.Request(
        f"http://127.0.0.1:{s1_port}/v1/topics/t/messages",
        method="POST",
        data=b'{"body": "x", "delay_ms": 3600000}',
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        msg_id = json.loads(r.read())["messages"][0]["id"]
    assert msg_id.startswith("s1-")

    old = cluster.pids()
    os.kill(old["s1"], signal.SIGKILL)
    wait_until(lambda: not _alive(old["s1"]), 10, 0.01, "s1 to die")

    r = cluster.run("start")  # restarts only the dead shard
    assert r.returncode == 0, r.stdout + r.stderr
    new = cluster.pids()
    assert new["s0"] == old["s0"] and new["s2"] == old["s2"] and new["s1"] != old["s1"]
    status, body = cluster.get(s1_port, f"/v1/messages/{msg_id}")
    assert status == 200 and json.loads(body)["state"] == "scheduled"


def test_start_fails_clearly_on_a_busy_port(cluster: Cluster) -> None:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", cluster.ports[2]))
        s.listen()
        r = cluster.run("start")
    assert r.returncode != 0
    assert f"port 127.0.0.1:{cluster.ports[2]} for s2 is in use" in r.stderr
    assert cluster.pids() == {}, "the shards started by the failed call must be stopped"


def test_sharded_clients_over_the_cluster(cluster: Cluster) -> None:
    """The `make cluster` topology used the way issue 9 describes: messages spread over all
    shards, each delivered once, and cancel by id and by key work from any client."""
    from delayd.client import Client

    assert cluster.run("start").returncode == 0
    urls = [f"http://127.0.0.1:{p}" for p in cluster.ports]
    with Client(urls) as producer, Client(list(reversed(urls))) as other:
        sent = [producer.send("orders", f"o{i}".encode(), key=f"order-{i}", delay_ms=300) for i in range(60)]
        assert {r.id.split("-", 1)[0] for r in sent} == set(NODES), "every shard took some messages"
        far = [producer.send("orders", b"far", key=f"far-{i}", delay_ms=600_000) for i in range(6)]
        # Cancel from the other client: by id for half, by key for the rest.
        for r in far[:3]:
            assert other.cancel(r.id).state == "cancelled"
        for i in range(3, 6):
            assert other.cancel_key("orders", f"far-{i}").state == "cancelled"
        got: dict[str, int] = {}
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            batch = other.pull("orders", "g", max=100, wait_ms=500)
            for m in batch:
                got[m.id] = got.get(m.id, 0) + 1
            if batch:
                other.ack("orders", "g", batch)
        assert set(got) == {r.id for r in sent} and set(got.values()) == {1}
        assert not other.pull("orders", "g", max=100, wait_ms=500), "cancelled messages never arrive"
    assert cluster.run("stop").returncode == 0


def _plan(c: Cluster) -> dict[str, list[str]]:
    r = c.run("plan")
    assert r.returncode == 0, r.stdout + r.stderr
    return {line.split()[0]: shlex.split(line)[1:] for line in r.stdout.splitlines()}


def test_plan_of_the_replicated_shard_passes_the_daemons_checks(replicas: Cluster) -> None:
    """What `start` runs in the default mode: etcd on its ports, and three members of shard s0
    whose replication settings (environment) and flags load and validate exactly as `delayd serve`
    loads them, each advertising its own loopback URL and pointing at that etcd."""
    plan = _plan(replicas)
    assert list(plan) == ["etcd", *MEMBERS]
    etcd = plan["etcd"]
    client_url = f"http://127.0.0.1:{replicas.env['DELAYD_CLUSTER_ETCD_PORT']}"
    assert etcd[etcd.index("--listen-client-urls") + 1] == client_url
    assert etcd[etcd.index("--data-dir") + 1] == str(replicas.dir / "etcd")
    for member, port in zip(MEMBERS, replicas.ports, strict=True):
        words = plan[member]
        env = dict(w.split("=", 1) for w in words if re.fullmatch(r"DELAYD_[A-Z_]+=.*", w))
        cmd = words[len(env):]
        assert cmd[1:4] == ["-m", "delayd", "serve"]
        flags = {"node_id": cmd[cmd.index("--node-id") + 1], "listen": cmd[cmd.index("--listen") + 1]}
        cfg = config_mod.load(env=env, flags=flags)
        assert cfg.replication_enabled and cfg.node_id == "s0" and cfg.replication_member == member
        assert cfg.replication_advertise_url == f"http://127.0.0.1:{port}" and cfg.listen == f"127.0.0.1:{port}"
        assert cfg.replication_etcd_endpoints == (client_url,) and cfg.replication_min_insync == 2
    # The plain shards have neither etcd nor replication settings.
    shards = _plan(Cluster(replicas.dir))
    assert list(shards) == NODES and not any("DELAYD_REPLICATION" in " ".join(w) for w in shards.values())


def test_replicated_shard_starts_or_fails_cleanly(replicas: Cluster) -> None:
    """`start` in the default mode runs etcd, then the three members. A daemon built without the
    replicated data path refuses replication_enabled (docs/replication.md); then start must fail
    naming that, and leave nothing running. With it, the members serve one shard with a primary."""
    r = replicas.run("start")
    if r.returncode != 0:
        assert "replication_enabled" in r.stderr and "start failed" in r.stderr, r.stdout + r.stderr
        assert "etcd ready" in r.stdout, "etcd itself started"
        assert replicas.pids() == {}, "etcd and the members started by the failed call were stopped"
        return
    from delayd.client import Client

    pids = replicas.pids()
    assert set(pids) == {*MEMBERS, "etcd"}
    with Client([f"http://127.0.0.1:{p}" for p in replicas.ports]) as c:
        assert c.send("t", "x", key="k").id.startswith("s0-")
        assert c.shards == {"s0": [f"http://127.0.0.1:{p}" for p in replicas.ports]}
        view = c.cluster()["s0"]
        assert view["primary"] is not None and len(view["members"]) == 3
    r = replicas.run("stop")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not any(_alive(pid) for pid in pids.values()) and replicas.pids() == {}
