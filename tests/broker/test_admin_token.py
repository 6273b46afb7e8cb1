"""broker.admin_token: the generated admin token of `--auto-token` (the container's default)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from delayd.broker import admin_token
from delayd.broker.config import Config, ConfigError, Token


def test_off_or_with_configured_tokens_nothing_is_generated(tmp_path: Path) -> None:
    cfg = Config(data_dir=str(tmp_path / "d"))
    assert admin_token.ensure(cfg) == (cfg, None, False)
    mine = dataclasses.replace(cfg, auto_token=True, tokens=(Token("configured-token"),))
    assert admin_token.ensure(mine) == (mine, None, False)
    assert not (tmp_path / "d").exists()


def test_generated_once_owner_only_and_reused(tmp_path: Path) -> None:
    cfg = Config(data_dir=str(tmp_path / "d"), auto_token=True)
    first, path, created = admin_token.ensure(cfg)
    assert created and path == tmp_path / "d" / "admin.token"
    assert path.stat().st_mode & 0o777 == 0o600
    (token,) = first.tokens
    assert token.token == path.read_text().strip() and len(token.token) >= 40
    assert set(token.rights) == {"produce", "consume", "admin"} and token.topics == ("*",)
    again, _, created_again = admin_token.ensure(cfg)
    assert not created_again and again.tokens == first.tokens
    other = admin_token.ensure(Config(data_dir=str(tmp_path / "e"), auto_token=True))[0]
    assert other.tokens[0].token != token.token, "random per data directory"


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    cfg = Config(data_dir=str(tmp_path), auto_token=True)
    (tmp_path / "admin.token").write_text("some-long-token\n")
    (tmp_path / "admin.token").chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        admin_token.ensure(cfg)
    (tmp_path / "admin.token").chmod(0o600)
    assert admin_token.ensure(cfg)[0].tokens[0].token == "some-long-token"
    (tmp_path / "admin.token").write_text("short\n")
    with pytest.raises(ConfigError, match="no usable token"):
        admin_token.ensure(cfg)
