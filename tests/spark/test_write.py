"""The write path: `df.write.format("delayd")` schedules one message per row in a real daemon."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
from pyspark.sql import functions as F

from delayd.spark import WriteReport, write
from tests.support.daemon import DaemonProcess, wait_until


def now_ms() -> int:
    return int(time.time() * 1000)


def by_key(d: DaemonProcess, topic: str, key: str) -> dict[str, Any]:
    status, body = d.request("GET", f"/v1/topics/{topic}/keys/{key}")
    assert status == 200, body
    return body


def body_of(msg: dict[str, Any]) -> bytes:
    return msg["body"].encode() if "body" in msg else base64.b64decode(msg["body_b64"])


def stats(d: DaemonProcess) -> dict[str, Any]:
    status, body = d.request("GET", "/v1/stats")
    assert status == 200
    return body


def test_string_bodies_delay_ms_tags_headers(spark: Any, daemon: DaemonProcess) -> None:
    rows = [(f"s-{i}", f"body {i} é", 600_000 + i, f"tag{i % 2}", {"h": str(i), "x": "y"}) for i in range(5)]
    df = spark.createDataFrame(rows, "key string, body string, delay_ms long, tag string, headers map<string,string>")
    before = now_ms()
    (df.write.format("delayd").option("url", daemon.url).option("topic", "w.strings")
     .mode("append").save())
    after = now_ms()
    for key, body, delay, tag, headers in rows:
        m = by_key(daemon, "w.strings", key)
        assert body_of(m) == body.encode()
        assert before + delay <= m["deliver_at"] <= after + delay
        assert m["tag"] == tag and m["headers"] == headers and m["state"] == "scheduled"


def test_binary_bodies_deliver_at_long_and_timestamps(spark: Any, daemon: DaemonProcess) -> None:
    due = now_ms() + 3_600_000
    df = spark.range(0, 6, numPartitions=2).select(
        F.concat(F.lit("b-"), F.col("id").cast("string")).alias("key"),
        F.concat(F.lit(b"\xff\x00").cast("binary"), F.col("id").cast("string").cast("binary")).alias("body"),
        (F.lit(due) + F.col("id")).alias("deliver_at"))
    rep = write(df, daemon.url, "w.binary")
    assert rep == WriteReport(rows=6, scheduled=6, duplicates=0, requests=2, retries=0, partitions=2,
                              topics={"w.binary": 6}, seconds=rep.seconds)
    for i in range(6):
        m = by_key(daemon, "w.binary", f"b-{i}")
        assert body_of(m) == b"\xff\x00" + str(i).encode()
        assert m["deliver_at"] == due + i

    # timestamp (microseconds: floored to the millisecond) and timestamp_ntz (read as UTC)
    ts = spark.range(0, 4, numPartitions=1).select(
        F.concat(F.lit("t-"), F.col("id").cast("string")).alias("key"),
        F.lit("x").alias("body"),
        F.when(F.col("id") < 2, F.timestamp_micros(F.lit(due * 1000 + 999) + F.col("id") * 1000))
        .otherwise(F.timestamp_millis(F.lit(due) + F.col("id"))).alias("deliver_at"))
    write(ts, daemon.url, "w.ts")
    ntz = spark.range(4, 5).select(F.lit("t-4").alias("key"), F.lit("x").alias("body"),
                                   F.timestamp_millis(F.lit(due) + 4).cast("timestamp_ntz").alias("deliver_at"))
    write(ntz, daemon.url, "w.ts")
    assert [by_key(daemon, "w.ts", f"t-{i}")["deliver_at"] for i in range(5)] == [due + i for i in range(5)]


def test_rows_without_time_are_due_now_and_topic_column_overrides(spark: Any, daemon: DaemonProcess) -> None:
    df = spark.range(0, 10, numPartitions=2).select(
        F.col("id").cast("string").alias("body"),
        F.when(F.col("id") % 2 == 0, F.lit("w.other")).alias("topic"),  # null: the option's topic
        F.when(F.col("id") < 8, F.lit(7_200_000)).alias("delay_ms"))  # null: due now
    before = stats(daemon)["topics"]
    rep = write(df, daemon.url, "w.main")
    assert rep.topics == {"w.main": 5, "w.other": 5} and rep.scheduled == 10

    def settled() -> bool:
        # ids 8 (w.other) and 9 (w.main) were due at once and get delivered; the rest stays scheduled
        topics = stats(daemon)["topics"]
        for t in ("w.main", "w.other"):
            was = before.get(t, {"scheduled": 0, "delivered_total": 0})
            now = topics.get(t, {"scheduled": 0, "delivered_total": 0})
            if (now["scheduled"] - was["scheduled"], now["delivered_total"] - was["delivered_total"]) != (4, 1):
                return False
        return True

    wait_until(settled, 30, 0.05, "4 scheduled and 1 delivered per topic")


def test_keys_make_a_rewrite_all_duplicates(spark: Any, daemon: DaemonProcess) -> None:
    df = spark.range(0, 3000, numPartitions=2).select(
        F.concat(F.lit("order-"), F.col("id").cast("string")).alias("key"),
        F.lit("close if unpaid").alias("body"),
        (F.lit(3_600_000) + F.col("id")).alias("delay_ms"))
    first = write(df, daemon.url, "w.dedup", batch_size=1000)
    assert (first.rows, first.scheduled, first.duplicates, first.partitions, first.requests) == (3000, 3000, 0, 2, 4)
    s1 = stats(daemon)
    again = write(df, daemon.url, "w.dedup", batch_size=1000)
    assert (again.rows, again.scheduled, again.duplicates) == (3000, 0, 3000)
    s2 = stats(daemon)
    assert s2["topics"]["w.dedup"]["scheduled"] == s1["topics"]["w.dedup"]["scheduled"] == 3000
    assert s2["produced_total"] == s1["produced_total"]


def test_replace_option_reschedules_by_key(spark: Any, daemon: DaemonProcess) -> None:
    due = now_ms() + 3_600_000
    df = spark.createDataFrame([("r-1", "v1", due)], "key string, body string, deliver_at long")
    write(df, daemon.url, "w.replace")
    first = by_key(daemon, "w.replace", "r-1")
    df2 = spark.createDataFrame([("r-1", "v2", due + 60_000)], "key string, body string, deliver_at long")
    rep = write(df2, daemon.url, "w.replace", replace=True)
    assert (rep.scheduled, rep.duplicates) == (1, 0)
    second = by_key(daemon, "w.replace", "r-1")
    assert second["id"] != first["id"] and second["deliver_at"] == due + 60_000 and body_of(second) == b"v2"


def test_rejected_row_fails_the_job_with_code_and_position(spark: Any, daemon: DaemonProcess) -> None:
    # spark.range splits [0, 10) into [0, 5) and [5, 10): id 7 is row 2 of partition 1.
    df = spark.range(0, 10, numPartitions=2).select(
        F.concat(F.lit("bad-"), F.col("id").cast("string")).alias("key"),
        F.lit("b").alias("body"),
        F.lit(3_600_000).alias("delay_ms"),
        F.when(F.col("id") == 7, F.repeat(F.lit("x"), 200)).otherwise(F.lit("ok")).alias("tag"))
    with pytest.raises(Exception) as err:
        df.write.format("delayd").option("url", daemon.url).option("topic", "w.bad").mode("append").save()
    text = str(err.value)
    assert "delayd rejected row 2 of partition 1 (topic 'w.bad'): invalid_message" in text, text[-3000:]
    # A batch is all-or-nothing: nothing of partition 1 was scheduled.
    for i in range(5, 10):
        status, _ = daemon.request("GET", f"/v1/topics/w.bad/keys/bad-{i}")
        assert status == 404


def test_bad_columns_and_modes_fail_before_any_row_is_sent(spark: Any, daemon: DaemonProcess) -> None:
    base = spark.range(3).select(F.lit("b").alias("body"))
    with pytest.raises(Exception, match="unknown column.*'delay'"):
        base.withColumn("delay", F.lit(5)).write.format("delayd").option("url", daemon.url) \
            .option("topic", "w.cols").mode("append").save()
    with pytest.raises(Exception, match="column delay_ms has type string"):
        base.withColumn("delay_ms", F.lit("5")).write.format("delayd").option("url", daemon.url) \
            .option("topic", "w.cols").mode("append").save()
    with pytest.raises(Exception, match="needs a body column"):
        spark.range(3).select(F.lit("k").alias("key")).write.format("delayd").option("url", daemon.url) \
            .option("topic", "w.cols").mode("append").save()
    with pytest.raises(Exception, match="set .option\\('topic'"):
        base.write.format("delayd").option("url", daemon.url).mode("append").save()
    with pytest.raises(Exception, match="only appends"):
        base.write.format("delayd").option("url", daemon.url).option("topic", "w.cols").mode("overwrite").save()
    with pytest.raises(Exception, match="batch_size must be within 1..10000"):
        base.write.format("delayd").option("url", daemon.url).option("topic", "w.cols") \
            .option("batch_size", "20000").mode("append").save()
    assert "w.cols" not in stats(daemon)["topics"]
