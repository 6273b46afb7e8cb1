"""Retention: under steady load with consumers keeping up, the oldest segments go while the
load runs, and once it stops, disk falls back to the segments being written, however much was
produced; a message due far beyond the (tiny) roll window does not pin old segments and still
arrives on time. A topic that went quiet does not keep the log of the others.

What retention keeps under load is the last few seconds' worth (roll window, the reader's lead,
a margin), so a size measured during the load follows the machine's speed: a test that compared
thirds of the load failed in CI when the daemon fell behind. The bound here is checked after the
load, when what is kept no longer depends on how fast anything ran."""

from __future__ import annotations

import contextlib
import time

from delayd.storage.keyindex import sqlite_bytes
from delayd.storage.segments import list_segments

from tests.integration.helpers import ack, drain, now_ms, produce, pull
from tests.support.daemon import DaemonProcess, wait_until

SEGMENT_BYTES = 65536
SMALL = f"""precision_ms = 100
roll_window_ms = 2000
checkpoint_interval_ms = 100
segment_bytes = {SEGMENT_BYTES}
timerlog_segment_units = 512
ready_segment_units = 256
msgtable_segment_entries = 1024
retention_ms = 0
retention_interval_ms = 200
"""


def test_disk_falls_back_after_load_and_far_message_is_on_time(tmp_path):
    data = tmp_path / "data"
    d = DaemonProcess(data, config_text=SMALL).start()

    def disk_without_sqlite():
        # The SQLite indexes' write-ahead logs grow a page a checkpoint (10 a second here) up to
        # SQLite's 1,000 pages, longer than this test: they are not what retention deletes.
        sqlite = sqlite_bytes(data / "keys.sqlite") + sqlite_bytes(data / "far.sqlite")
        return d.request("GET", "/v1/stats")[1]["disk_bytes"] - sqlite

    def files():
        out = {}
        for p in data.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # (deleted meanwhile)
                if p.is_file():
                    out[str(p.relative_to(data))] = p.stat().st_size
        return out

    got_far = []

    def pull_and_ack(wait_ms):
        batch = pull(d, "steady", "g", wait_ms=wait_ms)
        got_far.extend(m for m in batch if m["id"] == far)
        if batch:
            ack(d, "steady", "g", [m["receipt"] for m in batch])

    try:
        far_at = now_ms() + 16_000
        far = produce(d, "steady", [{"body": "far", "deliver_at": far_at}])[0]["id"]
        produced = 0
        tick = time.monotonic()
        end = tick + 12
        body = "x" * 200
        while time.monotonic() < end:
            produce(d, "steady", [{"body": body, "delay_ms": 200} for _ in range(100)])
            produced += 100 * len(body)
            pull_and_ack(50)
            tick += 0.1  # a steady load; the pace is not a wait for a condition
            time.sleep(max(0.0, tick - time.monotonic()))
        # While the load ran, retention deleted the oldest segments of every kind...
        for kind in ("commitlog", "timerlog", "ready/steady"):
            assert list_segments(data / kind)[0] > 0, f"the oldest {kind} segments should be deleted"
        # ...but not the message table's first segment: it holds the far message, still pending.
        table = list_segments(data / "msgtable")
        assert table[0] == 0 and table[1] > 1, table[:4]

        # Once consumers are done, disk falls back to the segments being written (about 180 KB
        # here, against the 2.4 MB the load wrote).
        last: list[object] = []

        def settled():
            pull_and_ack(100)
            kept = disk_without_sqlite()
            last[:] = [kept, files()]
            return kept if kept < 5 * SEGMENT_BYTES else None
        try:
            kept = wait_until(settled, 30, 0, "retention to delete what the load wrote")
        except TimeoutError:
            raise AssertionError(f"kept {last[0]} bytes: {last[1]}") from None
        print(f"produced {produced} body bytes; {kept} bytes kept after the load")
        assert produced > 20 * SEGMENT_BYTES  # so keeping everything could not pass

        wait_until(lambda: pull_and_ack(200) or got_far, 10, 0, "the far-future message")
        m = got_far[0]
        assert m["body"] == "far" and m["delivered_at"] >= far_at
        assert m["delivered_at"] - far_at < 500
        assert "retention deleted segments" in d.log_path.read_text()
    finally:
        d.stop()


def test_a_quiet_topic_does_not_keep_the_log(tmp_path):
    # One message on "quiet", delivered and acked; its queue's only segment never fills. Before,
    # that segment's unit kept the whole commit log (every topic's) from its record on, forever.
    data = tmp_path / "data"
    d = DaemonProcess(data, config_text=SMALL).start()
    try:
        produce(d, "quiet", [{"body": "q", "delay_ms": 100}])
        assert [m["body"] for m in drain(d, "quiet", "g", 1)] == ["q"]
        for _ in range(5):  # past the first commit segment
            produce(d, "busy", [{"body": "x" * 200, "delay_ms": 100} for _ in range(100)])
        assert len(drain(d, "busy", "g", 500)) == 500

        wait_until(lambda: list_segments(data / "commitlog")[0] > 0, 30, 0.05,
                   "retention to delete the first commit segment")
        # A group created now starts past the unit whose record is gone (not at an unreadable
        # message it would dead-letter), and gets what comes next.
        assert pull(d, "quiet", "late") == []
        produce(d, "quiet", [{"body": "again", "delay_ms": 100}])
        assert [m["body"] for m in drain(d, "quiet", "late", 1)] == ["again"]
        assert "unreadable" not in d.log_path.read_text()
    finally:
        d.stop()
