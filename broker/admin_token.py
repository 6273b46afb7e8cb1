"""`--auto-token`: a daemon started without tokens serves with a generated admin token instead.

This is the container image's default: `docker run` of the image listens on 0.0.0.0, where a
daemon without tokens would refuse to start (or, with `--insecure`, let anyone in). With
`--auto-token` and no `[[auth.tokens]]` configured, the first start writes a random token to
`<data_dir>/admin.token` (mode 0600, created exclusively) and every later start reads it back, so
the token survives restarts and lives with the data it protects. The log names the file, never
the token. Configured tokens always win: then nothing is generated or read.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import stat
from pathlib import Path

from delayd.broker.config import RIGHTS, Config, ConfigError, Token

TOKEN_FILE = "admin.token"
TOKEN_BYTES = 32  # 256 bits of randomness, 43 URL-safe characters
OWNER_ONLY = 0o600


def ensure(cfg: Config) -> tuple[Config, Path | None, bool]:
    """(config with the token, the token file, whether it was created now). Unchanged config and
    no file when auto tokens are off or tokens are configured."""
    if not cfg.auto_token or cfg.tokens:
        return cfg, None, False
    data_dir = Path(cfg.data_dir)
    path = data_dir / TOKEN_FILE
    created = False
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, OWNER_ONLY)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(TOKEN_BYTES) + "\n")
                f.flush()
                os.fsync(f.fileno())
            created = True
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(f"{path} is readable by others (mode {mode:04o}); chmod 600 it")
        token = path.read_text().strip()
    except OSError as e:
        raise ConfigError(f"cannot create or read the admin token file {path}: {e}") from e
    if len(token) < 8:
        raise ConfigError(f"{path} holds no usable token (at least 8 characters); delete it to generate one")
    return dataclasses.replace(cfg, tokens=(Token(token, RIGHTS, ("*",)),)).validate(), path, created
