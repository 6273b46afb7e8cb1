"""One HTTP exchange with one broker, with the retry rules.

Retrying is only done where it cannot create a duplicate:

* `Retry.SAFE` (reads, cancel, ack, nack, extend, subscribe, redrive, and produce when every message
  has a `key`, which the broker deduplicates): retried on connection errors, 429 and 503.
* `Retry.UNSENT` (produce with an unkeyed message): retried only when the request provably did not
  take effect - the connection could not be opened, or the broker answered 429 `backpressure`
  (produce is all-or-nothing, so a refused batch stored nothing). A reset or timeout after the
  request went out, or a 503, is raised to the caller: the batch may or may not be stored.
* `Retry.NEVER`.

Replicated shards (docs/replication.md) add three answers, each retried by the same rule:

* 421 `not_primary` names the shard's primary: the request is sent there at once (nothing was done,
  so this is safe for every request, and is not counted as a retry), at most `MAX_REDIRECTS` times.
* 503 `no_primary` and `insufficient_replicas` refused the request before doing anything: retried
  like 429 `backpressure`, also for unkeyed produce.
* 503 `under_replicated` was stored on the primary but may not survive it: like any 503, retried
  only under `Retry.SAFE`.

A request to a shard with several members goes to the primary last seen; when that member cannot
be reached it goes to the next member (a follower redirects), without a pause while a member is
left that this round has not tried.

The pause is jittered exponential backoff, and never shorter than the broker's `Retry-After`.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import yarl
from delayd.client.codec import Encoding, dumps, loads
from delayd.client.errors import (
    Backpressure,
    ConnectionFailed,
    DelaydError,
    InsufficientReplicas,
    NoPrimary,
    NotPrimary,
    ProtocolError,
    Unavailable,
    error_from_response,
)
from delayd.client.replicas import MAX_REDIRECTS, Shard

USER_AGENT = "delayd-python-client/0.1"


LARGE_BODY_BYTES = 1024 * 1024  # aiohttp's limit for a raw bytes body (payload.TOO_LARGE_BYTES_BODY)
UNWRITTEN = "Can not write request body"  # aiohttp's ClientOSError when sending the request failed

class Retry(Enum):
    SAFE = "safe"
    UNSENT = "unsent"
    NEVER = "never"


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` counts the first try. Pauses grow `base_delay_ms * 2**n` up to `max_delay_ms`, each
    drawn uniformly from its upper half (jitter keeps many clients from retrying in step)."""

    attempts: int = 6
    base_delay_ms: int = 100
    max_delay_ms: int = 5_000
    max_retry_after_ms: int = 30_000

    def delay_s(self, retry_number: int, retry_after_s: float | None = None,
                rng: random.Random | None = None) -> float:
        ceiling = min(self.max_delay_ms, self.base_delay_ms * (2 ** max(0, retry_number - 1)))
        pause_ms = (rng or random).uniform(ceiling / 2, ceiling)
        if retry_after_s is not None:
            pause_ms = max(pause_ms, min(retry_after_s * 1000, self.max_retry_after_ms))
        return pause_ms / 1000


NO_RETRY = RetryPolicy(attempts=1)


TlsOption = ssl.SSLContext | str | os.PathLike[str] | None


def tls_context(tls: TlsOption) -> ssl.SSLContext | None:
    """An `ssl.SSLContext` as given, or one that trusts the CA certificate(s) in a PEM file (for a
    daemon with a self-signed or private-CA certificate). None: the system's trusted CAs."""
    if tls is None or isinstance(tls, ssl.SSLContext):
        return tls
    ca_file = os.fspath(tls)
    if not os.path.isfile(ca_file):
        raise ValueError(f"tls: no CA file {ca_file!r}")
    return ssl.create_default_context(cafile=ca_file)


def path(*parts: str) -> str:
    """`/v1/...` from segments, each percent-encoded (keys may hold `/`, spaces, anything)."""
    return "/v1/" + "/".join(quote(p, safe="") for p in parts)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header; delta-seconds only (fractions accepted)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _retryable(err: DelaydError, mode: Retry) -> bool:
    if mode is Retry.NEVER:
        return False
    if isinstance(err, Backpressure | NoPrimary | InsufficientReplicas):
        return True  # refused before anything was done
    if isinstance(err, ConnectionFailed):
        return mode is Retry.SAFE or not err.sent
    if isinstance(err, Unavailable) and err.status == 503:
        return mode is Retry.SAFE
    return False


class Transport:
    """Shares one aiohttp session (one connection pool) among all the shards of a client."""

    def __init__(self, *, token: str | None, encoding: Encoding, timeout_s: float,
                 retry: RetryPolicy, tls: ssl.SSLContext | None = None) -> None:
        self.token = token
        self.tls = tls
        self.encoding = encoding
        self.timeout_s = timeout_s
        self.retry = retry
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("client is closed")
        if self._session is None:
            headers = {"User-Agent": USER_AGENT, "Accept": self.encoding.content_type}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            # Created lazily so that the session belongs to the loop that uses it.
            # ssl=True: aiohttp's default verification (system CAs) for https URLs.
            connector = aiohttp.TCPConnector(limit=64, ssl=self.tls if self.tls is not None else True)
            self._session = aiohttp.ClientSession(headers=headers, connector=connector)
        return self._session

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, where: str | Shard, method: str, url_path: str, *, body: Any = None,
                      query: Mapping[str, Any] | None = None, retry: Retry = Retry.SAFE,
                      extra_timeout_s: float = 0.0) -> Any:
        """Send to one URL, or to a shard's primary (following 421 redirects, failing over among
        its members); retry per `retry`; return the decoded answer or raise a `DelaydError`."""
        shard = where if isinstance(where, Shard) else Shard.single(where.rstrip("/"))
        suffix = url_path
        if query:
            suffix += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else dumps(body, self.encoding)
        headers = {"Content-Type": self.encoding.content_type} if data is not None else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s + extra_timeout_s)
        attempts = self.retry.attempts if retry is not Retry.NEVER else 1
        number = redirects = 0
        tried: set[str] = set()  # members that could not be reached in this round
        while True:
            base_url = shard.current()
            try:
                return await self._once(base_url, method, base_url + suffix, data, headers, timeout)
            except NotPrimary as err:
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    err.message += f" (gave up after {MAX_REDIRECTS} redirects)"
                    raise
                if err.primary is not None and shard.resolve(err.primary) != base_url:
                    shard.follow(err.primary)
                    continue
                # A follower that knows no primary (or names itself): ask another member after a pause.
                shard.failed(base_url)
                number += 1
                if number >= attempts:
                    raise
                pause = self.retry.delay_s(number, err.retry_after)
            except DelaydError as err:
                if not _retryable(err, retry):
                    raise
                if isinstance(err, ConnectionFailed):
                    shard.failed(base_url)
                    tried.add(base_url)
                    if not err.sent and shard.others(tried):
                        continue  # another member may be up: no pause
                    tried.clear()
                number += 1
                if number >= attempts:
                    raise
                pause = self.retry.delay_s(number, err.retry_after)
            await asyncio.sleep(pause)

    async def _once(self, base_url: str, method: str, target: str, data: bytes | None,
                    headers: dict[str, str], timeout: aiohttp.ClientTimeout) -> Any:
        session = self._get_session()
        # aiohttp sends raw bytes over 1 MiB in one go from the event loop (and warns): a file-like
        # body is sent in chunks. A fresh one per attempt, so that a retry sends it whole again.
        body: bytes | io.BytesIO | None = io.BytesIO(data) if data is not None and len(data) > LARGE_BODY_BYTES \
            else data
        try:
            async with session.request(method, yarl.URL(target, encoded=True), data=body, headers=headers,
                                       timeout=timeout) as resp:
                raw = await resp.read()
                status = resp.status
                ctype = resp.headers.get("Content-Type", "")
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
        except aiohttp.ClientConnectorError as e:
            raise ConnectionFailed(f"cannot connect to {base_url}: {e}", sent=False, url=base_url) from e
        except aiohttp.ClientOSError as e:
            # A pooled connection to a member that died (a failed-over primary) fails while the
            # request is written; a server never acts on a request whose body it did not receive.
            unsent = UNWRITTEN in str(e)
            raise ConnectionFailed(f"{method} {target}: {type(e).__name__}: {e}", sent=not unsent,
                                   url=base_url) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ConnectionFailed(f"{method} {target}: {type(e).__name__}: {e}", sent=True, url=base_url) from e
        if status < 400:
            try:
                return loads(raw, ctype)
            except ProtocolError as e:
                e.url = base_url
                raise
        try:
            payload = loads(raw, ctype)
        except ProtocolError:
            payload = None
        text = raw[:500].decode("utf-8", "replace").strip() if payload is None else ""
        raise error_from_response(status, payload, retry_after=retry_after, url=base_url, fallback_text=text)
