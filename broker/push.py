"""Push delivery: the daemon POSTs a push group's due messages to the group's endpoint.

A push group is an ordinary consumer group whose consumer is the daemon. One worker task per
push group leases messages through the same consumer-group API as pull (`Groups.take`, then
`ack` on a 2xx answer, `nack` on anything else, `dead_letter` for an unreadable record), so
leases, attempts, backoff, `max_attempts`, dead letters and redrive behave exactly as for pull.
Nothing here is durable: a POST cut by a crash or a shutdown was never acked, so its message
is delivered again after the restart (at-least-once), from attempt 1 like any unacked message.

Concurrency is bounded twice: `max_in_flight` per group (the worker leases only what it can
send at once) and `push_max_in_flight` in total (one ClientSession whose connector has that
many connections; a worker leases only while a slot is free, so a lease never waits for a
connection). Every POST is its own task with its own timeout: a slow or dead endpoint holds
only its own group's slots and never the event loop, so other groups and the timer go on.

The POST (see docs/push.md): body = the message as pull returns it (minus the receipt, plus
the group) in JSON or msgpack; `Delayd-*` headers repeat the routing fields; with a secret,
`Delayd-Signature: t=<ms>,v1=<hex HMAC-SHA256(secret, f"{t}." + body)>`.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import hmac
import logging
import re
import string
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum
from urllib.parse import quote

import aiohttp
from delayd.broker import codec
from delayd.broker.clock import Clock
from delayd.broker.groups import BACKOFF_MAX_MS, Delivery, Group, Groups
from delayd.broker.pushconfig import PushConfig, PushFormat
from delayd.storage.commitlog import Record
from delayd.storage.errors import StorageError
from delayd.storage.store import Store

from delayd import __version__

log = logging.getLogger("delayd.push")

# The lease outlives the POST's own timeout, so settling a POST never finds its lease expired.
LEASE_MARGIN_MS = 5_000
# Waits end at least this often, so a group deleted or changed without a notify is noticed.
IDLE_RECHECK_S = 1.0
RETRY_AFTER_STATUSES = frozenset({429, 503})
RETRY_AFTER_SECONDS = re.compile(r"[0-9]{1,9}")
SIGNATURE_HEADER = "Delayd-Signature"
HEADER_PREFIX = "Delayd-Header-"
CONTENT_TYPES = {PushFormat.JSON: codec.JSON, PushFormat.MSGPACK: codec.MSGPACK}
# Header values keep printable ASCII as it is; '%', space, controls and non-ASCII are
# percent-encoded (UTF-8), so any key, tag or header fits and urllib.parse.unquote restores it.
_VALUE_SAFE = (string.digits + string.ascii_letters + string.punctuation).replace("%", "")
# Header names must be HTTP tokens (RFC 9110 §5.6.2); '%' is one, so %XX keeps them valid.
_NAME_SAFE = "!#$&'*+-.^_`|~"


class PushOutcome(StrEnum):
    OK = "ok"  # 2xx: acked
    HTTP_ERROR = "http_error"  # any other status: nacked
    TIMEOUT = "timeout"  # no answer within timeout_ms: nacked
    CONNECTION_ERROR = "connection_error"  # refused, reset, DNS, TLS: nacked


def sign(secret: bytes, timestamp_ms: int, body: bytes) -> str:
    """The Delayd-Signature header value (Stripe's scheme, with milliseconds)."""
    mac = hmac.new(secret, f"{timestamp_ms}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp_ms},v1={mac}"


def header_value(s: str) -> str:
    return quote(s, safe=_VALUE_SAFE)


def header_name(s: str) -> str:
    return HEADER_PREFIX + quote(s, safe=_NAME_SAFE)


def retry_after_ms(value: str | None, now_ms: int) -> int | None:
    """Retry-After as delta-seconds or an HTTP date, clamped to the backoff's cap; None when
    absent or unreadable (then the group's backoff applies)."""
    if value is None:
        return None
    value = value.strip()
    if RETRY_AFTER_SECONDS.fullmatch(value):
        ms = int(value) * 1000
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        ms = int(when.timestamp() * 1000) - now_ms
    return max(0, min(BACKOFF_MAX_MS, ms))


def envelope(message_id: str, g: Group, d: Delivery, rec: Record, fmt: PushFormat) -> bytes:
    """The POST body: the message as pull returns it, without a receipt, with the group."""
    wire = CONTENT_TYPES[fmt]
    return codec.encode({"id": message_id, "topic": rec.topic, "group": g.name, "key": rec.key, "tag": rec.tag,
                         "headers": rec.headers or {}, **codec.body_fields(rec.body, wire),
                         "deliver_at": rec.deliver_at, "delivered_at": d.unit.released_at,
                         "attempt": d.attempt}, wire)


def delivery_headers(message_id: str, g: Group, d: Delivery, rec: Record, fmt: PushFormat) -> dict[str, str]:
    headers = {"Content-Type": CONTENT_TYPES[fmt], "Delayd-Id": message_id, "Delayd-Topic": rec.topic,
               "Delayd-Group": g.name, "Delayd-Deliver-At": str(rec.deliver_at),
               "Delayd-Delivered-At": str(d.unit.released_at), "Delayd-Attempt": str(d.attempt)}
    if rec.key is not None:
        headers["Delayd-Key"] = header_value(rec.key)
    if rec.tag:
        headers["Delayd-Tag"] = header_value(rec.tag)
    for name, value in (rec.headers or {}).items():
        headers[header_name(name)] = header_value(value)
    return headers


OnPush = Callable[[str, str, PushOutcome, float], None]  # topic, group, outcome, seconds


class Pusher:
    """Every push group's worker, the shared HTTP client and the total in-flight bound."""

    def __init__(self, groups: Groups, store: Store, clock: Clock, message_id: Callable[[int], str],
                 durable: Callable[[], Awaitable[None]], max_in_flight: int, on_push: OnPush) -> None:
        self.groups, self.store, self.clock = groups, store, clock
        self.message_id = message_id
        self.durable = durable  # the group commit: an ack is fsynced like one answered over the API
        self.max_in_flight = max_in_flight
        self.on_push = on_push
        self.in_flight = 0
        self.session: aiohttp.ClientSession | None = None
        self.workers: dict[str, _Worker] = {}
        self.posts: set[asyncio.Task[None]] = set()  # every POST in flight, for stop()
        self.blocked: set[_Worker] = set()  # workers waiting for a total slot
        self.taking = False

    def start(self) -> None:
        """After recovery: one session for all pushes, and a worker per push group."""
        connector = aiohttp.TCPConnector(limit=self.max_in_flight, limit_per_host=0)
        self.session = aiohttp.ClientSession(connector=connector, headers={"User-Agent": f"delayd/{__version__}"})
        self.taking = True
        self.sync()

    def sync(self) -> None:
        """Start a worker for each push group that has none (after a subscription PUT)."""
        if not self.taking:
            return
        for key, g in self.groups.groups.items():
            if g.push is not None and key not in self.workers:
                self.workers[key] = _Worker(self, g)

    def stop_taking(self) -> None:
        """Shutdown began: lease nothing more."""
        self.taking = False
        for w in list(self.workers.values()):
            w.wake.set()

    async def stop(self) -> int:
        """Cancel the workers and every POST in flight (their messages were not acked, so they
        come again after the restart); close the session. Returns how many POSTs were cut."""
        self.stop_taking()
        cut = len(self.posts)
        tasks = [w.task for w in self.workers.values()] + list(self.posts)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()
        if cut:
            log.info("push: %d POSTs in flight cut by the shutdown; the unacked come again after the restart", cut)
        return cut

    def room(self) -> int:
        return self.max_in_flight - self.in_flight

    def released(self) -> None:
        self.in_flight -= 1
        for w in self.blocked:
            w.wake.set()
        self.blocked.clear()


class _Worker:
    """Leases a push group's due messages as slots allow and POSTs each in its own task."""

    def __init__(self, pusher: Pusher, group: Group) -> None:
        self.pusher, self.group = pusher, group
        # Set by the group's topic (messages released, a nack, a redrive, new settings), by the
        # end of one of its POSTs and by a freed total slot; cleared before each look, so no
        # wake-up between the look and the wait is lost.
        self.wake = asyncio.Event()
        self.posts: set[asyncio.Task[None]] = set()
        self.task = asyncio.create_task(self.run(), name=f"push:{group.key}")
        self.task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (e := task.exception()) is not None:
            log.error("push %s: worker failed; a subscription PUT restarts it", self.group.key, exc_info=e)

    async def run(self) -> None:
        p, g = self.pusher, self.group
        p.groups.watch(g.topic, self.wake.set)
        try:
            while p.taking:
                self.wake.clear()
                push = g.push
                if push is None or p.groups.groups.get(g.key) is not g:
                    if not self.posts:  # back to pull (or deleted): a later PUT starts a new worker
                        p.workers.pop(g.key, None)
                        p.sync()  # the group may have been deleted and made again, as push, meanwhile
                        return
                    await self._wait(IDLE_RECHECK_S)
                    continue
                timeout = IDLE_RECHECK_S
                room = min(push.max_in_flight - len(self.posts), p.room())
                if room > 0:
                    try:
                        got = p.groups.take(g, room, push.timeout_ms + LEASE_MARGIN_MS, None)
                    except StorageError as e:  # a dead letter or skip could not be logged (disk full)
                        log.error("push %s: cannot lease: %s", g.key, e)
                        got = []
                    if got:
                        for d in got:
                            self._post(push, d)
                        continue
                    wake = p.groups.next_wakeup_ms(g)
                    if wake is not None:
                        timeout = min(timeout, max(0.001, (wake - p.clock.now_ms()) / 1000))
                elif p.room() <= 0:
                    p.blocked.add(self)
                await self._wait(timeout)
        finally:
            p.groups.unwatch(g.topic, self.wake.set)
            p.blocked.discard(self)
            if p.workers.get(g.key) is self:
                del p.workers[g.key]

    async def _wait(self, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                await self.wake.wait()
        except TimeoutError:
            pass

    def _post(self, push: PushConfig, d: Delivery) -> None:
        p = self.pusher
        p.in_flight += 1
        task = asyncio.create_task(self._deliver(push, d))
        self.posts.add(task)
        p.posts.add(task)
        task.add_done_callback(self._posted)

    def _posted(self, task: asyncio.Task[None]) -> None:
        self.posts.discard(task)
        self.pusher.posts.discard(task)
        self.pusher.released()
        self.wake.set()
        if not task.cancelled() and (e := task.exception()) is not None:
            log.error("push %s: delivery failed unexpectedly", self.group.key, exc_info=e)

    async def _deliver(self, push: PushConfig, d: Delivery) -> None:
        p, g = self.pusher, self.group
        mid = p.message_id(d.unit.seq)
        receipt = f"{mid}.{d.receipt}"
        try:
            rec = p.store.read_record(d.unit.commit_offset, d.unit.commit_size)
        except StorageError as e:
            log.error("ready message %d unreadable (%s); dead-lettering it", d.unit.seq, e)
            p.groups.dead_letter(g, d.unit.index, d.unit.seq, d.attempt, "unreadable")
            return
        body = envelope(mid, g, d, rec, push.format)
        headers = delivery_headers(mid, g, d, rec, push.format)
        if push.secret is not None:
            headers[SIGNATURE_HEADER] = sign(push.secret.encode(), p.clock.now_ms(), body)
        assert p.session is not None
        status: int | None = None
        retry_after: str | None = None
        t0 = time.monotonic()
        try:
            async with p.session.post(push.url, data=body, headers=headers, allow_redirects=False,
                                      timeout=aiohttp.ClientTimeout(total=push.timeout_ms / 1000)) as resp:
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
            outcome = PushOutcome.OK if 200 <= status < 300 else PushOutcome.HTTP_ERROR
        except TimeoutError:  # before ClientError: aiohttp's timeouts are both
            outcome = PushOutcome.TIMEOUT
        except (aiohttp.ClientError, OSError):
            outcome = PushOutcome.CONNECTION_ERROR
        p.on_push(g.topic, g.name, outcome, time.monotonic() - t0)
        try:
            if outcome is PushOutcome.OK:
                if p.groups.ack(g, [receipt])[0]:
                    await p.durable()  # so a crash now does not deliver it again
                return
            delay = retry_after_ms(retry_after, p.clock.now_ms()) if status in RETRY_AFTER_STATUSES else None
            reason = f"push_http_{status}" if status is not None else f"push_{outcome.value}"
            p.groups.nack(g, [receipt], delay, reason)
            if d.unit.index in g.dead:
                log.warning("push %s: message %s dead-lettered after %d attempts (%s)", g.key, mid, d.attempt,
                            reason)
        except (StorageError, OSError) as e:
            # The settle could not be logged or synced: the message may come again (at-least-once).
            log.error("push %s: cannot settle message %s: %s", g.key, mid, e)

