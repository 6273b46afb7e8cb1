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

from delayd.storage.store import StoreConfig

DAY_MS = 86_400_000
FSYNC_POLICIES = ("always", "interval", "never")
RIGHTS = ("produce", "consume", "admin")


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
    # timer
    precision_ms: int = 1000
    roll_window_ms: int = 2 * DAY_MS
    lookahead_ms: int = 300
    max_delay_ms: int = 3650 * DAY_MS
    # limits
    max_body_bytes: int = 1024 * 1024
    max_request_bytes: int = 64 * 1024 * 1024
    max_batch: int = 10_000
    max_unindexed_bytes: int = 1024 * 1024 * 1024
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
    # security
    tokens: tuple[Token, ...] = field(default=())
    tls_cert: str | None = None
    tls_key: str | None = None

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

    def validate(self) -> Config:
        if self.fsync not in FSYNC_POLICIES:
            raise ConfigError(f"fsync must be one of {FSYNC_POLICIES}, not {self.fsync!r}")
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
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together")
        for t in self.tokens:
            if len(t.token) < 8:
                raise ConfigError("auth tokens must be at least 8 characters")
            bad = set(t.rights) - set(RIGHTS)
            if bad:
                raise ConfigError(f"unknown token rights {sorted(bad)}")
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
        for section in ("server", "storage", "timer", "limits", "consumers", "tls"):
            values.update(data.pop(section, {}) or {})
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
