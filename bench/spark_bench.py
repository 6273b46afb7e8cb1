#!/usr/bin/env python3
"""Spark connector throughput (issue 8): rows/s scheduled from Spark, records/s read from the files.

Starts the real daemon (`python -m delayd serve`, fresh temp data dir, `--fsync always`, an optional
`segment_bytes`) and a local SparkSession (`local[2]` by default), then

  write   N rows (100-byte bodies, delays spread over 1-48 h, a key per row unless --no-keys) with
          `df.write.format("delayd")` -> rows/s, after a small warm-up write on another topic
  read    the daemon's commit log, topped up to R records, with `spark.read.format("delayd")` while
          the daemon keeps running -> records/s for a full scan (count) and for an aggregation
          (per topic and record type: count, sum(body_size), min/max(deliver_at)), best of --runs

    .venv/bin/python -m bench.spark_bench                                  # 200k write, 1M read
    .venv/bin/python -m bench.spark_bench --rows 200000 --read-records 2000000 --segment-mib 16
    .venv/bin/python -m bench.spark_bench --no-verify                      # read without CRC checks

Prints one line per measurement and a JSON summary (also written to --json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def start_daemon(data_dir: Path, port: int, fsync: str, segment_mib: int | None) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "delayd",
        "serve",
        "--data-dir",
        str(data_dir),
        "--listen",
        f"127.0.0.1:{port}",
        "--fsync",
        fsync,
    ]
    if segment_mib:
        cfg = data_dir.parent / "delayd.toml"
        cfg.write_text(f"segment_bytes = {segment_mib * 1024 * 1024}\n")
        cmd += ["--config", str(cfg)]
    log = open(data_dir.parent / "daemon.log", "ab")  # noqa: SIM115 - handed to the child
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}; see {data_dir.parent / 'daemon.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("daemon not ready within 60 s")
        time.sleep(0.05)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and all its descendants, including reaped children (psutil)."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMeter:
    """CPU seconds used by the daemon and by Spark (driver JVM and its Python workers) over a phase."""

    def __init__(self, daemon_pid: int, spark_pid: int) -> None:
        self.pids = {"daemon": daemon_pid, "spark": spark_pid}

    def __enter__(self) -> CpuMeter:
        self.start = {k: tree_cpu_s(p) for k, p in self.pids.items()}
        self.start["bench"] = own_cpu_s()
        self.machine0 = machine_busy_s()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.used = {k: tree_cpu_s(p) - self.start[k] for k, p in self.pids.items()}
        busy = machine_busy_s() - self.machine0
        ours = sum(self.used.values()) + own_cpu_s() - self.start["bench"]
        self.others_share = max(0.0, busy - ours) / (self.wall * (os.cpu_count() or 1))

    def summary(self, n: int) -> dict[str, float]:
        out: dict[str, float] = {"wall_s": round(self.wall, 3), "others_cpu_share": round(self.others_share, 3)}
        for k, v in self.used.items():
            out[f"{k}_cpu_s"] = round(v, 2)
            out[f"{k}_cpu_us_per_item"] = round(v / n * 1e6, 2)
        return out


def machine_busy_s() -> float:
    import psutil

    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq + t.steal)


def own_cpu_s() -> float:
    """This (driver) process, without its children (the JVM is measured as the Spark tree)."""
    import psutil

    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


def rows_df(spark: Any, n: int, first: int, keys: bool, tag: str) -> Any:
    from pyspark.sql import functions as F

    df = spark.range(first, first + n, numPartitions=spark.sparkContext.defaultParallelism)
    cols = [
        # 100-byte bodies
        F.rpad(F.concat(F.lit("order "), F.col("id").cast("string"), F.lit(" close-if-unpaid ")), 100, "x")
        .cast("binary")
        .alias("body"),
        (F.lit(3_600_000) + (F.col("id") * 7919) % (47 * 3_600_000)).alias("delay_ms"),
        F.lit(tag).alias("tag"),
    ]
    if keys:
        cols.append(F.concat(F.lit("order-"), F.col("id").cast("string")).alias("key"))
    return df.select(*cols)


def daemon_alone(url: str, daemon_pid: int, n: int, keys: bool, batch: int) -> dict[str, Any]:
    """The same rows produced by a bare client (pre-encoded msgpack, 2 connections): the daemon's ceiling."""
    import http.client
    import threading

    import msgpack

    u = url.split("//", 1)[1]
    host, port = u.split(":")
    payloads = []
    for lo in range(0, n, batch):
        msgs = []
        for i in range(lo, min(lo + batch, n)):
            m: dict[str, Any] = {"body": f"order {i} close-if-unpaid ".ljust(100, "x").encode(),
                                 "delay_ms": 3_600_000 + (i * 7919) % (47 * 3_600_000), "tag": "bench"}
            if keys:
                m["key"] = f"alone-{i}"
            msgs.append(m)
        payloads.append(msgpack.packb({"messages": msgs}, use_bin_type=True))

    def send(mine: list[bytes]) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=300)
        for p in mine:
            conn.request("POST", "/v1/topics/bench.alone/messages", p, {"Content-Type": "application/msgpack"})
            r = conn.getresponse()
            r.read()
            assert r.status == 200, r.status
        conn.close()

    threads = [threading.Thread(target=send, args=(payloads[i::2],)) for i in range(2)]
    c0, t0 = tree_cpu_s(daemon_pid), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, tree_cpu_s(daemon_pid) - c0
    return {"rows": n, "seconds": round(wall, 3), "rows_per_s": round(n / wall),
            "daemon_cpu_s": round(cpu, 2), "daemon_cpu_us_per_row": round(cpu / n * 1e6, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000, help="rows in the measured write")
    ap.add_argument("--read-records", type=int, default=1_000_000, help="commit-log records to read")
    ap.add_argument("--no-keys", action="store_true", help="write rows without keys")
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--fsync", default="always", choices=["always", "interval", "never"])
    ap.add_argument("--segment-mib", type=int, default=None, help="daemon segment_bytes in MiB (default 64)")
    ap.add_argument("--no-verify", action="store_true", help="read without checking record CRCs")
    ap.add_argument("--runs", type=int, default=3, help="read runs (the best is reported)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip producing the rows with a bare client")
    ap.add_argument("--keep-dir", action="store_true")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "spark_bench.json"))
    args = ap.parse_args()

    os.environ.update({"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable})
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from delayd.spark import register, write

    tmp = Path(tempfile.mkdtemp(prefix="delayd-spark-bench-"))
    data_dir = tmp / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_daemon(data_dir, port, args.fsync, args.segment_mib)
    spark = None
    result: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", "-m", "bench.spark_bench", *sys.argv[1:]]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_before": os.getloadavg(),
        },
    }
    try:
        spark = (
            SparkSession.builder.master(args.master)
            .appName("delayd-spark-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        import pyspark

        result["versions"] = {
            "pyspark": pyspark.__version__,
            "java": subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[
                0
            ],
        }
        register(spark)
        keys = not args.no_keys

        # -- write ----------------------------------------------------------------------------
        spark_pid = SparkContext._gateway.proc.pid  # the driver JVM; Python workers are its children
        write(rows_df(spark, 10_000, 0, keys, "warmup"), url, "bench.warmup", batch_size=args.batch_size)
        before = get_json(url + "/v1/stats")
        df = rows_df(spark, args.rows, 0, keys, "bench")
        with CpuMeter(proc.pid, spark_pid) as cpu:
            rep = write(df, url, "bench.orders", batch_size=args.batch_size)
        dt = cpu.wall
        after = get_json(url + "/v1/stats")
        result["write"] = {"rows": args.rows, "keys": keys, "batch_size": args.batch_size, "seconds": round(dt, 3),
                           "rows_per_s": round(args.rows / dt), "report": rep.__dict__,
                           "broker_produced": after["produced_total"] - before["produced_total"],
                           "cpu": cpu.summary(args.rows)}
        print(f"write: {args.rows} rows in {dt:.2f} s = {args.rows / dt:,.0f} rows/s "
              f"(keys={keys}, batch {args.batch_size}, {rep.requests} requests, {rep.retries} retries); "
              f"CPU per row: daemon {cpu.used['daemon'] / args.rows * 1e6:.1f} us, "
              f"Spark {cpu.used['spark'] / args.rows * 1e6:.1f} us; other processes "
              f"{cpu.others_share:.0%} of the CPUs", flush=True)
        assert rep.scheduled == args.rows, rep
        if not args.no_ceiling:
            result["daemon_alone"] = daemon_alone(url, proc.pid, args.rows, keys, args.batch_size)
            c = result["daemon_alone"]
            print(f"daemon alone (pre-encoded msgpack, 2 connections, same rows): {c['rows_per_s']:,} rows/s; "
                  f"daemon CPU {c['daemon_cpu_us_per_row']} us/row", flush=True)

        # -- top up and read ------------------------------------------------------------------
        have = get_json(url + "/v1/stats")["produced_total"]
        if have < args.read_records:
            t0 = time.perf_counter()
            write(
                rows_df(spark, args.read_records - have, 10_000_000, False, "fill"),
                url,
                "bench.fill",
                batch_size=10_000,
            )
            print(f"(filled to {args.read_records} records in {time.perf_counter() - t0:.1f} s)", flush=True)
        segs = sorted((data_dir / "commitlog").iterdir())
        result["read"] = {
            "segments": len(segs),
            "bytes": sum(p.stat().st_size for p in segs),
            "verify": not args.no_verify,
            "runs": [],
        }
        for run in range(args.runs):
            rd = spark.read.format("delayd").option("verify", str(not args.no_verify).lower()).load(str(data_dir))
            with CpuMeter(proc.pid, spark_pid) as c1:
                n = rd.count()
            with CpuMeter(proc.pid, spark_pid) as c2:
                agg = (rd.groupBy("topic", "record_type")
                       .agg(F.count("*").alias("n"), F.sum("body_size"), F.min("deliver_at"), F.max("deliver_at"))
                       .collect())
            total = sum(r["n"] for r in agg)
            assert total == n, (total, n)
            result["read"]["runs"].append({"records": n, "count_s": round(c1.wall, 3), "agg_s": round(c2.wall, 3),
                                           "count_per_s": round(n / c1.wall), "agg_per_s": round(n / c2.wall),
                                           "count_cpu": c1.summary(n), "agg_cpu": c2.summary(n)})
            print(f"read run {run + 1}: {n} records, {len(segs)} segments; count {c1.wall:.2f} s = "
                  f"{n / c1.wall:,.0f}/s (Spark CPU {c1.used['spark'] / n * 1e6:.2f} us/record); aggregation "
                  f"{c2.wall:.2f} s = {n / c2.wall:,.0f}/s (Spark CPU {c2.used['spark'] / n * 1e6:.2f} us/record); "
                  f"other processes {max(c1.others_share, c2.others_share):.0%} of the CPUs", flush=True)
        runs = result["read"]["runs"]
        result["read"]["best_count_per_s"] = max(r["count_per_s"] for r in runs)
        result["read"]["best_agg_per_s"] = max(r["agg_per_s"] for r in runs)
        result["machine"]["loadavg_after"] = os.getloadavg()
    finally:
        if spark is not None:
            spark.stop()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if not args.keep_dir:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"data dir kept: {data_dir}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
