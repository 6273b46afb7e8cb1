"""Configuration: file < environment < flags, validation with clear messages, secrets hidden."""

from __future__ import annotations

import pytest
from delayd.broker.config import Config, ConfigError, load


def test_precedence_flags_over_env_over_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('listen = "127.0.0.1:1111"\nprecision_ms = 500\nfsync = "interval"\n'
                 '[storage]\nsegment_bytes = 65536\n')
    cfg = load(str(f), env={"DELAYD_PRECISION_MS": "250", "DELAYD_LISTEN": "127.0.0.1:2222"},
               flags={"listen": "127.0.0.1:3333", "fsync": None})
    assert cfg.listen == "127.0.0.1:3333"  # flag beats env beats file
    assert cfg.precision_ms == 250  # env beats file
    assert cfg.fsync == "interval"  # file beats default; a None flag means "not given"
    assert cfg.segment_bytes == 65536  # sections are flattened
    assert load(None, env={}) == Config()


def test_tokens_from_file_are_never_shown(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[[auth.tokens]]\ntoken = "s3cret-token-xyz"\nrights = ["produce"]\ntopics = ["orders.*"]\n')
    cfg = load(str(f), env={})
    (tok,) = cfg.tokens
    assert tok.rights == ("produce",) and tok.topics == ("orders.*",)
    assert "s3cret" not in repr(cfg) and "s3cret" not in str(cfg)


@pytest.mark.parametrize("bad, what", [
    ({"fsync": "sometimes"}, "fsync"),
    ({"precision_ms": 5}, "precision_ms"),
    ({"roll_window_ms": 500}, "roll_window_ms"),
    ({"roll_window_ms": 2_000_500}, "multiple of precision_ms"),
    ({"listen": "nonsense"}, "listen"),
    ({"node_id": "a-b"}, "node_id"),
    ({"lookahead_ms": 9000}, "lookahead_ms"),
    ({"backpressure_wait_ms": -1}, "backpressure_wait_ms"),
    ({"backpressure_wait_ms": 60_001}, "backpressure_wait_ms"),
    ({"no_such_setting": 1}, "unknown settings"),
    ({"precision_ms": "fast"}, "bad setting"),
])
def test_invalid_settings_are_refused_with_the_reason(bad, what):
    with pytest.raises(ConfigError, match=what):
        load(None, env={}, flags=bad)


def test_unreadable_file_is_a_config_error(tmp_path):
    f = tmp_path / "broken.toml"
    f.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="cannot read config"):
        load(str(f), env={})


REPLICATED = {"node_id": "s0", "replication_enabled": True, "replication_member": "s0-a",
              "replication_advertise_url": "http://10.0.0.1:7070",
              "replication_etcd_endpoints": "http://10.0.0.9:2379,http://10.0.0.10:2379"}


def test_replication_settings_from_file_env_and_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('node_id = "s0"\n[replication]\nenabled = true\nmember = "s0-a"\n'
                 'advertise_url = "http://10.0.0.1:7070"\netcd_endpoints = ["http://10.0.0.9:2379"]\n'
                 'lease_ttl_ms = 5000\n')
    cfg = load(str(f), env={"DELAYD_REPLICATION_FENCE_MARGIN_MS": "800"})
    r = cfg.replication()
    assert (r.enabled, r.shard, r.member, r.etcd_endpoints) == (True, "s0", "s0-a", ("http://10.0.0.9:2379",))
    assert (r.lease_ttl_ms, r.fence_margin_ms, r.key_prefix, r.min_insync) == (5000, 800, "/delayd", 2)
    # A comma-separated list from the environment or a flag.
    cfg = load(None, env={"DELAYD_REPLICATION_ETCD_ENDPOINTS": "http://e1:2379, http://e2:2379"},
               flags={**REPLICATED, "replication_etcd_endpoints": None})
    assert cfg.replication().etcd_endpoints == ("http://e1:2379", "http://e2:2379")
    assert load(None, env={}).replication().enabled is False


@pytest.mark.parametrize("bad, what", [
    ({"replication_member": ""}, "replication_member must be set"),
    ({"replication_member": "a/b"}, "replication_member"),
    ({"replication_advertise_url": ""}, "replication_advertise_url"),
    ({"replication_advertise_url": "10.0.0.1:7070"}, "replication_advertise_url"),
    ({"replication_etcd_endpoints": ""}, "at least one etcd"),
    ({"replication_etcd_endpoints": "etcd:2379"}, "not http"),
    ({"replication_lease_ttl_ms": 2500}, "whole seconds"),
    ({"replication_lease_ttl_ms": 0}, "replication_lease_ttl_ms"),
    ({"replication_fence_margin_ms": 1500}, "under half"),
    ({"replication_fence_margin_ms": -1}, "replication_fence_margin_ms"),
    ({"replication_etcd_timeout_ms": 3000}, "replication_etcd_timeout_ms"),
    ({"replication_key_prefix": "delayd/"}, "replication_key_prefix"),
    ({"replication_min_insync": 0}, "replication_min_insync"),
    ({"replication_max_lag_ms": 0}, "replication_max_lag_ms"),
])
def test_inconsistent_replication_settings_are_refused(bad, what):
    with pytest.raises(ConfigError, match=what):
        load(None, env={}, flags={**REPLICATED, **bad})
    # The same values are not checked while replication is off.
    load(None, env={}, flags={**REPLICATED, **bad, "replication_enabled": False})


def test_serve_refuses_replication_settings_with_the_reason(tmp_path):
    """An inconsistent replication config stops `delayd serve` with the setting's name, before
    anything is touched."""
    import subprocess
    import sys

    from tests.support.daemon import ROOT
    base = ["serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0"]
    env = {"PATH": "/usr/bin:/bin", "DELAYD_NODE_ID": "s0", "DELAYD_REPLICATION_ENABLED": "true",
           "DELAYD_REPLICATION_MEMBER": "a",
           "DELAYD_REPLICATION_ETCD_ENDPOINTS": "http://127.0.0.1:2379"}
    r = subprocess.run([sys.executable, "-m", "delayd", *base], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "replication_advertise_url must be" in r.stderr, r.stderr
    assert not (tmp_path / "d").exists()  # refused before touching anything
