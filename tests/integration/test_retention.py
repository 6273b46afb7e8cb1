"""Retention: under steady load with consumers keeping up, disk use plateaus, and a message
due far beyond the (tiny) roll window does not pin old segments and still arrives on time.

The load is paced (100 messages every 100 ms): what retention keeps is the last few seconds'
worth, so a test that produced as fast as it could measured its machine's speed (a busy
neighbour in the first two thirds, none in the last, looked like growth)."""

from __future__ import annotations

import time

from delayd.storage.keyindex import sqlite_bytes

from tests.integration.helpers import ack, now_ms, produce, pull
from tests.support.daemon import DaemonProcess, wait_until

SMALL = """precision_ms = 100
roll_window_ms = 2000
checkpoint_interval_ms = 100
segment_bytes = 65536
timerlog_segment_units = 512
ready_segment_units = 256
msgtable_segment_entries = 1024
retention_ms = 0
retention_interval_ms = 200
"""


def test_disk_plateaus_and_far_message_is_on_time(tmp_path):
    d = DaemonProcess(tmp_path / "data", config_text=SMALL).start()
    try:
        far_at = now_ms() + 16_000
        far = produce(d, "steady", [{"body": "far", "deliver_at": far_at}])[0]["id"]
        samples = []
        got_far = []
        tick = time.monotonic()
        end = tick + 15
        body = "x" * 200
        while time.monotonic() < end:
            produce(d, "steady", [{"body": body, "delay_ms": 200} for _ in range(100)])
            batch = pull(d, "steady", "g", wait_ms=50)
            got_far += [m for m in batch if m["id"] == far]
            if batch:
                ack(d, "steady", "g", [m["receipt"] for m in batch])
            # Without the SQLite indexes: with nothing keyed their write-ahead logs still grow a
            # page a checkpoint (10 a second here) up to SQLite's 1,000, longer than this test.
            sqlite = sqlite_bytes(tmp_path / "data" / "keys.sqlite") + sqlite_bytes(tmp_path / "data" / "far.sqlite")
            samples.append(d.request("GET", "/v1/stats")[1]["disk_bytes"] - sqlite)
            tick += 0.1  # the pace, not a wait for a condition
            time.sleep(max(0.0, tick - time.monotonic()))
        third = len(samples) // 3
        mid, last = max(samples[third:2 * third]), max(samples[2 * third:])
        print(f"disk bytes: first third max {max(samples[:third])}, middle {mid}, last {last}")
        assert last < mid * 1.5, f"disk keeps growing: {mid} -> {last}"
        def segments(kind):
            return sorted(int(p.name) for p in (tmp_path / "data" / kind).iterdir() if p.name.isdigit())
        for kind in ("commitlog", "timerlog", "ready/steady"):
            assert segments(kind)[0] > 0, f"the oldest {kind} segments should be deleted"
        # The message table's first segment holds the far message (still pending): only it stays.
        table = segments("msgtable")
        assert table[0] == 0 and table[1] > 1, table[:4]

        def far_arrived():
            batch = pull(d, "steady", "g", wait_ms=200)
            got_far.extend(m for m in batch if m["id"] == far)
            if batch:
                ack(d, "steady", "g", [m["receipt"] for m in batch])
            return got_far
        wait_until(far_arrived, 10, 0, "the far-future message")
        m = got_far[0]
        assert m["body"] == "far" and m["delivered_at"] >= far_at
        assert m["delivered_at"] - far_at < 500
        assert "retention deleted segments" in d.log_path.read_text()
    finally:
        d.stop()
