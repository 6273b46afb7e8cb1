"""Push settings and the pieces of a push POST, without a daemon: validation of the `push`
object, what answers and logs show of the secret, the durable form through the group event and
the checkpoint snapshot, the signature, header encoding and Retry-After.
(tests/integration/test_push.py drives the whole thing against the real daemon.)"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from urllib.parse import unquote

import pytest
from delayd.broker import errors, pushconfig
from delayd.broker.groups import BACKOFF_MAX_MS, Groups
from delayd.broker.push import header_name, header_value, retry_after_ms, sign
from delayd.broker.pushconfig import PushConfig, PushFormat
from delayd.storage.recovery import open_store
from delayd.storage.store import StoreConfig

SECRET = "0123456789abcdef-secret"
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def test_parse_fills_defaults_and_null_means_pull() -> None:
    assert pushconfig.parse(None) is None
    assert pushconfig.parse({"url": "https://example.com/hook"}) == PushConfig(
        "https://example.com/hook", 30_000, 10, None, PushFormat.JSON)
    full = {"url": "http://10.0.0.1:8080/h?x=1", "timeout_ms": 100, "max_in_flight": 1000, "secret": SECRET,
            "format": "msgpack"}
    assert pushconfig.parse(full) == PushConfig("http://10.0.0.1:8080/h?x=1", 100, 1000, SECRET, PushFormat.MSGPACK)


@pytest.mark.parametrize("raw", [
    [], "http://h/", {"url": None}, {"url": 5}, {"url": "mailto:a@b"}, {"url": "http://"},
    {"url": "https://u@h/"}, {"url": "http://h/\n"}, {"url": "http://h/ü"}, {"url": "http://h:0x/"},
    {"url": "http://h/", "timeout_ms": 1.5}, {"url": "http://h/", "max_in_flight": None},
    {"url": "http://h/", "secret": "ü" * 8 + "x" * 15 + "\ud800"}, {"url": "http://h/", "secret": "é" * 129},
    {"url": "http://h/", "format": None}, {"url": "http://h/", "Format": "json"},
])
def test_parse_rejects_with_invalid_push(raw: object) -> None:
    with pytest.raises(errors.InvalidPush) as e:
        pushconfig.parse(raw)
    assert (e.value.status, e.value.code) == (400, "invalid_push")


def test_secret_is_counted_in_utf8_bytes() -> None:
    assert pushconfig.parse({"url": "http://h/", "secret": "é" * 8}) is not None  # 16 bytes
    with pytest.raises(errors.InvalidPush):
        pushconfig.parse({"url": "http://h/", "secret": "é" * 7 + "x"})  # 15 bytes


def test_view_and_repr_never_show_the_secret_record_keeps_it() -> None:
    p = PushConfig("http://h/", secret=SECRET)
    assert SECRET not in repr(p) and SECRET not in str(p.view())
    assert p.view()["secret_fingerprint"] == "sha256:" + hashlib.sha256(SECRET.encode()).hexdigest()[:16]
    assert PushConfig("http://h/").view()["secret_fingerprint"] is None
    assert PushConfig.from_record(p.to_record()) == p


def test_push_settings_ride_the_group_event_and_the_snapshot(tmp_path) -> None:
    store, _report = open_store(tmp_path, StoreConfig(), lambda: 1_000_000)
    try:
        events: list[tuple[str, str, dict]] = []
        groups = Groups(store, lambda: 1_000_000, lambda t, g, ev: events.append((t, g, ev)), default_max_attempts=3)
        g = groups.get_or_create("t", "g")
        push = PushConfig("http://h/", 500, 2, SECRET, PushFormat.MSGPACK)
        assert groups.set_push(g, push) and not groups.set_push(g, push), "an unchanged PUT logs nothing"
        assert events[-1] == ("t", "g", {"op": "push", "push": push.to_record()})
        assert g.settings()["push"] == push.view() and "push" not in groups.get_or_create("t", "other").settings()

        from_events = Groups(store, lambda: 0, lambda *a: None, default_max_attempts=3)
        from_events.restore({}, events)
        assert from_events.groups["t/g"].push == push
        from_snapshot = Groups(store, lambda: 0, lambda *a: None, default_max_attempts=3)
        from_snapshot.restore(groups.snapshot(), [])
        assert from_snapshot.groups["t/g"].push == push and from_snapshot.groups["t/other"].push is None

        assert groups.set_push(g, None) and events[-1][2] == {"op": "push", "push": None}
        from_snapshot.restore({}, events[-1:])
        assert from_snapshot.groups["t/g"].push is None, "push: null replays as pull"
        assert "push" not in groups.snapshot()["t/g"]
    finally:
        store.close()


def test_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    body = b'{"id":"d-1"}'
    header = sign(SECRET.encode(), 1_700_000_000_123, body)
    t, v1 = (part.split("=", 1)[1] for part in header.split(","))
    assert t == "1700000000123"
    assert v1 == hmac.new(SECRET.encode(), b"1700000000123." + body, hashlib.sha256).hexdigest()
    assert sign(b"another secret!!", 1_700_000_000_123, body) != header
    assert sign(SECRET.encode(), 1_700_000_000_124, body) != header, "the timestamp is signed"


@pytest.mark.parametrize("s", ["plain", "a b", "100%", "ü/é", "tab\there", "x" * 300, "=,;:\"'"])
def test_header_values_and_names_round_trip_and_stay_valid(s: str) -> None:
    v = header_value(s)
    assert unquote(v) == s and v.isascii() and v.isprintable() and " " not in v
    name = header_name(s)
    assert TOKEN.fullmatch(name) and unquote(name.removeprefix("Delayd-Header-")) == s
    assert header_value("order-42/a+b") == "order-42/a+b", "printable ASCII stays readable"


def test_retry_after_seconds_dates_and_nonsense() -> None:
    now = 1_700_000_000_000
    assert retry_after_ms(None, now) is None and retry_after_ms("soon", now) is None
    assert retry_after_ms("0", now) == 0 and retry_after_ms(" 3 ", now) == 3000
    assert retry_after_ms("999999999", now) == BACKOFF_MAX_MS, "capped like the backoff"
    assert retry_after_ms("-5", now) is None and retry_after_ms("1.5", now) is None
    at = datetime.fromtimestamp(now / 1000, UTC) + timedelta(seconds=90)
    assert retry_after_ms(format_datetime(at, usegmt=True), now) == 90_000
    assert retry_after_ms(format_datetime(at - timedelta(hours=1), usegmt=True), now) == 0


def test_notify_runs_the_watchers_of_its_topic_only(tmp_path) -> None:
    store, _report = open_store(tmp_path, StoreConfig(), lambda: 0)
    try:
        groups = Groups(store, lambda: 0, lambda *a: None, default_max_attempts=3)
        calls: list[str] = []
        def wake() -> None:
            calls.append("t")
        groups.watch("t", wake)
        groups.notify("t")
        groups.notify("other")
        assert calls == ["t"]
        groups.unwatch("t", wake)
        groups.notify("t")
        assert calls == ["t"], "an unwatched callback is not run"
        assert not groups.changed, "watching creates no pull event to clear"
    finally:
        store.close()


def test_push_max_in_flight_config_is_bounded() -> None:
    from delayd.broker import config
    assert config.load(env={"DELAYD_PUSH_MAX_IN_FLIGHT": "3"}).push_max_in_flight == 3
    assert config.load(env={}).push_max_in_flight == 256
    for bad in ("0", "10001"):
        with pytest.raises(config.ConfigError, match="push_max_in_flight"):
            config.load(env={"DELAYD_PUSH_MAX_IN_FLIGHT": bad})
