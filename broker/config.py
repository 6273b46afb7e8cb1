"""Configuration: frozen dataclasses with units in the names, loaded in one place.

Precedence: command-line flags > environment (`DELAYD_<FIELD>`) > TOML file > defaults.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from delayd.storage import commitlog
from delayd.storage.store import StoreConfig

DAY_MS = 86_400_000
# Room a record needs beside its body (header, topic, tag, key, packed headers: under 10 KB).
MAX_BODY_BYTES = commitlog.MAX_RECORD - 64 * 1024
# Room for a message's other fields in a request beside its body (field names, a delay, a short
# key or tag): the check that one message of max_body_bytes fits, not a promise for every message.
MESSAGE_OVERHEAD_BYTES = 1024
FSYNC_POLICIES = ("always", "interval", "never")
RIGHTS = ("produce", "consume", "admin")
LOG_LEVELS = ("debug", "info", "warning", "error")
# A member name is a path element of its etcd keys (docs/replication.md).
MEMBER_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
ETCD_MAX_LEASE_TTL_MS = 60_000


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which setting and why."""


@dataclass(frozen=True)
class Token:
    token: str
    rights: tuple[str, ...] = RIGHTS
    topics: tuple[str, ...] = ("*",)

    def __repr__(self) -> str:  # tokens are never logged
        return f"Token(rights={self.rights}, topics={self.topics})"


@dataclass(frozen=True)
class Config:
    data_dir: str = "./delayd-data"
    listen: str = "127.0.0.1:7070"
    fsync: str = "always"
    fsync_interval_ms: int = 1000
    node_id: str = ""  # "": the data directory's (recorded at its first start; see docs/operations.md)
    insecure: bool = False
    auto_token: bool = False  # no tokens configured: serve with a generated one (broker.admin_token)
    # logging
    log_level: str = "info"
    access_log: bool = False  # one line per HTTP request (logger delayd.access); off by default
    # timer
    precision_ms: int = 1000
    roll_window_ms: int = 2 * DAY_MS
    lookahead_ms: int = 300
    max_delay_ms: int = 3650 * DAY_MS
    # limits
    max_body_bytes: int = 1024 * 1024
    # The largest produce request: a batch of 10,000 messages of about 1.6 KB each, or a few large
    # ones (a body of max_body_bytes takes 4/3 of it as body_b64). Everything in a request is held
    # in memory while it is decoded (see broker.bodies).
    max_request_bytes: int = 16 * 1024 * 1024
    # Map keys, map values and array items in one request: what a request may cost in Python
    # objects (tens of bytes each), whatever its size in bytes. A message with a body, a delay, a
    # key, a tag and N headers takes 11 + 2N: 10,000 messages with 7 headers each take 250,000.
    max_request_elements: int = 250_000
    max_batch: int = 10_000
    max_unindexed_bytes: int = 1024 * 1024 * 1024
    # Keys produced but not yet in the key index's database (held in memory meanwhile, about 150
    # bytes each): above it a keyed produce is answered 429 until the index's writes catch up.
    max_unwritten_keys: int = 500_000
    # Far-index writes (messages due beyond the roll window) queued but not yet in its database
    # (held in memory meanwhile, about 200 bytes each): above it a produce of a batch holding a
    # far message is answered 429 until the writes catch up.
    max_unwritten_far: int = 500_000
    # How long a produce refused for one of the three bounds above waits for room (rechecked every
    # 50 ms: the writes that make it run in other threads) before it is answered 429; 0: at once.
    backpressure_wait_ms: int = 1000
    request_timeout_s: float = 60.0
    # storage
    segment_bytes: int = 64 * 1024 * 1024
    timerlog_segment_units: int = 1 << 20
    ready_segment_units: int = 1 << 18
    msgtable_segment_entries: int = 1 << 20
    ready_queue_open_files: int = 256  # ready queues open at once; an LRU closes the rest
    checkpoint_interval_ms: int = 1000
    retention_ms: int = 3 * DAY_MS
    retention_interval_ms: int = 10_000
    dedup_window_ms: int = 600_000
    # pipeline
    stage_queue_batches: int = 32
    release_capacity: int = 50_000
    # consumers
    default_max_attempts: int = 16
    push_max_in_flight: int = 256  # POSTs in flight over all push subscriptions (HTTP connections)
    # security
    tokens: tuple[Token, ...] = field(default=())
    tls_cert: str | None = None
    tls_key: str | None = None
    # replication (docs/replication.md): the shard is node_id; only the coordination layer exists yet
    replication_enabled: bool = False
    replication_member: str = ""  # this member's name, unique within the shard
    replication_advertise_url: str = ""  # where clients and the other members reach this member
    replication_etcd_endpoints: tuple[str, ...] = ()
    replication_etcd_timeout_ms: int = 1000
    replication_lease_ttl_ms: int = 3000  # etcd leases are whole seconds
    replication_fence_margin_ms: int = 500
    replication_key_prefix: str = "/delayd"
    replication_min_insync: int = 2  # copies (the primary's included) a write needs; for the data path
    replication_max_lag_ms: int = 10_000  # a follower further behind leaves the in-sync set; for the data path

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)

    def store_config(self) -> StoreConfig:
        return StoreConfig(precision_ms=self.precision_ms, roll_window_ms=self.roll_window_ms,
                           lookahead_ms=self.lookahead_ms,
                           commit_segment_bytes=self.segment_bytes,
                           timerlog_segment_units=self.timerlog_segment_units,
                           ready_segment_units=self.ready_segment_units,
                           msgtable_segment_entries=self.msgtable_segment_entries,
                           ready_open_files=self.ready_queue_open_files)

    def replication(self) -> ReplicationConfig:
        return ReplicationConfig(enabled=self.replication_enabled, shard=self.node_id,
                                 member=self.replication_member, advertise_url=self.replication_advertise_url,
                                 etcd_endpoints=self.replication_etcd_endpoints,
                                 etcd_timeout_ms=self.replication_etcd_timeout_ms,
                                 lease_ttl_ms=self.replication_lease_ttl_ms,
                                 fence_margin_ms=self.replication_fence_margin_ms,
                                 key_prefix=self.replication_key_prefix,
                                 min_insync=self.replication_min_insync,
                                 max_lag_ms=self.replication_max_lag_ms)

    def validate(self) -> Config:
        if self.fsync not in FSYNC_POLICIES:
            raise ConfigError(f"fsync must be one of {FSYNC_POLICIES}, not {self.fsync!r}")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {LOG_LEVELS}, not {self.log_level!r}")
        if not 10 <= self.precision_ms <= 1000:
            raise ConfigError("precision_ms must be within 10..1000")
        if not 1000 <= self.roll_window_ms <= 20 * DAY_MS:
            raise ConfigError("roll_window_ms must be within 1 s .. 20 days (TimerLog delays are 32-bit ms)")
        if not 0 <= self.lookahead_ms <= 5000:
            raise ConfigError("lookahead_ms must be within 0..5000")
        if self.roll_window_ms % self.precision_ms:
            raise ConfigError("roll_window_ms must be a multiple of precision_ms")
        try:
            _, port = self.host_port
        except ValueError as e:
            raise ConfigError(f"listen must be HOST:PORT, not {self.listen!r}") from e
        if not 0 <= port < 65536:
            raise ConfigError(f"listen port {port} out of range")
        if self.node_id and not all(c.isalnum() for c in self.node_id):
            raise ConfigError("node_id must be alphanumeric (or unset: the data directory's)")
        if not 1 <= self.ready_queue_open_files <= 1_000_000:
            raise ConfigError("ready_queue_open_files must be within 1..1000000")
        if not 1 <= self.push_max_in_flight <= 10_000:
            raise ConfigError("push_max_in_flight must be within 1..10000")
        if not 1 <= self.max_body_bytes <= MAX_BODY_BYTES:
            raise ConfigError(f"max_body_bytes must be within 1..{MAX_BODY_BYTES} (a commit-log record holds "
                              f"at most {commitlog.MAX_RECORD} bytes)")
        one_message = -(-self.max_body_bytes // 3) * 4 + MESSAGE_OVERHEAD_BYTES
        if self.max_request_bytes < one_message:
            raise ConfigError(f"max_request_bytes must be at least {one_message}: one message of max_body_bytes "
                              f"must fit in a request, also as body_b64 in JSON")
        if self.max_unwritten_keys < 1:
            raise ConfigError("max_unwritten_keys must be at least 1")
        if self.max_unwritten_far < 1:
            raise ConfigError("max_unwritten_far must be at least 1")
        if not 0 <= self.backpressure_wait_ms <= 60_000:
            raise ConfigError("backpressure_wait_ms must be within 0..60000")
        if self.max_request_elements < 1000:
            raise ConfigError("max_request_elements must be at least 1,000")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together")
        for t in self.tokens:
            if len(t.token) < 8:
                raise ConfigError("auth tokens must be at least 8 characters")
            bad = set(t.rights) - set(RIGHTS)
            if bad:
                raise ConfigError(f"unknown token rights {sorted(bad)}")
        if self.replication_enabled:
            self.replication().validate()
            if self.tokens and self.stream_token() is None:
                raise ConfigError("replication with [[auth.tokens]] needs a token with the admin right: the "
                                  "members present it to each other on the replication stream")
            if self.auto_token and not self.tokens:
                raise ConfigError("replication does not work with --auto-token (each member would generate its "
                                  "own): configure the same [[auth.tokens]] on every member, or --insecure")
        return self

    def stream_token(self) -> str | None:
        """The token a follower presents on the primary's replication stream: the first configured
        token with the admin right (the members of a shard share their tokens); None without tokens."""
        return next((t.token for t in self.tokens if "admin" in t.rights), None)


def _is_http_url(url: str) -> bool:
    scheme, sep, rest = url.partition("://")
    host, _, port = rest.rstrip("/").rpartition(":")
    return bool(sep) and scheme in ("http", "https") and bool(host) and "/" not in host and port.isdigit()


@dataclass(frozen=True)
class ReplicationConfig:
    """The replication settings of one member of one shard (Config.replication_*)."""
    enabled: bool
    shard: str
    member: str
    advertise_url: str
    etcd_endpoints: tuple[str, ...]
    etcd_timeout_ms: int = 1000
    lease_ttl_ms: int = 3000
    fence_margin_ms: int = 500
    key_prefix: str = "/delayd"
    min_insync: int = 2
    max_lag_ms: int = 10_000

    def validate(self) -> ReplicationConfig:
        """Refuse a configuration the coordination layer cannot run safely; each message names
        the setting (as `replication_<field>`)."""
        if not self.shard or not all(c.isalnum() for c in self.shard):
            raise ConfigError("node_id (the replicated shard) must be non-empty and alphanumeric")
        if not self.member or not set(self.member) <= MEMBER_NAME_CHARS:
            raise ConfigError("replication_member must be set: letters, digits, '_', '.', '-' "
                              f"(not {self.member!r})")
        if not _is_http_url(self.advertise_url):
            raise ConfigError("replication_advertise_url must be http(s)://HOST:PORT, the address other "
                              f"members and clients use for this member (not {self.advertise_url!r})")
        if not self.etcd_endpoints:
            raise ConfigError("replication_etcd_endpoints must name at least one etcd client URL")
        for e in self.etcd_endpoints:
            if not _is_http_url(e):
                raise ConfigError(f"replication_etcd_endpoints: {e!r} is not http(s)://HOST:PORT")
        if self.lease_ttl_ms % 1000 or not 1000 <= self.lease_ttl_ms <= ETCD_MAX_LEASE_TTL_MS:
            raise ConfigError("replication_lease_ttl_ms must be whole seconds (etcd leases are) within "
                              f"1000..{ETCD_MAX_LEASE_TTL_MS}, not {self.lease_ttl_ms}")
        if not 0 <= self.fence_margin_ms * 2 < self.lease_ttl_ms:
            raise ConfigError("replication_fence_margin_ms must be >= 0 and under half of "
                              "replication_lease_ttl_ms: the primary stops acknowledging that long before "
                              "its lease can expire, and needs the rest of the lease to renew it")
        if not 0 < self.etcd_timeout_ms < self.lease_ttl_ms:
            raise ConfigError("replication_etcd_timeout_ms must be > 0 and under replication_lease_ttl_ms")
        if not self.key_prefix.startswith("/") or self.key_prefix.endswith("/"):
            raise ConfigError(f"replication_key_prefix must start with '/' and not end with one "
                              f"(not {self.key_prefix!r})")
        if self.min_insync < 1:
            raise ConfigError("replication_min_insync must be at least 1 (the primary counts)")
        if self.max_lag_ms <= 0:
            raise ConfigError("replication_max_lag_ms must be > 0")
        return self


def _coerce(name: str, typ: Any, raw: Any) -> Any:
    if typ in (int, "int"):
        return int(raw)
    if typ in (float, "float"):
        return float(raw)
    if typ in (bool, "bool"):
        if isinstance(raw, bool):
            return raw
        return str(raw).strip().lower() in ("1", "true", "yes", "on")
    if typ in ("str | None",):
        return None if raw in (None, "") else str(raw)
    if typ in ("tuple[str, ...]",):  # a TOML list, or a comma-separated string from env or flags
        items = raw.split(",") if isinstance(raw, str) else list(raw)
        return tuple(str(i).strip() for i in items if str(i).strip())
    return str(raw)


def _tokens(raw: Any) -> tuple[Token, ...]:
    out = []
    for t in raw or ():
        if not isinstance(t, dict) or "token" not in t:
            raise ConfigError("each [[auth.tokens]] needs a token")
        out.append(Token(str(t["token"]), tuple(t.get("rights", RIGHTS)), tuple(t.get("topics", ("*",)))))
    return tuple(out)


def load(config_file: str | None = None, env: dict[str, str] | None = None,
         flags: dict[str, Any] | None = None) -> Config:
    environ: Any = os.environ if env is None else env
    values: dict[str, Any] = {}
    types = {f.name: f.type for f in fields(Config)}
    if config_file:
        try:
            data = tomllib.loads(Path(config_file).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config {config_file}: {e}") from e
        auth = data.pop("auth", {}) or {}
        values["tokens"] = _tokens(auth.get("tokens"))
        for section in ("server", "storage", "timer", "limits", "consumers", "tls", "logging"):
            values.update(data.pop(section, {}) or {})
        # [replication] keys are the settings without their prefix: `enabled`, `member`, ...
        values.update({f"replication_{k}": v for k, v in (data.pop("replication", {}) or {}).items()})
        values.update(data)
    for name in types:
        key = "DELAYD_" + name.upper()
        if key in environ and name != "tokens":
            values[name] = environ[key]
    for name, v in (flags or {}).items():
        if v is not None:
            values[name] = v
    unknown = set(values) - set(types)
    if unknown:
        raise ConfigError(f"unknown settings: {sorted(unknown)}")
    try:
        kwargs = {k: (v if k == "tokens" else _coerce(k, types[k], v)) for k, v in values.items()}
    except (TypeError, ValueError) as e:
        raise ConfigError(f"bad setting: {e}") from e
    return dataclasses.replace(Config(), **kwargs).validate()
