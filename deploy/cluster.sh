#!/usr/bin/env bash
# A local delayd cluster as plain processes: the same topology as deploy/docker-compose.yml, without
# Docker. Two modes (DELAYD_CLUSTER_MODE):
#
#   replicas (default)  etcd on 127.0.0.1:2379, and ONE replicated shard s0 of three members s0-a,
#                       s0-b, s0-c on 127.0.0.1:7071-7073 (docs/replication.md). Why one shard of
#                       three rather than three: see the header of docker-compose.yml (nine daemons
#                       plus etcd are more than a 2-core machine bears).
#   shards              three unreplicated shards s0 s1 s2 on 127.0.0.1:7071-7073 (no etcd).
#
#   deploy/cluster.sh start     # start everything, wait for /readyz on each daemon
#   deploy/cluster.sh status    # pid, URL and readiness of each process
#   deploy/cluster.sh stop      # SIGTERM the daemons, then etcd; SIGKILL what is left after the timeout
#   deploy/cluster.sh restart
#   deploy/cluster.sh plan      # print what start runs: each command with its replication environment
#
# start and stop are idempotent: a process that is already running (per its pid file, checked
# against the process's command line so a recycled pid is never mistaken for it) is left alone;
# stopping a stopped cluster is a no-op. Layout under $DELAYD_CLUSTER_DIR (default ./cluster-data
# at the repository root):
#   s0-a/      a daemon's data directory (--data-dir; named after its node id in shards mode)
#   s0-a.log   its stdout+stderr (appended across restarts)
#   s0-a.pid   its pid while running
#   etcd/  etcd.log  etcd.pid   the same for etcd (replicas mode)
#
# Clients are given every member's URL; the SDK groups URLs by node id and follows the primary:
#   delayd cluster --url http://127.0.0.1:7071,http://127.0.0.1:7072,http://127.0.0.1:7073
#
# Environment (all optional):
#   DELAYD_CLUSTER_MODE      replicas | shards                  (default replicas)
#   DELAYD_CLUSTER_DIR       data/log/pid directory             (default <repo>/cluster-data)
#   DELAYD_CLUSTER_NODES     shards mode: node ids              (default "s0 s1 s2")
#   DELAYD_CLUSTER_SHARD     replicas mode: the shard's node id (default s0)
#   DELAYD_CLUSTER_MEMBERS   replicas mode: member names        (default "s0-a s0-b s0-c")
#   DELAYD_CLUSTER_PORTS     one port per node or member        (default "7071 7072 7073")
#   DELAYD_CLUSTER_HOST      listen address                     (default 127.0.0.1)
#   DELAYD_CLUSTER_FSYNC     always|interval|never              (default always)
#   DELAYD_CLUSTER_ARGS      extra `delayd serve` arguments, e.g. "--config /etc/delayd.toml"
#   DELAYD_CLUSTER_TIMEOUT   seconds to wait for /readyz        (default 60)
#   DELAYD_CLUSTER_STOP_TIMEOUT  seconds to wait after SIGTERM  (default 30)
#   DELAYD_CLUSTER_ETCD_PORT, DELAYD_CLUSTER_ETCD_PEER_PORT  replicas mode (default 2379, 2380)
#   DELAYD_CLUSTER_MIN_INSYNC    replication_min_insync         (default 2)
#   DELAYD_CLUSTER_LEASE_TTL_MS  replication_lease_ttl_ms       (default 3000)
#   DELAYD_ETCD              the etcd binary (Debian's etcd-server)  (default: etcd on PATH)
#   DELAYD_PYTHON            interpreter with delayd installed  (default <repo>/.venv/bin/python)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${DELAYD_CLUSTER_DIR:-$ROOT/cluster-data}"
MODE="${DELAYD_CLUSTER_MODE:-replicas}"
SHARD="${DELAYD_CLUSTER_SHARD:-s0}"
# NODES: the daemons by name (data dir, log, pid file); node_id gives each one's node id.
case "$MODE" in
    shards) read -r -a NODES <<<"${DELAYD_CLUSTER_NODES:-s0 s1 s2}" ;;
    replicas) read -r -a NODES <<<"${DELAYD_CLUSTER_MEMBERS:-$SHARD-a $SHARD-b $SHARD-c}" ;;
    *) printf 'cluster: DELAYD_CLUSTER_MODE must be replicas or shards, not %s\n' "$MODE" >&2; exit 2 ;;
esac
read -r -a PORTS <<<"${DELAYD_CLUSTER_PORTS:-7071 7072 7073}"
ETCD_PORT="${DELAYD_CLUSTER_ETCD_PORT:-2379}"
ETCD_PEER_PORT="${DELAYD_CLUSTER_ETCD_PEER_PORT:-2380}"
MIN_INSYNC="${DELAYD_CLUSTER_MIN_INSYNC:-2}"
LEASE_TTL_MS="${DELAYD_CLUSTER_LEASE_TTL_MS:-3000}"
ETCD_BIN="${DELAYD_ETCD:-etcd}"
HOST="${DELAYD_CLUSTER_HOST:-127.0.0.1}"
FSYNC="${DELAYD_CLUSTER_FSYNC:-always}"
read -r -a EXTRA <<<"${DELAYD_CLUSTER_ARGS:-}"
READY_TIMEOUT="${DELAYD_CLUSTER_TIMEOUT:-60}"
STOP_TIMEOUT="${DELAYD_CLUSTER_STOP_TIMEOUT:-30}"
if [[ -n "${DELAYD_PYTHON:-}" ]]; then PY="$DELAYD_PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"
else PY="python3"; fi

die() { printf 'cluster: %s\n' "$*" >&2; exit 1; }
say() { printf 'cluster: %s\n' "$*"; }

[[ ${#NODES[@]} -eq ${#PORTS[@]} ]] || die "DELAYD_CLUSTER_NODES has ${#NODES[@]} ids but DELAYD_CLUSTER_PORTS has ${#PORTS[@]} ports"
[[ "$FSYNC" =~ ^(always|interval|never)$ ]] || die "DELAYD_CLUSTER_FSYNC must be always, interval or never"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
"$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null \
    || die "$PY is not a working Python >= 3.11 (set DELAYD_PYTHON, or run 'make install')"

pidfile() { echo "$DIR/$1.pid"; }
logfile() { echo "$DIR/$1.log"; }
datadir() { echo "$DIR/$1"; }
url_host() { if [[ "$HOST" == "0.0.0.0" ]]; then echo 127.0.0.1; else echo "$HOST"; fi; }
node_id() { if [[ "$MODE" == replicas ]]; then echo "$SHARD"; else echo "$1"; fi; }
etcd_url() { echo "http://$(url_host):$ETCD_PORT"; }

# replication_env NAME PORT: the member's replication settings, one NAME=VALUE a line, as
# `delayd serve` reads them from the environment (broker/config.py); nothing in shards mode.
replication_env() {
    [[ "$MODE" == replicas ]] || return 0
    printf '%s\n' "DELAYD_REPLICATION_ENABLED=true" "DELAYD_REPLICATION_MEMBER=$1" \
        "DELAYD_REPLICATION_ADVERTISE_URL=http://$(url_host):$2" \
        "DELAYD_REPLICATION_ETCD_ENDPOINTS=$(etcd_url)" \
        "DELAYD_REPLICATION_LEASE_TTL_MS=$LEASE_TTL_MS" "DELAYD_REPLICATION_MIN_INSYNC=$MIN_INSYNC"
}

# etcd_command: one argument a line. A single etcd member on loopback with its default raft
# timings (the shortest lease it grants is then 2 s; members ask for LEASE_TTL_MS).
etcd_command() {
    local peer
    peer="http://$(url_host):$ETCD_PEER_PORT"
    printf '%s\n' "$ETCD_BIN" --name cluster-etcd --data-dir "$(datadir etcd)" \
        --listen-client-urls "$(etcd_url)" --advertise-client-urls "$(etcd_url)" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "cluster-etcd=$peer" --initial-cluster-state new \
        --logger zap --log-outputs stderr --log-level warn
}

# The process's state letter ("" if gone). A zombie (Z) counts as gone: when no init reaps
# orphans (some containers), an exited daemon lingers as a zombie that `kill -0` still finds.
proc_state() { ps -o stat= -p "$1" 2>/dev/null | cut -c1 || true; }
alive() { local s; s="$(proc_state "$1")"; [[ -n "$s" && "$s" != "Z" ]]; }

# The pid of node $1 if its pid file names a live delayd process serving that node's data dir.
running_pid() {
    local node="$1" pf pid args
    pf="$(pidfile "$node")"
    [[ -f "$pf" ]] || return 1
    pid="$(tr -dc '0-9' <"$pf")"
    [[ -n "$pid" ]] && alive "$pid" || return 1
    args="$(ps -ww -o args= -p "$pid" 2>/dev/null || true)"
    if [[ "$node" == etcd ]]; then
        [[ "$args" == *etcd* ]] || return 1
    else
        [[ "$args" == *"broker serve"* || "$args" == *"delayd serve"* ]] || return 1
    fi
    [[ "$args" == *"--data-dir $(datadir "$node")"* ]] || return 1
    echo "$pid"
}

port_free() {
    "$PY" - "$HOST" "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemon does: TIME_WAIT is fine
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError:
    sys.exit(1)
finally:
    s.close()
EOF
}

# wait_ready DEADLINE_S NODE PORT PID [NODE PORT PID ...]: poll /readyz of each until 200;
# fail fast (with the log tail) if a process exits, or at the deadline.
wait_ready() {
    "$PY" - "$DIR" "$(url_host)" "$@" <<'EOF'
import os, subprocess, sys, time, urllib.error, urllib.request
d, host, timeout, rest = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
pending = {rest[i]: (rest[i + 1], int(rest[i + 2])) for i in range(0, len(rest), 3)}
def alive(pid):
    r = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip()[:1] not in ("", "Z")
def tail(node):
    try:
        with open(os.path.join(d, node + ".log"), errors="replace") as f:
            return "".join(f.readlines()[-30:])
    except FileNotFoundError:
        return "(no log)"
deadline = time.monotonic() + timeout
while pending:
    for node, (port, pid) in list(pending.items()):
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    print(f"cluster: {node} ready at http://{host}:{port} (pid {pid})")
                    del pending[node]
                    continue
        except (urllib.error.URLError, OSError):
            pass
        if not alive(pid):
            sys.stderr.write(f"cluster: {node} (pid {pid}) exited before it was ready; "
                             f"last lines of {d}/{node}.log:\n{tail(node)}\n")
            sys.exit(1)
    if pending and time.monotonic() > deadline:
        sys.stderr.write(f"cluster: not ready after {timeout:g}s: {', '.join(sorted(pending))}\n")
        for node in sorted(pending):
            sys.stderr.write(f"--- {d}/{node}.log ---\n{tail(node)}\n")
        sys.exit(1)
    time.sleep(0.05)
EOF
}

etcd_healthy() {
    "$PY" - "$(etcd_url)/health" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=1) as r:
        sys.exit(0 if b'"health":"true"' in r.read() else 1)
except OSError:
    sys.exit(1)
EOF
}

# start_etcd: replicas mode; idempotent like the daemons. Sets ETCD_STARTED to the pid it started.
ETCD_STARTED=""
start_etcd() {
    local pid deadline cmd=()
    if pid="$(running_pid etcd)"; then
        say "etcd already running (pid $pid)"
        return 0
    fi
    command -v "$ETCD_BIN" >/dev/null \
        || die "no etcd binary '$ETCD_BIN' (Debian: apt-get install etcd-server; or set DELAYD_ETCD)"
    rm -f "$(pidfile etcd)"
    port_free "$ETCD_PORT" || die "port $HOST:$ETCD_PORT for etcd is in use by another process"
    port_free "$ETCD_PEER_PORT" || die "port $HOST:$ETCD_PEER_PORT for etcd's peers is in use by another process"
    mkdir -p "$(datadir etcd)"
    mapfile -t cmd < <(etcd_command)
    printf '\n=== etcd start %s ===\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$(logfile etcd)"
    setsid "${cmd[@]}" >>"$(logfile etcd)" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$(pidfile etcd)"
    ETCD_STARTED="$pid"
    say "etcd starting: pid $pid, $(etcd_url), data $(datadir etcd)"
    deadline=$((SECONDS + READY_TIMEOUT))
    until etcd_healthy; do
        if ! alive "$pid" || (( SECONDS >= deadline )); then
            tail -n 20 "$(logfile etcd)" >&2 || true
            abort_start "etcd did not become healthy at $(etcd_url)" "$pid"
        fi
        sleep 0.05
    done
    say "etcd ready at $(etcd_url) (pid $pid)"
}

# stop_pids PID...: SIGTERM, then poll until all exit; SIGKILL what is left after STOP_TIMEOUT.
stop_pids() {
    local pid left deadline rc=0
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    deadline=$((SECONDS + STOP_TIMEOUT))
    while :; do
        left=()
        for pid in "$@"; do alive "$pid" && left+=("$pid"); done
        [[ ${#left[@]} -eq 0 ]] && break
        if (( SECONDS >= deadline )); then
            printf 'cluster: pid(s) %s still running %ss after SIGTERM; sending SIGKILL\n' "${left[*]}" "$STOP_TIMEOUT" >&2
            for pid in "${left[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
            rc=1
            break
        fi
        sleep 0.05
    done
    return $rc
}

# abort_start MESSAGE [PID...]: stop the shards this call started, drop their pid files, fail.
abort_start() {
    local msg="$1" node; shift
    if [[ $# -gt 0 ]]; then stop_pids "$@" || true; msg="$msg (the processes started by this call were stopped)"; fi
    for node in "${NODES[@]}" etcd; do running_pid "$node" >/dev/null || rm -f "$(pidfile "$node")"; done
    die "$msg"
}

cmd_start() {
    local i node port pid started=() waits=() env=()
    if [[ "$MODE" == replicas ]]; then
        start_etcd
        if [[ -n "$ETCD_STARTED" ]]; then started+=("$ETCD_STARTED"); fi
    fi
    for i in "${!NODES[@]}"; do
        node="${NODES[$i]}"; port="${PORTS[$i]}"
        if pid="$(running_pid "$node")"; then
            say "$node already running (pid $pid)"
            waits+=("$node" "$port" "$pid")
            continue
        fi
        rm -f "$(pidfile "$node")"
        if ! port_free "$port"; then
            abort_start "port $HOST:$port for $node is in use by another process" ${started[@]+"${started[@]}"}
        fi
        mkdir -p "$(datadir "$node")"
        printf '\n=== %s start %s ===\n' "$node" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$(logfile "$node")"
        # setsid: own session, so the shard outlives this script and ignores the terminal's ^C.
        mapfile -t env < <(replication_env "$node" "$port")
        env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ${env[@]+"${env[@]}"} \
            setsid "$PY" -m delayd serve --data-dir "$(datadir "$node")" --listen "$HOST:$port" \
            --fsync "$FSYNC" --node-id "$(node_id "$node")" ${EXTRA[@]+"${EXTRA[@]}"} \
            >>"$(logfile "$node")" 2>&1 </dev/null &
        pid=$!
        echo "$pid" >"$(pidfile "$node")"
        started+=("$pid")
        say "$node starting: pid $pid, http://$(url_host):$port, node id $(node_id "$node"), data $(datadir "$node")"
        waits+=("$node" "$port" "$pid")
    done
    wait_ready "$READY_TIMEOUT" "${waits[@]}" \
        || abort_start "start failed" ${started[@]+"${started[@]}"}
}

cmd_stop() {
    local node pid pids=() rc=0
    for node in "${NODES[@]}"; do
        if pid="$(running_pid "$node")"; then
            say "stopping $node (pid $pid)"
            pids+=("$pid")
        else
            [[ -f "$(pidfile "$node")" ]] && say "$node not running (removing stale pid file)"
        fi
    done
    if [[ ${#pids[@]} -gt 0 ]]; then stop_pids "${pids[@]}" || rc=1; fi
    for node in "${NODES[@]}"; do rm -f "$(pidfile "$node")"; done
    # etcd last: a primary that shuts down revokes its lease there (docs/replication.md).
    if pid="$(running_pid etcd)"; then
        say "stopping etcd (pid $pid)"
        stop_pids "$pid" || rc=1
    fi
    rm -f "$(pidfile etcd)"
    if [[ $rc -ne 0 ]]; then die "some processes had to be killed (see above)"; fi
    say "stopped"
}

cmd_status() {
    local i node port pid code rc=0
    for i in "${!NODES[@]}"; do
        node="${NODES[$i]}"; port="${PORTS[$i]}"
        if pid="$(running_pid "$node")"; then
            code="$("$PY" -c 'import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=2).status)
except Exception as e:
    print(getattr(e, "code", "down"))' "http://$(url_host):$port/readyz")"
            say "$node running  pid $pid  http://$(url_host):$port  node $(node_id "$node")  readyz=$code"
            [[ "$code" == 200 ]] || rc=1
        else
            say "$node stopped"
            rc=1
        fi
    done
    if [[ "$MODE" == replicas ]]; then
        if pid="$(running_pid etcd)"; then
            if etcd_healthy; then code=healthy; else code=unhealthy; rc=1; fi
            say "etcd running  pid $pid  $(etcd_url)  $code"
        else
            say "etcd stopped"
            rc=1
        fi
    fi
    return $rc
}

# plan: what start runs, one process a line: its name, then its environment (NAME=VALUE) and
# command, shell-quoted.
cmd_plan() {
    local i node port args=()
    if [[ "$MODE" == replicas ]]; then
        mapfile -t args < <(etcd_command)
        printf 'etcd'; printf ' %q' "${args[@]}"; printf '\n'
    fi
    for i in "${!NODES[@]}"; do
        node="${NODES[$i]}"; port="${PORTS[$i]}"
        mapfile -t args < <(replication_env "$node" "$port")
        args+=("$PY" -m delayd serve --data-dir "$(datadir "$node")" --listen "$HOST:$port" --fsync "$FSYNC"
               --node-id "$(node_id "$node")" ${EXTRA[@]+"${EXTRA[@]}"})
        printf '%s' "$node"; printf ' %q' "${args[@]}"; printf '\n'
    done
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_stop; cmd_start ;;
    status) cmd_status ;;
    plan) cmd_plan ;;
    *) echo "usage: $0 start|stop|restart|status|plan  (see the header for the environment)" >&2; exit 2 ;;
esac
