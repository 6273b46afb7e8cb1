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
