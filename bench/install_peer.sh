#!/usr/bin/env bash
# Install the peer used by `python -m bench.daemon_vs_redis`: Debian's redis-server, plus the
# Python packages the benchmark needs (redis-py, psutil) into the project venv.
# Idempotent: does nothing that is already done.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

if ! command -v redis-server >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y redis-server
    # The package may start a system instance; the benchmark starts its own, on its own port.
fi

if [ ! -x "$PY" ]; then
    echo "no virtualenv at $VENV (run 'make install' first)" >&2
    exit 1
fi
if ! "$PY" -c 'import redis, psutil, hiredis' >/dev/null 2>&1; then
    "$PY" -m pip install -q 'redis>=5' 'hiredis>=2' 'psutil>=5.9'
fi
echo "redis-server: $(redis-server --version)"
"$PY" -c 'import redis, psutil, hiredis; print("redis-py", redis.__version__, "hiredis", hiredis.__version__, "psutil", psutil.__version__)'
