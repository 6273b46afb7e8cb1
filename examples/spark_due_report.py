"""What falls due, and how late delivery was: a report straight from a delayd data directory.

Reads the files with the `delayd` Spark data source (read-only, no LOCK: the daemon may keep
running) and prints

  1. pending messages due per minute over the next 48 hours (UTC): every produced message (or
     roll copy) that has no cancel record and is not in a ready queue yet, by its deliver_at;
  2. the lateness of what was delivered, per topic: released_at - deliver_at of every ready-queue
     unit (when the broker made a due message visible to consumers), p50 / p99 / max.

    .venv/bin/python examples/spark_due_report.py ./delayd-data
    .venv/bin/python examples/spark_due_report.py /var/lib/delayd --hours 24 --csv /tmp/due.csv

Needs the `spark` extra (`pip install -e '.[spark]'`) and Java 17+. Exits 0 after printing.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from datetime import UTC, datetime

MINUTE_MS = 60_000


def utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir", help="the daemon's --data-dir")
    ap.add_argument("--hours", type=int, default=48, help="look this far ahead (default 48)")
    ap.add_argument("--node-id", default=None,
                    help="name message ids with this node id (default: the one the data directory recorded)")
    ap.add_argument("--rows", type=int, default=60, help="print at most this many minutes (default 60)")
    ap.add_argument("--csv", help="also write every minute (minute_utc, due) to this CSV file")
    ap.add_argument("--now-ms", type=int, default=None, help="report as of this time (default: now)")
    ap.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(args.data_dir, "commitlog")):
        print(f"{args.data_dir} is not a delayd data directory (no commitlog/)", file=sys.stderr)
        return 2

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from delayd.spark import register

    spark = (SparkSession.builder.master(args.master).appName("delayd-due-report")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        register(spark)
        now = args.now_ms if args.now_ms is not None else int(time.time() * 1000)
        horizon = now + args.hours * 3_600_000
        reader = spark.read.format("delayd")
        if args.node_id:
            reader = reader.option("node_id", args.node_id)
        log = reader.load(args.data_dir)
        ready = reader.option("kind", "ready").load(args.data_dir)

        # -- 1. pending, due per minute ------------------------------------------------------
        produced = (log.where(F.col("record_type").isin("message", "roll"))
                    .groupBy("id").agg(F.first("topic").alias("topic"), F.max("deliver_at").alias("deliver_at")))
        cancelled = log.where(F.col("record_type") == "cancel").select("id")
        delivered = ready.select("id")
        pending = produced.join(cancelled, "id", "left_anti").join(delivered, "id", "left_anti")
        # one pass: -1 = due already (not released yet), else the minute it falls due in the window
        bucket = (F.when(F.col("deliver_at") < now, F.lit(-1))
                  .when(F.col("deliver_at") < horizon, F.floor(F.col("deliver_at") / MINUTE_MS) * MINUTE_MS))
        counts = (pending.select(bucket.alias("minute"), "topic").where(F.col("minute").isNotNull())
                  .groupBy("minute", "topic").count().collect())
        overdue = sum(r["count"] for r in counts if r["minute"] < 0)
        minutes: dict[int, int] = {}
        topics: dict[str, int] = {}
        for r in counts:
            if r["minute"] >= 0:
                minutes[r["minute"]] = minutes.get(r["minute"], 0) + r["count"]
                topics[r["topic"]] = topics.get(r["topic"], 0) + r["count"]
        per_minute = [{"minute": k, "count": minutes[k]} for k in sorted(minutes)]
        per_topic = sorted(({"topic": t, "count": n} for t, n in topics.items()), key=lambda r: -r["count"])
        total = sum(minutes.values())

        print(f"data directory: {os.path.abspath(args.data_dir)}   as of {utc(now)} UTC")
        print(f"pending messages due in the next {args.hours} h: {total}"
              + (f" (from {utc(per_minute[0]['minute'])} to {utc(per_minute[-1]['minute'])} UTC)" if per_minute else ""))
        if overdue:
            print(f"  due already but not in a ready queue yet: {overdue}")
        for r in per_topic:
            print(f"  topic {r['topic']}: {r['count']}")
        if per_minute:
            peak = max(r["count"] for r in per_minute)
            print(f"per minute (UTC), {len(per_minute)} minutes with messages; peak {peak}/min:")
            for r in per_minute[:args.rows]:
                bar = "#" * max(1, round(40 * r["count"] / peak))
                print(f"  {utc(r['minute'])}  {r['count']:>9}  {bar}")
            if len(per_minute) > args.rows:
                print(f"  ... {len(per_minute) - args.rows} more minutes (--rows, --csv)")
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["minute_utc", "due"])
                for r in per_minute:
                    w.writerow([utc(r["minute"]), r["count"]])
            print(f"wrote {len(per_minute)} minutes to {args.csv}")

        # -- 2. lateness of delivered messages ------------------------------------------------
        late = (ready.groupBy("topic")
                .agg(F.count("*").alias("delivered"),
                     F.percentile_approx("lateness_ms", [0.5, 0.99], 10_000).alias("p"),
                     F.max("lateness_ms").alias("max"))
                .orderBy("topic").collect())
        print("lateness of delivered messages (released_at - deliver_at, ms):")
        if not late:
            print("  nothing delivered yet")
        else:
            print(f"  {'topic':<32} {'delivered':>10} {'p50':>8} {'p99':>8} {'max':>8}")
            for r in late:
                print(f"  {r['topic']:<32} {r['delivered']:>10} {r['p'][0]:>8} {r['p'][1]:>8} {r['max']:>8}")
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
