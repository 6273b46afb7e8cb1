"""Bulk scheduling from Spark: one "close if unpaid" message per order, due 30 minutes after the order.

An orders DataFrame (here generated: order id, customer, amount, order time within the last
20 minutes; or your own with --orders-csv) becomes one delayed message per order, keyed by the
order id, written through the `delayd` Spark data source. The key makes the job safe to run again
(or to have Spark retry a task): the broker answers an order it already has as a duplicate and
schedules nothing twice. Paying an order cancels its message: DELETE /v1/topics/{topic}/keys/{order id}.

Run a daemon (`make run`), then:

    .venv/bin/python examples/spark_schedule_orders.py --url http://127.0.0.1:7070 --topic orders.close-unpaid
    .venv/bin/python examples/spark_schedule_orders.py --orders 100000        # run it twice: all duplicates
    .venv/bin/python examples/spark_schedule_orders.py --orders-csv orders.csv  # columns order_id,order_time[,customer,amount]

Needs the `spark` extra (`pip install -e '.[spark]'`: pyspark>=4.0, pyarrow, numpy) and Java 17+.
Prints what was scheduled and exits 0; exits 1 if the broker refused a row.
"""

from __future__ import annotations

import argparse
import os
import sys

TIMEOUT_MINUTES = 30


def orders_frame(spark, args):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    if args.orders_csv:
        df = spark.read.option("header", "true").option("inferSchema", "true").csv(args.orders_csv)
        return df.withColumn("order_time", F.to_timestamp("order_time"))
    # A stand-in for the day's orders table: placed over the last 20 minutes.
    return (spark.range(args.orders, numPartitions=spark.sparkContext.defaultParallelism)
            .select(F.format_string("ord-%08d", "id").alias("order_id"),
                    F.format_string("cust-%05d", (F.col("id") * 7919) % 50_000).alias("customer"),
                    F.round(5 + (F.col("id") * 37) % 500 + F.lit(0.99), 2).alias("amount"),
                    F.timestamp_millis(F.unix_millis(F.current_timestamp()) - (F.col("id") * 104_729) % 1_200_000)
                    .alias("order_time")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:7070", help="delayd base URL")
    ap.add_argument("--topic", default="orders.close-unpaid")
    ap.add_argument("--orders", type=int, default=10_000, help="generated orders (without --orders-csv)")
    ap.add_argument("--orders-csv", help="read orders from this CSV (header: order_id,order_time,...)")
    ap.add_argument("--timeout-minutes", type=int, default=TIMEOUT_MINUTES)
    ap.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    ap.add_argument("--token", default=os.environ.get("DELAYD_TOKEN"), help="bearer token, if the daemon needs one")
    args = ap.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from delayd.spark import DelaydSparkError, register, write

    spark = (SparkSession.builder.master(args.master).appName("delayd-schedule-orders")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        register(spark)
        orders = orders_frame(spark, args)
        messages = orders.select(
            F.col("order_id").cast("string").alias("key"),
            F.to_json(F.struct(F.lit("close_if_unpaid").alias("action"), "order_id", "order_time")).alias("body"),
            F.expr(f"order_time + INTERVAL {args.timeout_minutes} MINUTES").alias("deliver_at"),
            F.lit("close-unpaid").alias("tag"),
        )
        options = {"token": args.token} if args.token else {}
        try:
            report = write(messages, args.url, args.topic, **options)
        except Exception as e:  # the Spark job failed; the broker's reason is in the message
            reason = next((line for line in str(e).splitlines()
                           if "delayd rejected" in line or "delayd could not send" in line), str(e)[-2000:])
            print(f"failed: {reason.strip()}", file=sys.stderr)
            return 1
        print(f"orders: {report.rows}")
        print(f"scheduled: {report.scheduled}")
        print(f"duplicates: {report.duplicates}  (already scheduled by an earlier run)")
        print(f"requests: {report.requests}, partitions: {report.partitions}, retries: {report.retries}")
        print(f"topic: {args.topic}; each message is due {args.timeout_minutes} min after its order")
        return 0
    except DelaydSparkError as e:
        print(f"failed: {e}", file=sys.stderr)
        return 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
