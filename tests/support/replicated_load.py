"""A steady produce / cancel / consume load against a replicated shard, the ledger of what was
acknowledged, and the checker of the guarantees across failovers (tests/replication).

Clients follow the shard as the SDK does: a 421 names the primary, a 503 (no primary yet,
insufficient or under-replicated) or a refused connection is retried after a pause. Only answers
count: a request that got no answer (the primary died under it) may or may not have happened,
and the ledger keeps it as "unknown" — never as acknowledged.

The checker's guarantees, each violation printed with the operations that show it:
- every produce answered 200 that was not cancelled (answered 200) is delivered, never before
  its `deliver_at`;
- a message whose cancel was answered 200 is never delivered after the cancel was sent;
- a message whose ack was answered 200 (not stale) is never delivered again after the answer.
Duplicates are allowed (at-least-once: a failover may release a message again).
"""

from __future__ import annotations

import http.client
import json
import random
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

TOPIC = "load"
GROUP = "g"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Op:
    kind: str  # produce, cancel, ack, deliver
    at_ms: int  # when sent (deliver: when received)
    done_ms: int  # when answered
    status: int  # HTTP status, 0: no answer
    ids: list[str] = field(default_factory=list)
    detail: Any = None

    def line(self) -> str:
        return f"{self.kind:8} sent {self.at_ms} answered {self.done_ms} status {self.status} ids {self.ids} {self.detail}"


class Shard:
    """Finds the primary among the members' URLs and follows 421s."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.primary = urls[0]
        self.lock = threading.Lock()

    def call(self, method: str, path: str, body: Any = None, timeout_s: float = 10.0) -> tuple[int, Any]:
        url = self.primary
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                answer = json.loads(e.read() or b"null")
            except ValueError:
                answer = None
            if e.code == 421 and isinstance(answer, dict) and answer["error"].get("primary"):
                self.primary = answer["error"]["primary"]
            elif e.code in (421, 503):
                self._next(url)
            return e.code, answer
        except (OSError, ValueError, http.client.HTTPException) as e:  # no (whole) answer: a member died under it
            self._next(url)
            return 0, repr(e)

    def _next(self, url: str) -> None:
        with self.lock:
            if self.primary == url:
                self.primary = self.urls[(self.urls.index(url) + 1) % len(self.urls)]


class Load:
    def __init__(self, urls: list[str], seed: int = 0) -> None:
        self.shard = Shard(urls)
        self.rng = random.Random(seed)
        self.ops: list[Op] = []
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.produced: dict[str, int] = {}  # acked produce: id -> deliver_at
        self.unknown: set[str] = set()
        self.cancel_sent: dict[str, int] = {}  # acked cancel: id -> when sent
        self.acked: dict[str, int] = {}  # acked (not stale): id -> when answered
        self.deliveries: list[tuple[str, int, int]] = []  # (id, received ms, deliver_at)
        self.threads: list[threading.Thread] = []
        self.errors: dict[int, int] = {}
        self.crashed: list[str] = []  # a worker that raised: its thread ended, and the checks say so

    def _log(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)
            if op.status not in (200, 409):
                self.errors[op.status] = self.errors.get(op.status, 0) + 1

    # -- workers ------------------------------------------------------------------------------
    def _produce(self) -> None:
        while not self.stop_flag.is_set():
            n = self.rng.randint(1, 5)
            msgs = [{"body": f"x{self.rng.random()}", "delay_ms": self.rng.randint(300, 2500)} for _ in range(n)]
            t = now_ms()
            status, body = self.shard.call("POST", f"/v1/topics/{TOPIC}/messages", {"messages": msgs})
            op = Op("produce", t, now_ms(), status)
            if status == 200:
                for m in body["messages"]:
                    op.ids.append(m["id"])
                    with self.lock:
                        self.produced[m["id"]] = m["deliver_at"]
            self._log(op)
            if status != 200:
                time.sleep(0.05)
            time.sleep(0.01)

    def _cancel(self) -> None:
        while not self.stop_flag.is_set():
            time.sleep(0.03)
            with self.lock:
                now = now_ms()
                cands = [i for i, d in self.produced.items() if d > now + 250 and i not in self.cancel_sent]
            if not cands:
                continue
            mid = self.rng.choice(cands)
            t = now_ms()
            # A cancel that got no answer may have happened: ask again until one answer says
            # (200: cancelled — also for a repeat —, 409: delivered first).
            status, body = self.shard.call("DELETE", f"/v1/messages/{mid}")
            while status in (0, 421, 503) and now_ms() - t < 30_000:
                self._log(Op("cancel", t, now_ms(), status, [mid], "no answer: again"))
                time.sleep(0.05)
                status, body = self.shard.call("DELETE", f"/v1/messages/{mid}")
            op = Op("cancel", t, now_ms(), status, [mid], body if status != 200 else None)
            with self.lock:
                if status == 200:
                    self.cancel_sent[mid] = t
                elif status != 409:
                    self.unknown.add(mid)
            self._log(op)

    def _consume(self) -> None:
        while not self.stop_flag.is_set() or self._pending():
            t = now_ms()
            status, body = self.shard.call("POST", f"/v1/topics/{TOPIC}/subscriptions/{GROUP}/pull",
                                           {"max": 100, "wait_ms": 200, "lease_ms": 1000})
            got = now_ms()
            if status != 200:
                time.sleep(0.05)
                self._log(Op("pull", t, got, status))
                continue
            receipts = []
            for m in body["messages"]:
                with self.lock:
                    self.deliveries.append((m["id"], got, m["deliver_at"]))
                receipts.append((m["id"], m["receipt"]))
            if not receipts:
                continue
            t = now_ms()
            status, ans = self.shard.call("POST", f"/v1/topics/{TOPIC}/subscriptions/{GROUP}/ack",
                                          {"receipts": [r for _i, r in receipts]})
            done = now_ms()
            op = Op("ack", t, done, status, [i for i, _r in receipts])
            if status == 200:
                stale = set(ans.get("stale", []))
                with self.lock:
                    for i, r in receipts:
                        if r not in stale:
                            self.acked[i] = done
                op.detail = {"stale": len(stale)}
            self._log(op)

    def _pending(self) -> bool:
        """Consumers go on after the load stops until every acknowledged message was seen."""
        return bool(self.missing()) and now_ms() < self.drain_until

    drain_until = 0

    def _guard(self, work: Any) -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - reported as a violation, not lost on stderr
            with self.lock:
                self.crashed.append(f"{work.__name__}: {e!r}")
            raise

    # -- control ------------------------------------------------------------------------------
    def start(self) -> Load:
        # The group first, so that it takes every message from the start.
        deadline = time.monotonic() + 20
        while self.shard.call("PUT", f"/v1/topics/{TOPIC}/subscriptions/{GROUP}", {"start": "earliest"})[0] != 200:
            assert time.monotonic() < deadline, "no primary took the subscription"
            time.sleep(0.1)
        for target in (self._produce, self._produce, self._cancel, self._consume):
            th = threading.Thread(target=self._guard, args=(target,), daemon=True)
            th.start()
            self.threads.append(th)
        return self

    def stop(self, drain_s: float = 20.0) -> None:
        # The deadline before the flag: a consumer that saw the flag with no deadline yet (0)
        # stopped at once, and messages due just after were reported LOST (torture, 2026-11-29).
        with self.lock:
            last_due = max(self.produced.values(), default=0)
        self.drain_until = max(now_ms(), last_due) + int(drain_s * 1000)
        self.stop_flag.set()
        for th in self.threads:
            th.join(drain_s + 30)

    # -- the checker --------------------------------------------------------------------------
    def missing(self) -> list[str]:
        with self.lock:
            seen = {i for i, _r, _d in self.deliveries}
            return [i for i in self.produced if i not in self.cancel_sent and i not in seen and i not in self.unknown]

    def violations(self) -> list[str]:
        out: list[str] = []
        with self.lock:
            deliveries = list(self.deliveries)
            out += [f"WORKER DIED: {c}" for c in self.crashed]
        for i in self.missing():
            out.append(f"LOST: produce of {i} (due {self.produced[i]}) was acknowledged, never delivered")
        for i, got, due in deliveries:
            if got < due:
                out.append(f"EARLY: {i} received at {got}, due {due}")
            if i in self.cancel_sent and got > self.cancel_sent[i]:
                out.append(f"CANCELLED DELIVERED: {i} received at {got}, its cancel was sent at {self.cancel_sent[i]} "
                           f"and answered 200")
            if i in self.acked and got > self.acked[i] + 50:
                out.append(f"ACK LOST: {i} received again at {got}, its ack was answered at {self.acked[i]}")
        return out

    def report(self, bad: list[str]) -> str:
        ids = {m for w in bad for m in re.findall(r"s0-[0-9a-f]+", w)}
        related = [op.line() for op in self.ops if set(op.ids) & ids]
        related += [f"deliver  {i} received {g} due {d}" for i, g, d in self.deliveries if i in ids]
        related += [f"now      {i}: {self.shard.call('GET', f'/v1/messages/{i}')}" for i in sorted(ids)[:20]]
        return ("\n".join(bad[:50]) + "\n--- the operations on those messages ---\n" + "\n".join(related[:300])
                + f"\n--- totals: {len(self.produced)} produced, {len(self.cancel_sent)} cancelled, "
                  f"{len(self.acked)} acked, {len(self.deliveries)} deliveries, errors {self.errors}")

    def summary(self) -> str:
        return (f"{len(self.produced)} produced, {len(self.cancel_sent)} cancelled, {len(self.acked)} acked, "
                f"{len(self.deliveries)} deliveries ({len(self.deliveries) - len(set(i for i, _g, _d in self.deliveries))}"
                f" duplicates), errors {self.errors}")
