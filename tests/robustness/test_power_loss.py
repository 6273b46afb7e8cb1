"""Power loss, simulated: kill -9 keeps the page cache, a power cut does not. What was written
but not fsynced may be gone; the commit log is fsynced before produce answers, the derived
files (message table, TimerLog, ready queues, wheel) only at checkpoints.

The simulation: kill -9, then put back on disk what the last fsync left there. Here that is
the message-table entries of messages produced after the last checkpoint (their 16-byte
entries are zeroed: pages that never reached the disk read back as holes).
"""

from __future__ import annotations

from delayd.storage.msgtable import ENTRY_SIZE

from tests.integration.wire import Api
from tests.support.daemon import DaemonProcess

# One checkpoint at start, then none for a minute: everything below happens after it.
CONFIG = "precision_ms = 100\ncheckpoint_interval_ms = 60000\n"


def test_produce_survives_losing_unsynced_message_table_pages(tmp_path):
    d = DaemonProcess(tmp_path / "data", config_text=CONFIG).start()
    api = Api(d)
    ids = [m["id"] for m in api.produce("pl", *({"body": f"m{i}", "delay_ms": 1500} for i in range(10)))]
    d.kill9()
    seqs = [int(i.split("-", 1)[1], 16) for i in ids]
    table = d.data_dir / "msgtable" / f"{0:020d}"
    with open(table, "r+b") as f:  # the entries' page never made it to the disk
        for seq in seqs:
            f.seek(seq * ENTRY_SIZE)
            f.write(bytes(ENTRY_SIZE))
    d.start()
    try:
        got = api.pull_until("pl", "g", len(ids), timeout_s=4, ack=True)
        assert sorted(m["id"] for m in got) == sorted(ids)
    finally:
        d.stop()
