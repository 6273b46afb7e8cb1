"""The settings of a push subscription: where the daemon POSTs a group's due messages, and how.

A consumer group is pull (the default) or push. Its push settings are a group setting like
`max_attempts`: validated here from the `push` object of `PUT .../subscriptions/{group}`,
logged as a group event and kept in the checkpoint snapshot (`to_record` / `from_record`), and
shown in answers by `view()`, which never includes the secret, only a fingerprint of it.

This module depends on nothing of the broker but its errors, so `groups` (which stores the
settings) and `push` (which delivers) can both import it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from delayd.broker import errors
from yarl import URL


class PushFormat(StrEnum):
    """How the POSTed envelope is encoded (its Content-Type)."""

    JSON = "json"
    MSGPACK = "msgpack"


DEFAULT_TIMEOUT_MS = 30_000  # as long as pull's default lease: a handler gets the same time either way
MIN_TIMEOUT_MS = 100
MAX_TIMEOUT_MS = 600_000
DEFAULT_MAX_IN_FLIGHT = 10
MAX_IN_FLIGHT = 1000
MAX_URL_CHARS = 2048
MIN_SECRET_BYTES = 16  # 128 bits: an HMAC key shorter than that can be guessed
MAX_SECRET_BYTES = 256
FIELDS = {"url", "timeout_ms", "max_in_flight", "secret", "format"}


@dataclass(frozen=True)
class PushConfig:
    url: str
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    secret: str | None = None
    format: PushFormat = PushFormat.JSON

    def __repr__(self) -> str:  # the secret is never logged
        return (f"PushConfig(url={self.url!r}, timeout_ms={self.timeout_ms}, max_in_flight={self.max_in_flight}, "
                f"secret={'set' if self.secret else None}, format={self.format.value!r})")

    def fingerprint(self) -> str | None:
        """Enough to tell which secret is configured (compare with one's own), not to recover it."""
        if self.secret is None:
            return None
        return "sha256:" + hashlib.sha256(self.secret.encode()).hexdigest()[:16]

    def view(self) -> dict[str, Any]:
        """What API answers show."""
        return {"url": self.url, "timeout_ms": self.timeout_ms, "max_in_flight": self.max_in_flight,
                "format": self.format.value, "secret_fingerprint": self.fingerprint()}

    def to_record(self) -> dict[str, Any]:
        """The durable form (group event and checkpoint snapshot): the secret has to be in it,
        or pushes could not be signed after a restart."""
        return {"url": self.url, "timeout_ms": self.timeout_ms, "max_in_flight": self.max_in_flight,
                "secret": self.secret, "format": self.format.value}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> PushConfig:
        return cls(rec["url"], rec["timeout_ms"], rec["max_in_flight"], rec.get("secret"),
                   PushFormat(rec.get("format", PushFormat.JSON.value)))


def _int(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = body.get(name, default)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise errors.InvalidPush(f"push.{name} must be an integer in [{lo}, {hi}]")
    return v


def check_url(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise errors.InvalidPush("push.url is required: an absolute http:// or https:// URL")
    if len(raw) > MAX_URL_CHARS:
        raise errors.InvalidPush(f"push.url is longer than {MAX_URL_CHARS} characters")
    if not raw.isprintable() or not raw.isascii() or " " in raw:
        raise errors.InvalidPush("push.url must be printable ASCII without spaces (percent-encode the rest)")
    try:
        url = URL(raw)
        host, port = url.host, url.port  # yarl checks the port lazily
    except (ValueError, TypeError) as e:
        raise errors.InvalidPush(f"push.url does not parse: {e}") from None
    if url.scheme not in ("http", "https") or not host or port is None:
        raise errors.InvalidPush("push.url must be an absolute http:// or https:// URL with a host")
    if url.user is not None or url.password is not None:
        # Answers show the URL in full; credentials belong in the signature secret instead.
        raise errors.InvalidPush("push.url must not carry credentials (user:password@); use push.secret")
    if url.fragment:
        raise errors.InvalidPush("push.url must not have a #fragment (it is never sent)")
    return raw


def parse(raw: Any) -> PushConfig | None:
    """The `push` field of a subscription PUT: an object, or null for pull."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise errors.InvalidPush("push must be an object (or null to turn the subscription back into pull)")
    extra = set(raw) - FIELDS
    if extra:
        raise errors.InvalidPush(f"unknown push fields {sorted(map(str, extra))}; push takes {sorted(FIELDS)}")
    url = check_url(raw.get("url"))
    timeout_ms = _int(raw, "timeout_ms", DEFAULT_TIMEOUT_MS, MIN_TIMEOUT_MS, MAX_TIMEOUT_MS)
    max_in_flight = _int(raw, "max_in_flight", DEFAULT_MAX_IN_FLIGHT, 1, MAX_IN_FLIGHT)
    secret = raw.get("secret")
    if secret is not None:
        if not isinstance(secret, str):
            raise errors.InvalidPush("push.secret must be a string")
        try:
            n = len(secret.encode())
        except UnicodeEncodeError:
            raise errors.InvalidPush("push.secret must be valid Unicode text") from None
        if not MIN_SECRET_BYTES <= n <= MAX_SECRET_BYTES:
            raise errors.InvalidPush(f"push.secret must be {MIN_SECRET_BYTES}-{MAX_SECRET_BYTES} bytes (UTF-8)")
    fmt = raw.get("format", PushFormat.JSON.value)
    if fmt not in tuple(f.value for f in PushFormat):
        raise errors.InvalidPush("push.format must be 'json' or 'msgpack'")
    return PushConfig(url, timeout_ms, max_in_flight, secret, PushFormat(fmt))
