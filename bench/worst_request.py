#!/usr/bin/env python3
"""The worst single requests we can build, against the real daemon (issue 17, item 3).

For each request (msgpack and JSON, built to just under the daemon's request limit): a fresh
daemon (`python -m delayd serve --fsync always`, temp data dir) is warmed up, its peak-RSS mark
is reset (`/proc/PID/clear_refs`), and the request is sent while a second client produces one
message at a time in a loop and 200 messages fall due during it. Reported per request:

  status, seconds to the answer, daemon peak RSS over its idle RSS (/proc/PID/status VmHWM -
  VmRSS before) and that growth / body size (target < 2), the concurrent one-message produces'
  p50 and max latency while the big request was in flight (target max < 50 ms), and how late the
  due messages were released (delivered_at - deliver_at, max).

Plus the time to the answer for a Content-Length over the limit with no body sent (early 413).

    .venv/bin/python bench/worst_request.py                 # all requests, 16 MiB
    .venv/bin/python bench/worst_request.py --only json-nested,msgpack-nested --limit-mib 64
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
JSON = "application/json"
MSGPACK = "application/msgpack"


# -- the requests ---------------------------------------------------------------------------------
def mp_nested_empty_maps(limit: int) -> bytes:
    """The issue's request: arrays of arrays of empty maps (one byte each; 64 bytes as dicts)."""
    inner = b"\xdc\xff\xff" + b"\x80" * 0xFFFF
    n = (limit - 64) // len(inner)
    return b"\x81\xa8messages" + b"\xdd" + struct.pack(">I", n) + inner * n


def mp_nested_at_top(limit: int) -> bytes:
    inner = b"\xdc\xff\xff" + b"\x80" * 0xFFFF
    n = (limit - 64) // len(inner)
    return b"\xdd" + struct.pack(">I", n) + inner * n


def mp_deep_maps(limit: int) -> bytes:
    """Messages whose headers are maps of maps, nested as deep as msgpack goes."""
    one = b"\x81\xa1a" * 900 + b"\xc0"
    msg = b"\x82\xa4body\xa1x\xa7headers" + one
    n = min(10_000, (limit - 64) // len(msg))
    return b"\x81\xa8messages\xdd" + struct.pack(">I", n) + msg * n


def mp_many_values(limit: int) -> bytes:
    """A valid-looking batch whose messages carry 64 headers each: the most values per byte."""
    msg = msgpack.packb({"body": b"x", "headers": {f"{i:02}": f"v{i:02}" for i in range(64)}})
    n = min(10_000, (limit - 64) // len(msg))
    return b"\x81\xa8messages\xdd" + struct.pack(">I", n) + msg * n


def mp_valid_max(limit: int) -> bytes:
    """The largest valid batch: 10,000 messages with bodies filling the limit."""
    per = (limit - 64) // 10_000 - 40
    return msgpack.packb({"messages": [{"body": os.urandom(per), "delay_ms": 3_600_000} for _ in range(10_000)]})


def mp_huge_bin(limit: int) -> bytes:
    return msgpack.packb({"body": b"\x00" * (limit - 64)})


def json_nested_empty(limit: int) -> bytes:
    n = (limit - 64) // 3
    return b'{"messages": [[' + b"{}," * (n - 1) + b"{}]]}"


def json_nested_at_top(limit: int) -> bytes:
    n = (limit - 64) // 3
    return b"[[" + b"{}," * (n - 1) + b"{}]]"


def json_empty_messages(limit: int) -> bytes:
    n = (limit - 64) // 3
    return b'{"messages": [' + b"{}," * (n - 1) + b"{}]}"


def json_many_values(limit: int) -> bytes:
    msg = json.dumps({"body": "x", "headers": {f"{i:02}": f"v{i:02}" for i in range(64)}}).encode()
    n = min(10_000, (limit - 64) // (len(msg) + 1))
    return b'{"messages": [' + b",".join([msg] * n) + b"]}"


def json_valid_max(limit: int) -> bytes:
    per = ((limit - 64) // 10_000 - 60) * 3 // 4
    msgs = [{"body_b64": base64.b64encode(os.urandom(per)).decode(), "delay_ms": 3_600_000} for _ in range(10_000)]
    return json.dumps({"messages": msgs}).encode()


def json_huge_string(limit: int) -> bytes:
    """One message whose body is one string filling the limit, with one astral character (CPython
    then stores the decoded string at 4 bytes per character)."""
    return b'{"body": "\\ud83d\\ude00' + b"a" * (limit - 64) + b'"}'


def json_long_strings(limit: int) -> bytes:
    """Many long strings: values cost little per byte, but every one is copied."""
    s = "x" * 60_000
    msg = json.dumps({"body": "x", "headers": {"a": s[:8000]}, "key": "k" * 256}).encode()
    n = min(10_000, (limit - 64) // (len(msg) + 1))
    return b'{"messages": [' + b",".join([msg] * n) + b"]}"


REQUESTS: dict[str, tuple[str, Callable[[int], bytes]]] = {
    "msgpack-nested": (MSGPACK, mp_nested_empty_maps),
    "msgpack-nested-top": (MSGPACK, mp_nested_at_top),
    "msgpack-deep-maps": (MSGPACK, mp_deep_maps),
    "msgpack-64-headers": (MSGPACK, mp_many_values),
    "msgpack-huge-bin": (MSGPACK, mp_huge_bin),
    "msgpack-valid-max": (MSGPACK, mp_valid_max),
    "json-nested": (JSON, json_nested_empty),
    "json-nested-top": (JSON, json_nested_at_top),
    "json-empty-messages": (JSON, json_empty_messages),
    "json-64-headers": (JSON, json_many_values),
    "json-huge-string": (JSON, json_huge_string),
    "json-long-strings": (JSON, json_long_strings),
    "json-valid-max": (JSON, json_valid_max),
}


# -- the daemon -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) * 1024
    return out


class Daemon:
    def __init__(self, tmp: Path, config: str) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(dir=tmp))
        (self.dir / "c.toml").write_text(config)
        self.log = open(self.dir / "log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "delayd", "serve", "--data-dir", str(self.dir / "data"), "--listen",
             f"127.0.0.1:{self.port}", "--fsync", "always", "--config", str(self.dir / "c.toml")],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError((self.dir / "log").read_text())
            time.sleep(0.05)

    def conn(self, timeout_s: float = 120) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)

    def call(self, method: str, path: str, body: bytes | None = None, ctype: str = JSON,
             conn: http.client.HTTPConnection | None = None) -> tuple[int, bytes]:
        c = conn or self.conn()
        c.request(method, path, body=body, headers={"Content-Type": ctype} if body is not None else {})
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        return r.status, data

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- one measurement ------------------------------------------------------------------------------
def run_one(tmp: Path, config: str, name: str, ctype: str, body: bytes) -> dict[str, Any]:
    d = Daemon(tmp, config)
    try:
        probe = d.conn()
        for _ in range(50):  # warm up every path the probe takes
            d.call("POST", "/v1/topics/probe/messages", b'{"body": "x"}', conn=probe)
        due_base = int(time.time() * 1000) + 400
        d.call("POST", "/v1/topics/due/messages", json.dumps({"messages": [
            {"body": "d", "deliver_at": due_base + i * 10} for i in range(200)]}).encode())
        idle = proc_status(d.proc.pid)["VmRSS"]
        Path(f"/proc/{d.proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        lat: list[tuple[float, float]] = []
        stop = threading.Event()

        def producer() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                status, _ = d.call("POST", "/v1/topics/probe/messages", b'{"body": "x"}', conn=probe)
                assert status == 200, status
                lat.append((t0, time.perf_counter() - t0))
                time.sleep(0.002)

        t = threading.Thread(target=producer, daemon=True)
        t.start()
        time.sleep(0.2)
        t0 = time.perf_counter()
        status, answer = d.call("POST", "/v1/topics/big/messages", body, ctype)
        t1 = time.perf_counter()
        time.sleep(0.05)
        stop.set()
        t.join()
        peak = proc_status(d.proc.pid)["VmHWM"]
        during = [s for start, s in lat if start + s >= t0 and start <= t1]
        released = []
        while len(released) < 200:
            _, raw = d.call("POST", "/v1/topics/due/subscriptions/g/pull",
                            b'{"max": 1000, "wait_ms": 3000}')
            got = json.loads(raw)["messages"]
            if not got:
                break
            released += [m["delivered_at"] - m["deliver_at"] for m in got]
        try:
            code = (msgpack.unpackb(answer) if ctype == MSGPACK else json.loads(answer))
            code = code["error"]["code"] if "error" in code else f"{len(code['messages'])} stored"
        except Exception:  # noqa: BLE001 - whatever came back, show its start
            code = answer[:60]
        return {"request": name, "body_bytes": len(body), "status": status, "answer": code,
                "seconds": round(t1 - t0, 3), "idle_rss": idle, "peak_growth": peak - idle,
                "growth_per_body_byte": round((peak - idle) / len(body), 2),
                "produce_during": len(during),
                "produce_p50_ms": round(statistics.median(s for s in during) * 1000, 1) if during else None,
                "produce_max_ms": round(max(during) * 1000, 1) if during else None,
                "release_late_max_ms": max(released) if released else None}
    finally:
        d.stop()


def early_413(tmp: Path, config: str, length: int) -> float:
    d = Daemon(tmp, config)
    try:
        with socket.create_connection(("127.0.0.1", d.port), timeout=30) as s:
            t0 = time.perf_counter()
            s.sendall(b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % length)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            took = time.perf_counter() - t0
            line = data.split(b"\r\n", 1)[0].decode()
            print(f"  Content-Length {length:,} and no body: {line!r} after {took * 1000:.1f} ms")
            return took
    except TimeoutError:
        print(f"  Content-Length {length:,} and no body: no answer within 30 s")
        return float("inf")
    finally:
        d.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit-mib", type=float, default=16.0, help="request size to build (the daemon's limit)")
    ap.add_argument("--only", default="", help="comma-separated request names: " + ",".join(REQUESTS))
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    limit = int(args.limit_mib * MIB)
    config = f"max_request_bytes = {limit}\n"
    names = [n for n in args.only.split(",") if n] or list(REQUESTS)
    tmp = Path(tempfile.mkdtemp(prefix="delayd-worst-"))
    rows = []
    try:
        print(f"requests built to {limit:,} bytes; daemon config: {config.strip()}")
        for name in names:
            ctype, build = REQUESTS[name]
            row = run_one(tmp, config, name, ctype, build(limit))
            rows.append(row)
            print(f"{name:22} {row['body_bytes'] / MIB:6.1f} MiB -> {row['status']} {str(row['answer'])[:28]:28} "
                  f"in {row['seconds']:7.3f} s | RSS +{row['peak_growth'] / MIB:7.1f} MiB "
                  f"({row['growth_per_body_byte']:5.2f}x body, idle {row['idle_rss'] / MIB:.0f} MiB) | "
                  f"produce meanwhile: n={row['produce_during']} p50 {row['produce_p50_ms']} ms "
                  f"max {row['produce_max_ms']} ms | release late max {row['release_late_max_ms']} ms",
                  flush=True)
        early_413(tmp, config, 70_000_000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
