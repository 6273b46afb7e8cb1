"""Torture of a replicated shard: random kill -9 and SIGSTOP (shorter and longer than the lease)
of any member — primary or follower — under a steady produce/cancel/consume load, with every
check after every fault (tests/support/replicated_load.py: nothing early, no cancelled message
delivered, no acknowledged ack lost; at the end also no acknowledged produce lost, and every
member holding the same log).

Cycles: DELAYD_TORTURE_CYCLES (default 3, in `make test`; `make torture` runs 500). The seed is
DELAYD_TORTURE_SEED (default: random, printed), so a failure can be replayed.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.support.daemon import wait_until
from tests.support.replicated import LEASE_TTL_MS, Cluster
from tests.support.replicated_load import Load

CYCLES = int(os.environ.get("DELAYD_TORTURE_CYCLES", "3"))
# A member deposed with writes its new primary never had cuts its log back and rebuilds every
# derived file from the whole log (storage.cut; a full rescan): about 50-60 µs a record on 2 busy
# cores, 22-30 s once the log holds 400k records (about 450 cycles in). When both followers of a
# new primary cut (each held a tail it never had), writes wait for the first of them to rejoin
# (replication_min_insync = 2): the in-sync set and the next acknowledged produce both get this.
REJOIN_S = 120
FAULTS = ("kill9", "pause_short", "pause_long")


@pytest.mark.torture
@pytest.mark.timeout(max(120, CYCLES * 25 + 60))
def test_replicated_torture(cluster: Cluster) -> None:
    seed = int(os.environ.get("DELAYD_TORTURE_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(f"\nreplicated torture: seed {seed}, {CYCLES} cycles")
    c = cluster.start()
    p = c.wait_primary()
    c.wait_isr(p, 3)
    load = Load([d.url for d in c.members.values()], seed=seed).start()
    history: list[str] = []
    t0 = time.monotonic()
    try:
        wait_until(lambda: len(load.produced) > 50, 30, 0.05, "load running")
        for cycle in range(CYCLES):
            victim = rng.choice(sorted(c.members))
            fault = rng.choice(FAULTS)
            was = c.primaries()
            history.append(f"cycle {cycle}: {fault} of {victim} (primary was {was}) at {time.monotonic() - t0:.2f}s")
            if fault == "kill9":
                c.kill9(victim)
                time.sleep(rng.uniform(0, 1.5))
                c.restart(victim)
            else:
                c.stop(victim)
                lease_s = LEASE_TTL_MS / 1000
                time.sleep(rng.uniform(0.05, 0.5 * lease_s) if fault == "pause_short"
                           else rng.uniform(1.5 * lease_s, 3 * lease_s))
                c.cont(victim)
            # Every check after every fault: a primary again, the whole set back in sync, and the
            # ledger so far without a violation.
            q = c.wait_primary(20)
            c.wait_isr(q, 3, REJOIN_S)
            n = len(load.produced)
            wait_until(lambda n=n: len(load.produced) > n + 10, REJOIN_S, 0.05, "produces acknowledged again")
            bad = [v for v in load.violations() if not v.startswith("LOST")]
            assert not bad, "\n".join(history) + "\n" + load.report(bad)
            history.append(f"  -> primary {q}, {load.summary()}")
    except BaseException:
        print("\n".join(history))  # what led there, whatever broke
        print(c.describe())
        raise
    finally:
        load.stop()
    bad = load.violations()
    assert not bad, "\n".join(history) + "\n" + load.report(bad) + "\n" + c.describe()
    q = c.wait_primary(20)
    names = sorted(c.members)
    wait_until(lambda: len({c.log_bytes(n) for n in names}) == 1, 20, 0.1, "every member holds the same log")
    print("\n".join(history))
    print(f"replicated torture: {CYCLES} cycles in {time.monotonic() - t0:.1f}s; {load.summary()}")
