#!/usr/bin/env bash
# System packages the test suite uses. Idempotent; skips what is already there.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# The benchmark's smoke test (tests/bench) runs a real Redis next to the daemon.
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# The web console's browser tests (tests/integration/test_console.py) drive Debian's chromium
# through Playwright's own driver; `playwright install` (a download from a CDN) is never used.
[ -x /usr/bin/chromium ] || need+=(chromium)
# Replication coordination tests (tests/broker/test_coord.py) run a real etcd.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
