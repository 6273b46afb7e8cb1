"""One replication Coordinator in a process of its own, so that a test can SIGSTOP and SIGCONT it.

    python -m tests.support.coord_member CONFIG_JSON OUT_JSONL

CONFIG_JSON holds ReplicationConfig's fields. Every role change is appended to OUT_JSONL as
`{"event": ...}`. A checker calls `may_acknowledge()` every CHECK_EVERY_S and appends
`{"check": bool, "gap_s": s}` whenever the answer changes or the time since the previous check
exceeds GAP_REPORT_S (the process was frozen): the line right after a freeze is the first check
made after waking.
"""

from __future__ import annotations

import asyncio
import json
import sys

from delayd.broker.config import ReplicationConfig
from delayd.broker.coord import Coordinator, RoleChange, fence_clock

CHECK_EVERY_S = 0.005
GAP_REPORT_S = 0.3


async def main(config: dict[str, object], out_path: str) -> None:
    cfg = ReplicationConfig(**{**config, "etcd_endpoints": tuple(config["etcd_endpoints"])})  # type: ignore[arg-type]
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def write(obj: dict[str, object]) -> None:
        out.write(json.dumps(obj) + "\n")

    def on_change(c: RoleChange) -> None:
        write({"event": c.role.value, "reason": c.reason.value, "epoch": c.epoch, "lease": coord.lease_id,
               "primary": c.primary.member if c.primary else None, "at_s": c.at_s})

    coord = Coordinator(cfg)
    coord.add_listener(on_change)
    await coord.start()
    last, prev = None, fence_clock()
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        now = fence_clock()
        ok = coord.may_acknowledge()
        if ok != last or now - prev > GAP_REPORT_S:
            write({"check": ok, "gap_s": now - prev, "at_s": now, "role": coord.role.value})
        last, prev = ok, now


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1]), sys.argv[2]))
