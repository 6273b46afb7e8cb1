"""The read path: `spark.read.format("delayd").load(DATA_DIR)` over a running daemon's files."""

from __future__ import annotations

import shutil
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from delayd.storage.commitlog import CommitLog, RecordType
from pyspark.sql.types import LongType, StructField, StructType

from delayd.spark import DataDirReader, DelaydSparkError
from tests.support.daemon import DaemonProcess, wait_until

SEGMENT_BYTES = 65536
COLUMNS = ("struct<offset:bigint,record_type:string,topic:string,id:string,key:string,tag:string,"
           "deliver_at:bigint,produced_at:bigint,body_size:int>")


def produce(d: DaemonProcess, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    status, body = d.request("POST", f"/v1/topics/{topic}/messages", {"messages": messages})
    assert status == 200, body
    return body["messages"]


def segment_files(d: DaemonProcess) -> list[Path]:
    return sorted(p for p in (d.data_dir / "commitlog").iterdir() if p.name.isdigit())


class Fill:
    """What the module's daemon was given, to compare the files against."""

    def __init__(self, d: DaemonProcess) -> None:
        self.far = int(time.time() * 1000) + 3_600_000
        self.ids: dict[str, dict[str, Any]] = {}  # id -> the message as produced
        for b in range(6):
            msgs = [{"body": f"order {b}-{i} " + "x" * 80, "deliver_at": self.far + i,
                     **({"key": f"k-{b}-{i}"} if i % 2 else {}), **({"tag": "t"} if i % 3 == 0 else {}),
                     **({"headers": {"n": str(i)}} if i % 5 == 0 else {})} for i in range(500)]
            topic = "r.orders" if b % 2 else "r.other"
            for m, r in zip(msgs, produce(d, topic, msgs), strict=True):
                self.ids[r["id"]] = {**m, "topic": topic}
        some = list(self.ids)
        self.cancelled_by_id = some[:10:3]  # with and without keys
        for mid in self.cancelled_by_id:
            assert d.request("DELETE", f"/v1/messages/{mid}")[0] == 200
        self.cancelled_key = "k-1-7"
        status, body = d.request("DELETE", f"/v1/topics/r.orders/keys/{self.cancelled_key}")
        assert status == 200, body
        self.cancelled_key_id = body["id"]
        status, _ = d.request("PUT", "/v1/topics/r.orders/subscriptions/spark-readers", {"start": "earliest"})
        assert status == 200
        now_msgs = [{"body": f"now {i}", "delay_ms": 0} for i in range(20)]
        self.now_ids = [r["id"] for r in produce(d, "r.now", now_msgs)]

        def delivered() -> bool:
            status, st = d.request("GET", "/v1/stats")
            return st["topics"].get("r.now", {}).get("delivered_total") == 20
        wait_until(delivered, 30, 0.05, "20 due messages released")


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, Fill]]:
    d = DaemonProcess(tmp_path_factory.mktemp("spark-read") / "data",
                      config_text=f"segment_bytes = {SEGMENT_BYTES}\n").start()
    fill = Fill(d)
    yield d, fill
    d.stop()


def test_columns_and_one_partition_per_segment(spark: Any, filled: tuple[DaemonProcess, Fill]) -> None:
    d, fill = filled
    df = spark.read.format("delayd").load(str(d.data_dir))
    assert df.schema.simpleString() == COLUMNS
    segments = segment_files(d)
    assert len(segments) >= 4
    assert df.rdd.getNumPartitions() == len(segments)
    with_body = spark.read.format("delayd").option("body", "true").load(str(d.data_dir))
    assert with_body.schema.simpleString() == COLUMNS[:-1] + ",body:binary>"
    both = spark.read.format("delayd").option("body", "true").option("headers", "true").load(str(d.data_dir))
    assert both.schema.simpleString() == COLUMNS[:-1] + ",headers:map<string,string>,body:binary>"


def test_records_match_what_was_produced(spark: Any, filled: tuple[DaemonProcess, Fill]) -> None:
    d, fill = filled
    rows = spark.read.format("delayd").option("body", "true").option("headers", "true") \
        .load(str(d.data_dir)).collect()
    messages = {r["id"]: r for r in rows if r["record_type"] == "message"}
    assert set(messages) == set(fill.ids) | set(fill.now_ids)
    for mid, m in fill.ids.items():
        r = messages[mid]
        assert (r["topic"], r["key"], r["tag"]) == (m["topic"], m.get("key"), m.get("tag"))
        assert r["body"] == m["body"].encode() and r["body_size"] == len(m["body"])
        assert r["deliver_at"] == m["deliver_at"]
        assert (dict(r["headers"]) if r["headers"] else None) == m.get("headers")
    cancels = [r for r in rows if r["record_type"] == "cancel"]
    assert sorted(r["id"] for r in cancels) == sorted(fill.cancelled_by_id + [fill.cancelled_key_id])
    assert [r["key"] for r in cancels if r["id"] == fill.cancelled_key_id] == [fill.cancelled_key]
    assert {r["id"]: r["key"] for r in cancels if r["id"] in fill.cancelled_by_id} == \
        {i: fill.ids[i].get("key") for i in fill.cancelled_by_id}
    assert any(fill.ids[i].get("key") for i in fill.cancelled_by_id)
    assert all(r["deliver_at"] is None and r["body_size"] == 0 for r in cancels)
    groups = [r for r in rows if r["record_type"] == "group"]
    assert [(g["topic"], g["key"], g["id"]) for g in groups] == [("r.orders", "spark-readers", None)]
    offsets = [r["offset"] for r in rows]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(rows)


def test_reader_agrees_with_storage_decode(spark: Any, filled: tuple[DaemonProcess, Fill]) -> None:
    d, _ = filled
    rows = spark.read.format("delayd").option("body", "true").option("headers", "true") \
        .load(str(d.data_dir)).orderBy("offset").collect()
    log = CommitLog(d.data_dir / "commitlog", SEGMENT_BYTES)
    try:
        recs = list(log.scan(0))
    finally:
        log.close()
    assert len(rows) == len(recs)
    for r, rec in zip(rows, recs, strict=True):
        assert r["offset"] == rec.offset and r["record_type"] == rec.type.name.lower()
        assert (r["topic"], r["key"], r["tag"], r["body"]) == (rec.topic, rec.key, rec.tag, rec.body)
        assert r["id"] == (None if rec.type in (RecordType.GROUP, RecordType.RELEASE) else f"d-{rec.seq:x}")
        assert r["produced_at"] == rec.produced_at
        assert r["deliver_at"] == (rec.deliver_at if rec.type in (RecordType.MESSAGE, RecordType.ROLL) else None)
        assert (dict(r["headers"]) if r["headers"] else None) == rec.headers


def test_ready_queue_units_give_lateness(spark: Any, filled: tuple[DaemonProcess, Fill]) -> None:
    d, fill = filled
    ready = spark.read.format("delayd").option("kind", "ready").load(str(d.data_dir))
    assert ready.schema.simpleString() == ("struct<topic:string,queue_index:bigint,commit_offset:bigint,id:string,"
                                           "deliver_at:bigint,released_at:bigint,lateness_ms:bigint>")
    rows = ready.collect()
    assert sorted(r["id"] for r in rows) == sorted(fill.now_ids)
    assert sorted(r["queue_index"] for r in rows) == list(range(20))
    assert {r["topic"] for r in rows} == {"r.now"}
    assert all(r["lateness_ms"] == r["released_at"] - r["deliver_at"] >= 0 for r in rows)
    log = spark.read.format("delayd").load(str(d.data_dir))
    joined = ready.join(log.where("record_type = 'message'"), [ready["commit_offset"] == log["offset"]]).count()
    assert joined == 20


def test_node_id_option_names_ids(spark: Any, filled: tuple[DaemonProcess, Fill]) -> None:
    d, fill = filled
    ids = {r["id"] for r in spark.read.format("delayd").option("node_id", "s7").load(str(d.data_dir))
           .where("record_type = 'message'").select("id").collect()}
    assert ids == {"s7-" + i.split("-", 1)[1] for i in list(fill.ids) + fill.now_ids}


def test_read_while_the_daemon_writes(spark: Any, filled: tuple[DaemonProcess, Fill]) -> None:
    """Never the LOCK, never a half batch: every produce request (one atomic batch) is seen whole or not."""
    d, _ = filled
    stop = threading.Event()
    acked: list[int] = []
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            n = 0
            while not stop.is_set():
                produce(d, "r.live", [{"body": f"live {n}-{i}", "delay_ms": 3_600_000} for i in range(100)])
                n += 1
                acked.append(n * 100)
        except BaseException as e:  # surfaced below
            errors.append(e)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    try:
        wait_until(lambda: len(acked) >= 5, 30, 0.01, "the producer to get going")
        for _ in range(2):
            before = acked[-1]
            # load() again: like Spark's file sources, a DataFrame keeps the file list it was planned with
            seen = spark.read.format("delayd").load(str(d.data_dir)).where("topic = 'r.live'").count()
            assert seen >= before and seen % 100 == 0, (seen, before)
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    assert spark.read.format("delayd").load(str(d.data_dir)).where("topic = 'r.live'").count() == acked[-1]


def test_damaged_record_is_skipped_or_fails(spark: Any, filled: tuple[DaemonProcess, Fill],
                                            tmp_path: Path) -> None:
    d, _ = filled
    copy = tmp_path / "copy"
    shutil.copytree(d.data_dir / "commitlog", copy / "commitlog")
    log = CommitLog(copy / "commitlog", SEGMENT_BYTES)
    try:
        offsets = [rec.offset for rec in log.scan(0)]
    finally:
        log.close()
    victim = offsets[2]
    first = segment_files(d)[0]
    assert offsets[3] < first.stat().st_size  # in the first (sealed) segment
    seg = copy / "commitlog" / first.name
    raw = bytearray(seg.read_bytes())
    raw[victim + 60] ^= 0xFF  # inside the record: its CRC no longer matches
    seg.write_bytes(bytes(raw))
    skipped = [r["offset"] for r in spark.read.format("delayd").load(str(copy)).select("offset").collect()]
    assert skipped == [o for o in offsets if o != victim]
    with pytest.raises(Exception, match="damaged commit log"):
        spark.read.format("delayd").option("on_damage", "fail").load(str(copy)).count()
    assert spark.read.format("delayd").option("verify", "false").load(str(copy)).count() == len(offsets)


def test_a_newer_record_version_is_refused_not_skipped(filled: tuple[DaemonProcess, Fill], tmp_path: Path) -> None:
    d, _ = filled
    shutil.copytree(d.data_dir / "commitlog", tmp_path / "commitlog")
    seg = tmp_path / "commitlog" / segment_files(d)[0].name
    raw = bytearray(seg.read_bytes())
    (length,) = struct.unpack_from("<I", raw, 0)
    raw[8] = 2  # the first record's version byte, with a CRC that matches again
    struct.pack_into("<I", raw, 4, zlib.crc32(raw[8:length]))
    seg.write_bytes(bytes(raw))
    reader = DataDirReader({"path": str(tmp_path)}, StructType([StructField("offset", LongType())]))
    with pytest.raises(DelaydSparkError, match="record at offset 0: format version 2, but this build reads versions up to 1"):
        for part in reader.partitions():
            list(reader.read(part))


def test_not_a_data_directory(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="not a delayd data directory"):
        spark.read.format("delayd").load(str(tmp_path)).count()
    (tmp_path / "commitlog").mkdir()
    assert spark.read.format("delayd").load(str(tmp_path)).count() == 0
    assert spark.read.format("delayd").option("kind", "ready").load(str(tmp_path)).count() == 0
