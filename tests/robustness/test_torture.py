"""kill -9 torture: the real daemon, killed at random moments under concurrent produce (delays
0-1.5 s; JSON and msgpack; some messages keyed, from a small pool of keys), cancel (by id and by
key), pull, ack and nack, restarted, and checked after every restart.

Cycles: DELAYD_TORTURE_CYCLES (default 10, about 20 s; `make torture` runs 500). The seed is
DELAYD_TORTURE_SEED; thread timing still varies from run to run, so a failure message carries
the cycle, the message id and the daemon log.

What is checked (DESIGN.md guarantees 1-4), with what each answer proves:
- produce answered 200: that message is delivered eventually, or was cancelled by a cancel
  answered 200 (a cancel whose answer was lost to the crash may have gone either way);
- cancel answered 200: never delivered, not before and not after any number of crashes;
- nothing early: delivered_at >= deliver_at, and it did not arrive before deliver_at by the
  test's own wall clock either;
- ack answered 200 (and the receipt not stale): never delivered again;
- no duplicates from the timer side: within one daemon incarnation a message comes again only
  with attempt + 1, after its lease expired or it was nacked; across a crash only if its ack was
  not confirmed; the first delivery in an incarnation is attempt 1;
- nothing corrupt: every delivered body, deliver_at and key is the one produced under that id,
  and every delivered message was sent by the test (a produce whose answer was lost may land);
- keys (idempotent produce) survive the crashes: a key held by a message the test knows, not
  cancelled and not yet out of the dedup window (which starts at the earliest at its deliver_at),
  is never given to a new message; a duplicate answer names the message holding that key, with
  its deliver_at; a cancel by key answers the message holding the key, and finds it whenever a
  known holder is certainly still pending (not cancelled, due later than now);
- at the end: every counted message is accounted for (produced = delivered + cancelled, nothing
  scheduled, no backlog, no dead letters) and a graceful stop exits 0;
- the schedule survives the crashes exactly: a few far-future messages (a topic of their own,
  produced in the first incarnation, half cancelled in a later one) stay pending, and once the
  pipeline is idle GET /v1/schedule over all time adds up to stats.scheduled (issue 17).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
from delayd.broker.config import Config

from tests.integration.wire import schedule_matches_scheduled
from tests.support.daemon import DaemonProcess, wait_until

CYCLES = int(os.environ.get("DELAYD_TORTURE_CYCLES", "10"))
SEED = int(os.environ.get("DELAYD_TORTURE_SEED", "20261122"))
TOPIC, GROUP = "torture", "g"
FAR_TOPIC, FAR = "torture.far", 20  # pending all along: rolled, in the hourly schedule
FAR_DELAY_MS = 3 * 86_400_000
LEASE_MS = 1000  # the API's minimum: expiries happen within a cycle
MAX_DELAY_MS = 1500
CLOCK_SLACK_MS = 20  # the daemon's clock is the wall clock read at start, advanced monotonically
KEYS, KEY_SHARE = 400, 0.3  # keyed messages, half of them from a pool small enough that keys come back
DEDUP_WINDOW_MS = Config().dedup_window_ms  # the daemon's default: a delivered message holds its key this long


def wall_ms() -> int:
    return int(time.time() * 1000)


class Conn:
    """One keep-alive HTTP/1.1 connection per thread; any transport error is raised."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.c: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None, timeout_s: float = 5.0,
             packed: bool = False) -> tuple[int, Any]:
        """`packed`: the request body in msgpack (and so the answer)."""
        if self.c is None:
            self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            data = None if body is None else msgpack.packb(body) if packed else json.dumps(body).encode()
            self.c.request(method, path, body=data,
                           headers={"Content-Type": "application/msgpack" if packed else "application/json"})
            r = self.c.getresponse()
            raw = r.read()
            if not raw:
                return r.status, None
            return r.status, msgpack.unpackb(raw) if r.getheader("Content-Type", "").startswith(
                "application/msgpack") else json.loads(raw)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None


@dataclass
class Delivery:
    id: str
    receipt: str
    attempt: int
    body: str
    key: str | None
    deliver_at: int
    delivered_at: int
    inc: int  # daemon incarnation it came from
    t_req: float  # monotonic, pull sent
    t_resp: float  # monotonic, pull answered
    wall_resp: int


@dataclass
class Ledger:
    """What the test knows for sure, from answers it received. Guarded by `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    produced: dict[str, tuple[int, str, int]] = field(default_factory=dict)  # id -> deliver_at, body, cycle
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=200))  # what the canceller picks from
    recent_keys: deque[str] = field(default_factory=lambda: deque(maxlen=200))  # ... and, by key, from
    key_of: dict[str, str] = field(default_factory=dict)  # id -> its key (new messages answered 200)
    holders: dict[str, list[str]] = field(default_factory=dict)  # key -> the ids it was given to, in order
    cancelling: str | None = None  # the id or key of the cancel in flight
    undelivered: dict[str, int] = field(default_factory=dict)  # id -> cycle: answered, not delivered (yet)
    unacked: set[str] = field(default_factory=set)  # answered, not acked (confirmed or maybe), not cancelled
    sent_bodies: set[str] = field(default_factory=set)  # every body ever sent (answered or not)
    cancelled: dict[str, float] = field(default_factory=dict)  # cancel answered 200
    cancel_409: set[str] = field(default_factory=set)
    cancel_unknown: set[str] = field(default_factory=set)  # cancel sent, answer lost
    acked: dict[str, float] = field(default_factory=dict)  # id -> monotonic time the ack was confirmed
    ack_unknown: set[str] = field(default_factory=set)
    nacked: dict[str, float] = field(default_factory=dict)  # receipt -> monotonic time the nack was sent
    deliveries: list[Delivery] = field(default_factory=list)
    delivered_ids: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"produce_lost": 0, "pull_lost": 0, "nacks": 0,
                                                            "drops": 0, "refused": 0,
                                                            "duplicates": 0, "key_cancels": 0})

    def violation(self, text: str) -> None:
        with self.lock:
            if len(self.violations) < 50:
                self.violations.append(text)

    def settled(self, mid: str) -> None:
        """Cancelled (or maybe cancelled): no longer owed. Call with the lock held."""
        self.undelivered.pop(mid, None)
        self.unacked.discard(mid)


class Load:
    """The threads of one cycle. `final` turns it into drain mode: consumers only, ack all."""

    def __init__(self, d: DaemonProcess, led: Ledger, cycle: int, inc: int, final: bool = False) -> None:
        self.d, self.led, self.cycle, self.inc, self.final = d, led, cycle, inc, final
        self.stop = threading.Event()
        self.answered = 0  # produce requests answered 200 in this cycle
        self.conns: list[Conn] = []
        self.threads = [threading.Thread(target=self.consumer, args=(i,), daemon=True) for i in range(2)]
        if not final:
            self.threads += [threading.Thread(target=self.producer, daemon=True),
                             threading.Thread(target=self.canceller, daemon=True)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)
            assert not t.is_alive(), "a load thread hung"
        for c in self.conns:
            c.close()

    def conn(self) -> Conn:
        c = Conn(self.d.port)
        self.conns.append(c)
        return c

    def rng(self, role: int) -> random.Random:
        return random.Random(SEED * 1_000_003 + self.cycle * 101 + role)

    # -- producer ----------------------------------------------------------------------------
    def producer(self) -> None:
        rng, conn, led, n = self.rng(1), self.conn(), self.led, 0
        while not self.stop.is_set():
            msgs: list[dict[str, Any]] = []
            for _ in range(rng.randint(1, 5)):
                body = f"c{self.cycle}-{n}"
                n += 1
                if rng.random() < 0.1:
                    msgs.append({"body": body, "deliver_at": wall_ms() + rng.randint(-200, MAX_DELAY_MS)})
                else:
                    msgs.append({"body": body, "delay_ms": 0 if rng.random() < 0.3 else rng.randint(0, MAX_DELAY_MS)})
                if rng.random() < KEY_SHARE:  # half from the pool (duplicates), half never used before
                    key = f"k{rng.randrange(KEYS)}" if rng.random() < 0.5 else f"u{self.cycle}-{n}"
                    if all(m.get("key") != key for m in msgs):  # one key once a batch
                        msgs[-1]["key"] = key
            with led.lock:
                led.sent_bodies.update(m["body"] for m in msgs)
            try:  # msgpack takes the batch core's path, JSON the reference one
                status, res = conn.call("POST", f"/v1/topics/{TOPIC}/messages", {"messages": msgs},
                                        packed=rng.random() < 0.5)
            except (OSError, http.client.HTTPException, ValueError):
                with led.lock:
                    led.counts["produce_lost"] += len(msgs)
                return  # the daemon is gone
            if status == 200:
                answered = wall_ms()
                with led.lock:
                    for m, r in zip(msgs, res["messages"], strict=True):
                        mid = r["id"]
                        if not self.keyed(m.get("key"), mid, r, answered):
                            continue  # a duplicate: nothing new was stored
                        led.produced[mid] = (r["deliver_at"], m["body"], self.cycle)
                        led.recent.append(mid)
                        # (A message due at once may have been delivered, even acked, already.)
                        if mid not in led.delivered_ids:
                            led.undelivered[mid] = self.cycle
                        if mid not in led.acked:
                            led.unacked.add(mid)
                self.answered += 1
            elif status in (429, 503):
                with led.lock:
                    led.counts["refused"] += 1
            else:
                led.violation(f"cycle {self.cycle}: produce answered {status} {res}")
            self.stop.wait(0.005)  # pace: some hundreds of messages per cycle, enough to race everything

    def keyed(self, key: str | None, mid: str, r: dict[str, Any], answered: int) -> bool:
        """Check a produce answer against what the ledger knows of its key; whether it is a new
        message. Call with the lock held."""
        led = self.led
        if r["duplicate"]:
            led.counts["duplicates"] += 1
            known = led.produced.get(mid)
            if key is None:
                led.violations.append(f"cycle {self.cycle}: a message without a key answered as a duplicate of {mid}")
            elif known is not None and (led.key_of.get(mid) != key or known[0] != r["deliver_at"]):
                led.violations.append(f"cycle {self.cycle}: a duplicate of key {key} answered {mid} due "
                                      f"{r['deliver_at']}, which holds {led.key_of.get(mid)!r}, due {known[0]}")
            return False
        if key is not None:
            for h in led.holders.get(key, ()):
                if (h not in led.cancelled and h not in led.cancel_unknown and led.cancelling not in (h, key)
                        and answered < led.produced[h][0] + DEDUP_WINDOW_MS - CLOCK_SLACK_MS):
                    led.violations.append(f"cycle {self.cycle}: key {key} given to {mid} while {h} "
                                          f"(due {led.produced[h][0]}, not cancelled) held it")
            led.holders.setdefault(key, []).append(mid)
            led.key_of[mid] = key
            led.recent_keys.append(key)
        return True

    # -- canceller ---------------------------------------------------------------------------
    def canceller(self) -> None:
        rng, conn, led = self.rng(2), self.conn(), self.led
        while not self.stop.wait(0.01):
            with led.lock:
                if not led.recent:
                    continue
                mid = rng.choice(led.recent)
                key = rng.choice(led.recent_keys) if led.recent_keys and rng.random() < 0.3 else None
                led.cancelling = key or mid  # a produce answered meanwhile may rightly see it cancelled
            try:
                if not (self.cancel_id(conn, mid) if key is None else self.cancel_key(conn, key)):
                    return
            finally:
                with led.lock:
                    led.cancelling = None

    def cancel_id(self, conn: Conn, mid: str) -> bool:
        """DELETE by id; False once the daemon is gone."""
        led = self.led
        try:
            status, res = conn.call("DELETE", f"/v1/messages/{mid}")
        except (OSError, http.client.HTTPException, ValueError):
            with led.lock:
                led.cancel_unknown.add(mid)
                led.settled(mid)
            return False
        with led.lock:
            if status == 200:
                led.cancelled[mid] = time.monotonic()
                led.settled(mid)
            elif status == 409:
                led.cancel_409.add(mid)
            else:
                led.violations.append(f"cycle {self.cycle}: cancel of {mid} (produce answered 200) "
                                      f"answered {status} {res}")
        return True

    def cancel_key(self, conn: Conn, key: str) -> bool:
        """DELETE by key, checked: the answer names the message holding the key, and a known
        holder that is certainly still pending is found. False once the daemon is gone."""
        led = self.led
        try:
            status, res = conn.call("DELETE", f"/v1/topics/{TOPIC}/keys/{key}")
        except (OSError, http.client.HTTPException, ValueError):
            with led.lock:  # any holder of the key may have been cancelled
                for h in led.holders[key]:
                    led.cancel_unknown.add(h)
                    led.settled(h)
            return False
        answered = wall_ms()
        with led.lock:
            if status == 200:
                mid = res["id"]
                led.counts["key_cancels"] += 1
                led.cancelled[mid] = time.monotonic()
                led.settled(mid)
                if mid in led.produced and led.key_of.get(mid) != key:
                    led.violations.append(f"cycle {self.cycle}: cancel by key {key} cancelled {mid}, "
                                          f"which holds {led.key_of.get(mid)!r}")
            elif status == 404:
                # Due after the answer, so not due when the cancel was decided: still pending then.
                sure = [h for h in led.holders[key] if h not in led.cancelled and h not in led.cancel_unknown
                        and led.produced[h][0] > answered + CLOCK_SLACK_MS]
                if sure:
                    led.violations.append(f"cycle {self.cycle}: cancel by key {key} answered 404 although "
                                          f"{sure} (not cancelled, not yet due) held it")
            else:
                led.violations.append(f"cycle {self.cycle}: cancel by key {key} answered {status} {res}")
        return True

    # -- consumers ---------------------------------------------------------------------------
    def consumer(self, i: int) -> None:
        rng, conn, led = self.rng(10 + i), self.conn(), self.led
        base = f"/v1/topics/{TOPIC}/subscriptions/{GROUP}"
        while not self.stop.is_set():
            t_req = time.monotonic()
            try:
                status, res = conn.call("POST", base + "/pull", {"max": 100, "wait_ms": 200, "lease_ms": LEASE_MS})
            except (OSError, http.client.HTTPException, ValueError):
                with led.lock:
                    led.counts["pull_lost"] += 1
                return
            t_resp, wall = time.monotonic(), wall_ms()
            if status != 200:
                led.violation(f"cycle {self.cycle}: pull answered {status} {res}")
                return
            got = [Delivery(m["id"], m["receipt"], m["attempt"], m["body"], m.get("key"), m["deliver_at"],
                            m["delivered_at"], self.inc, t_req, t_resp, wall) for m in res["messages"]]
            if not got:
                continue
            with led.lock:
                led.deliveries.extend(got)
                for g in got:
                    led.delivered_ids.add(g.id)
                    led.undelivered.pop(g.id, None)
            ack, nack = [], []
            for g in got:
                x = 0.0 if self.final else rng.random()
                if x < 0.85:
                    ack.append(g)
                elif x < 0.95:
                    nack.append(g)
                else:
                    with led.lock:
                        led.counts["drops"] += 1  # its lease expires and it comes back
            if not (self.settle(conn, base, "ack", ack) and self.settle(conn, base, "nack", nack, rng)):
                return

    def settle(self, conn: Conn, base: str, op: str, ds: list[Delivery], rng: random.Random | None = None) -> bool:
        if not ds:
            return True
        led = self.led
        body: dict[str, Any] = {"receipts": [g.receipt for g in ds]}
        if op == "nack":
            assert rng is not None
            body["delay_ms"] = rng.randint(0, 300)
        t_sent = time.monotonic()
        try:
            status, res = conn.call("POST", f"{base}/{op}", body)
        except (OSError, http.client.HTTPException, ValueError):
            if op == "ack":
                with led.lock:
                    # The ack may have been logged before the crash: then it is never redelivered.
                    led.ack_unknown.update(g.id for g in ds)
                    led.unacked.difference_update(g.id for g in ds)
            return False
        if status != 200:
            led.violation(f"cycle {self.cycle}: {op} answered {status} {res}")
            return False
        stale = set(res["stale"])
        with led.lock:
            for g in ds:
                if g.receipt in stale:
                    continue
                if op == "ack":
                    led.acked.setdefault(g.id, time.monotonic())
                    led.unacked.discard(g.id)
                else:
                    led.nacked[g.receipt] = t_sent
                    led.counts["nacks"] += 1
        return True


class Checker:
    """Checks every delivery once, after the cycle's threads have stopped (so every answer
    that arrived is in the ledger)."""

    def __init__(self, led: Ledger) -> None:
        self.led = led
        self.last: dict[str, tuple[int, int, str, float]] = {}  # id -> inc, attempt, receipt, t_req
        self.bodies: dict[str, str] = {}  # id -> body, for ids whose produce answer was lost
        self.redeliveries = 0
        self.checked = 0

    def run(self, cycle: int) -> list[str]:
        led = self.led
        bad: list[str] = []
        with led.lock:
            new, led.deliveries = led.deliveries, []
        self.checked += len(new)
        for g in sorted(new, key=lambda x: x.t_resp):
            where = f"cycle {cycle}: {g.id} (attempt {g.attempt}, incarnation {g.inc})"
            known = led.produced.get(g.id)
            if known is not None:
                if (g.deliver_at, g.body, g.key) != (*known[:2], led.key_of.get(g.id)):
                    bad.append(f"{where}: served ({g.deliver_at}, {g.body!r}, key {g.key!r}), produced "
                               f"{known[:2]}, key {led.key_of.get(g.id)!r}")
            elif g.body not in led.sent_bodies or self.bodies.setdefault(g.id, g.body) != g.body:
                bad.append(f"{where}: body {g.body!r} was never sent under this id")
            if g.delivered_at < g.deliver_at:
                bad.append(f"{where}: early, delivered_at {g.delivered_at} < deliver_at {g.deliver_at}")
            if g.wall_resp < g.deliver_at - CLOCK_SLACK_MS:
                bad.append(f"{where}: arrived {g.deliver_at - g.wall_resp} ms before deliver_at")
            if g.id in led.cancelled:
                bad.append(f"{where}: delivered although its cancel was answered 200")
            if g.id in led.acked and g.t_req > led.acked[g.id]:
                bad.append(f"{where}: delivered again after its ack was confirmed")
            prev = self.last.get(g.id)
            if prev is not None:
                self.redeliveries += 1
            if prev is not None and prev[0] == g.inc:
                _inc, attempt, receipt, t_req = prev
                nacked = led.nacked.get(receipt)
                expired = g.t_resp - t_req >= (LEASE_MS - CLOCK_SLACK_MS) / 1000
                if g.attempt != attempt + 1:
                    bad.append(f"{where}: comes after attempt {attempt} in the same incarnation "
                               f"(a second copy from the timer side?)")
                elif not expired and (nacked is None or nacked > g.t_resp):
                    bad.append(f"{where}: redelivered {1000 * (g.t_resp - t_req):.0f} ms after attempt "
                               f"{attempt}, neither nacked nor lease-expired")
            elif g.attempt != 1:
                bad.append(f"{where}: first delivery of this incarnation has attempt {g.attempt}")
            self.last[g.id] = (g.inc, g.attempt, g.receipt, g.t_req)
        with led.lock:
            bad += led.violations
            led.violations.clear()
        return bad

    def owed(self, before_cycle: int) -> list[str]:
        """Answered in an earlier cycle, not cancelled (for sure or maybe), never delivered."""
        with self.led.lock:
            return [mid for mid, c in self.led.undelivered.items() if c < before_cycle]


def fail(d: DaemonProcess, bad: list[str], stats: str) -> None:
    raise AssertionError(f"{len(bad)} violation(s), seed {SEED}:\n  " + "\n  ".join(bad[:20])
                         + f"\n{stats}\n--- daemon log ---\n{d.log_tail(40)}")


@pytest.mark.torture
@pytest.mark.slow
@pytest.mark.timeout(max(120, CYCLES * 10 + 90))
def test_kill9_torture(tmp_path, request):
    t0 = time.monotonic()
    d = DaemonProcess(tmp_path / "data", config_text="checkpoint_interval_ms = 300\n")
    request.addfinalizer(d.kill9)  # on a failure, do not leave the daemon running
    led = Ledger()
    chk = Checker(led)
    rng = random.Random(SEED)
    inc = 0
    far: list[str] = []
    far_cancelled: set[str] = set()
    for cycle in range(CYCLES):
        d.start()
        inc += 1
        if cycle == 0:
            status, body = d.request("POST", f"/v1/topics/{FAR_TOPIC}/messages",
                                     {"messages": [{"body": f"far {i}", "delay_ms": FAR_DELAY_MS} for i in range(FAR)]})
            assert status == 200, body
            far = [m["id"] for m in body["messages"]]
        if cycle == CYCLES // 2:
            for mid in far[::2]:
                status, body = d.request("DELETE", f"/v1/messages/{mid}")
                assert status == 200, body
                far_cancelled.add(mid)
        with Load(d, led, cycle, inc) as load:
            # Everything owed from before the crash comes (the consumers are pulling meanwhile).
            try:
                wait_until(lambda c=cycle: not chk.owed(c), 20, 0.02, "earlier messages to be delivered")
            except TimeoutError:
                missing = sorted(chk.owed(cycle))
                fail(d, [f"cycle {cycle}: {len(missing)} produced messages never delivered, e.g. {missing[:5]}"],
                     "")
            # Then kill it at a random moment, in the middle of everything: after a random number
            # of further produce answers (so the moment follows the load, not a timer).
            target = load.answered + rng.randint(1, 120)
            wait_until(lambda ld=load, t=target: ld.answered >= t, 20, 0.001, "produce answers")
            d.kill9()
        bad = chk.run(cycle)
        if bad:
            fail(d, bad, "")
        recoveries = d.log_path.read_text(errors="replace").count("recovery done")
        assert recoveries == cycle + 1, f"cycle {cycle}: {recoveries} recovery lines"

    # Final incarnation: no new load, consumers ack everything; all must be accounted for.
    d.start()
    inc += 1
    with Load(d, led, CYCLES, inc, final=True):
        def settled() -> bool:
            with led.lock:
                if led.unacked:
                    return False
            status, stats = d.request("GET", "/v1/stats")
            g = stats["groups"].get(f"{TOPIC}/{GROUP}", {})
            return (stats["topics"][TOPIC]["scheduled"] == 0 and g.get("backlog", 1) == 0
                    and g.get("inflight", 1) == 0)
        try:
            wait_until(settled, 60, 0.05, "every message acked and nothing left")
        except TimeoutError:
            with led.lock:
                owed = sorted(led.unacked)
            fail(d, [f"final: {len(owed)} produced messages never acked, e.g. {owed[:5]}"],
                 json.dumps(d.request("GET", "/v1/stats")[1])[:2000])
    bad = chk.run(CYCLES)
    status, stats = d.request("GET", "/v1/stats")
    t = stats["topics"][TOPIC]
    if t["produced_total"] != t["delivered_total"] + t["cancelled_total"] or stats["groups"][f"{TOPIC}/{GROUP}"]["dead"]:
        bad.append(f"final: counters do not add up (a duplicate release?): {t}, groups {stats['groups']}")
    with led.lock:
        lost_cancels = set(led.cancelled) & led.delivered_ids
        if lost_cancels:
            bad.append(f"final: cancelled (200) and delivered: {sorted(lost_cancels)[:5]}")
    if stats["scheduled"] != FAR - len(far_cancelled):
        bad.append(f"final: {stats['scheduled']} scheduled, expected the {FAR - len(far_cancelled)} far ones")
    if bad:
        fail(d, bad, json.dumps(stats)[:2000])
    schedule_matches_scheduled(d)
    assert d.stop() == 0, d.log_tail()
    assert "fatal" not in d.log_path.read_text(errors="replace")
    print(f"\ntorture: {CYCLES} kill -9 cycles in {time.monotonic() - t0:.1f}s; {len(led.produced)} produces "
          f"answered ({led.counts['produce_lost']} lost to crashes), {len(led.cancelled)} cancels answered 200, "
          f"{len(led.cancel_409)} answered 409, {len(led.cancel_unknown)} unknown ({led.counts['key_cancels']} by key); "
          f"{led.counts['duplicates']} duplicate answers for {len(led.key_of)} keyed messages; {chk.checked} deliveries "
          f"({chk.redeliveries} redeliveries), {len(led.acked)} acks confirmed, {led.counts['nacks']} nacks, "
          f"{led.counts['drops']} leases left to expire; counters {t}")
