"""File descriptors (issue 17, item 2): more topics than RLIMIT_NOFILE allows open files, pulls on
topics that do not exist, and a daemon pushed to its very last descriptor.

- ready queues are opened on demand and closed by an LRU bound (`ready_queue_open_files`), so a
  daemon under `RLIMIT_NOFILE=256` serves 300 topics, and starts again under the same limit;
- a pull on an unknown topic creates no file and no directory (and holds no descriptor);
- out of descriptors, a request that needs one answers 503 `unavailable` with Retry-After, and the
  daemon stays up and answers it once descriptors are free again.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path
from typing import Any

import msgpack

from tests.integration.wire import Api, call, daemon_log_clean
from tests.support.daemon import DaemonProcess, wait_until

LIMIT = 256
TOPICS = 300  # more topics than the process may open files
READY_OPEN = 16
CONFIG = f"ready_queue_open_files = {READY_OPEN}\ncheckpoint_interval_ms = 200\n"


def ready_entries(d: DaemonProcess) -> list[str]:
    root = d.data_dir / "ready"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def assert_few_files_open(d: DaemonProcess) -> None:
    """At most `ready_queue_open_files` ready queues open, and few files in all. Polled: a
    checkpoint holds duplicates of the descriptors it fsyncs until its worker thread is done,
    including those of queues the LRU closed meanwhile (seen: 23 ready files for an instant)."""
    def few() -> bool:
        files = d.open_files()
        return len([f for f in files if f.startswith("ready/")]) <= READY_OPEN and len(files) < 48

    try:
        wait_until(few, 10, 0.02, "few files open")
    except TimeoutError:
        raise AssertionError(f"ready queues must not stay open, one per topic: {d.open_files()}") from None


def test_more_topics_than_the_descriptor_limit(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "data", config_text=CONFIG, rlimit_nofile=LIMIT).start()
    try:
        api = Api(d)
        topics = [f"fd.t{i}" for i in range(TOPICS)]
        ids = {t: api.produce(t, {"body": t})[0]["id"] for t in topics}
        wait_until(lambda: api.stats()["delivered_total"] == TOPICS, 30, 0.05, "every message released")
        assert len(ready_entries(d)) == TOPICS
        assert_few_files_open(d)
        for t in topics:
            got = api.pull(t, "g", max=10, wait_ms=1000)
            assert [m["id"] for m in got] == [ids[t]], t
            assert api.ack(t, "g", [m["receipt"] for m in got])["acked"] == 1
        assert_few_files_open(d)

        # Pulls on topics nobody produced to create nothing on disk.
        before = ready_entries(d)
        for i in range(200):
            assert api.pull(f"fd.none{i}", "g") == []
        assert ready_entries(d) == before
        assert not any(p.name.startswith("fd.none") for p in d.data_dir.rglob("*"))

        # A restart under the same limit: startup opens one queue at a time.
        d.kill9()
        d.start()
        assert_few_files_open(d)
        for t in topics[::7]:
            assert api.pull(t, "g", wait_ms=200) == [], f"{t}: an acked message came back"
            api.produce(t, {"body": "again"})
        wait_until(lambda: api.stats()["delivered_total"] >= len(topics[::7]), 30, 0.05, "the new ones released")
        for t in topics[::7]:
            assert [m["body"] for m in api.pull(t, "g", wait_ms=2000)] == ["again"], t
        assert d.stop() == 0
        daemon_log_clean(d)
        assert "Too many open files" not in d.log_path.read_text(errors="replace")
    finally:
        d.kill9()


def _request(conn: http.client.HTTPConnection, method: str, path: str,
             body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], Any]:
    data = None if body is None else json.dumps(body)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(resp.read())


def test_out_of_descriptors_answers_503_and_the_daemon_stays_up(tmp_path: Path) -> None:
    # Small commit-log segments: reading a record of an older one opens that segment. No
    # checkpoint while the test holds the descriptors (its short-lived dups would come and go).
    d = DaemonProcess(tmp_path / "data", config_text="segment_bytes = 4096\ncheckpoint_interval_ms = 120000\n",
                      rlimit_nofile=LIMIT).start()
    held: list[socket.socket] = []
    try:
        api = Api(d)
        ids = [m["id"] for m in api.produce("fd.old", *({"body": f"old {i}", "delay_ms": 3_600_000}
                                                        for i in range(100)))]
        assert len(list((d.data_dir / "commitlog").iterdir())) >= 2
        assert d.stop() == 0  # a fresh start opens only what it needs: not the oldest segment
        d.start()
        probe = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
        assert _request(probe, "GET", f"/v1/messages/{ids[-1]}")[0] == 200  # opens the message table
        # Take every descriptor the daemon has left: idle connections it accepts (a few more than
        # it can: those it cannot accept wait in the backlog or are closed).
        held += [socket.create_connection(("127.0.0.1", d.port)) for _ in range(LIMIT - d.open_fds() + 8)]
        full_since: list[float] = []

        def steady() -> bool:  # the event loop's accept handling closes and reopens a spare
            if d.open_fds() < LIMIT:
                full_since.clear()
                return False
            full_since.append(time.monotonic())
            return full_since[-1] - full_since[0] >= 0.3
        wait_until(steady, 10, 0.02, "the descriptor count to stay at the limit")

        # The first message's record lives in the oldest segment, not opened by this incarnation.
        status, headers, body = _request(probe, "GET", f"/v1/messages/{ids[0]}")
        assert status == 503, (status, body, d.open_fds())
        assert body["error"]["code"] == "unavailable" and "descriptor" in body["error"]["message"]
        assert int(headers["retry-after"]) >= 1
        # A produce needs none (the group commit fsyncs through the open file when it cannot dup).
        # In msgpack: the first JSON body of a process imports a codec module, which needs a
        # descriptor (that produce would answer 503 too).
        probe.request("POST", "/v1/topics/fd.old/messages", body=msgpack.packb({"body": b"at the limit"}),
                      headers={"Content-Type": "application/msgpack"})
        resp = probe.getresponse()
        answer = msgpack.unpackb(resp.read())
        assert resp.status == 200 and answer["messages"][0]["id"].startswith("d-"), (resp.status, answer)
        for s in held:
            s.close()
        held.clear()
        wait_until(lambda: d.open_fds() < LIMIT - 16, 10, 0.02, "the connections closed")
        status, _headers, body = _request(probe, "GET", f"/v1/messages/{ids[0]}")
        assert status == 200 and body["body"] == "old 0", body
        assert call(d, "GET", "/readyz").status == 200 and d.proc is not None and d.proc.poll() is None
        assert "fatal" not in d.log_path.read_text(errors="replace")
        probe.close()
    finally:
        for s in held:
            s.close()
        d.kill9()
