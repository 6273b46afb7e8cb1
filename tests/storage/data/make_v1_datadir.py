"""How tests/storage/data/v1-datadir.tar.gz was made: run at commit 555d8e0 (the last build that
wrote header-less TimerLog, ready-queue and message-table segments, and no `meta` file), as

    .venv/bin/python tests/storage/data/make_v1_datadir.py OUT_DIR

It drives a Store on a fake clock with the small test geometry (tests/storage/driver.py SMALL):
messages delivered, pending (near and rolled far), cancelled, keyed; two checkpoints, more work
after the last one, then a stop without a final checkpoint (what kill -9 leaves). The outcome it
expects is written next to the data as expected.json. Run against a later build it would write
that build's format, so it is kept for the record only.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from delayd.storage.msgtable import MessageState
from delayd.storage.store import NewMessage

from tests.storage.driver import Driver, delivered_seqs, open_store, topic_of

T0 = 1_000_000


def main(out: Path) -> None:
    rng = random.Random(7)
    clock = [T0]
    data = out / "data"
    s = open_store(data, clock)
    drv = Driver(s, clock)
    acked: dict[int, int] = {}
    cancelled: list[int] = []
    for round_ in range(30):
        msgs = [NewMessage(rng.choice(["orders", "mail"]), b"v1-%d" % rng.randrange(10**6),
                           drv.now + rng.choice([rng.randrange(-20, 300), rng.randrange(600, 2000)]),
                           tag=rng.choice([None, "t"]), key=rng.choice([None, f"k{round_}"]),
                           headers=rng.choice([None, {"h": "v"}])) for _ in range(rng.randrange(1, 6))]
        seqs = s.append_messages(msgs, drv.now)
        s.flush_commit()
        acked.update({q: m.deliver_at for q, m in zip(seqs, msgs, strict=True)})
        if round_ % 4 == 3:
            seq = rng.choice(sorted(acked))
            if s.state(seq)[0] == MessageState.SCHEDULED:
                s.append_cancel(seq, topic_of(s, seq))
                s.flush_commit()
                cancelled.append(seq)
        drv.advance(20, checkpoint_every_ms=10**9)
        if round_ in (10, 20):
            drv.checkpoint()
    expected = {"clock": clock[0], "acked": {str(k): v for k, v in acked.items()}, "cancelled": cancelled,
                "delivered": sorted(delivered_seqs(s)), "next_seq": s.next_seq}
    s.close()  # no final checkpoint
    (out / "expected.json").write_text(json.dumps(expected, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
