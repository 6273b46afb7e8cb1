"""PySpark data source `delayd`: bulk scheduling into a daemon, and analytics over its data directory.

    from delayd.spark import register
    register(spark)                                   # once per SparkSession

    # write: one delayed message per row (batched, msgpack, one HTTP connection per partition)
    (orders.selectExpr("order_id AS key", "to_json(struct(*)) AS body",
                       "order_time + INTERVAL 30 MINUTES AS deliver_at")
        .write.format("delayd").option("url", "http://127.0.0.1:7070").option("topic", "orders.close")
        .mode("append").save())

    # read: the commit log (or the ready queues) of a data directory, straight from the files
    spark.read.format("delayd").load("/var/lib/delayd")
    spark.read.format("delayd").option("kind", "ready").load("/var/lib/delayd")

`write(df, url, topic)` does the same as the write above and returns a `WriteReport` (rows
scheduled, duplicates, ...). See docs/spark.md for every column and option.

It sits beside storage, not in the SDK: the writer speaks the HTTP API, but the reader reads the
data directory's files, through storage's own read-only code — the commit log's one decoder
(`commitlog.scan_buffer`: whole records of a buffer as columns, which this module turns into Arrow
arrays with numpy; `find_record` to resync after damage) and the segment headers. `register()`
makes Spark ship the `delayd` package to the Python workers by value, so executors need pyspark,
pyarrow, numpy and msgpack installed, not delayd itself.
"""

from __future__ import annotations

import bisect
import dataclasses
import http.client
import json
import os
import queue
import random
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from delayd.storage.commitlog import (
    HEADER,
    HEADER_SIZE,
    BufferScan,
    RecordType,
    ScanStop,
    declared_length,
    find_record,
    scan_buffer,
)
from delayd.storage.datadir import LEGACY_NODE_ID, Layout, read_meta
from delayd.storage.errors import CorruptData, UnsupportedVersion
from delayd.storage.readyqueue import READY_FORMAT
from delayd.storage.readyqueue import UNIT_SIZE as READY_UNIT_SIZE
from delayd.storage.segments import list_segments, read_header, segment_name

FORMAT = "delayd"
DEFAULT_URL = "http://127.0.0.1:7070"
DEFAULT_BATCH = 10_000
DEFAULT_BATCH_BYTES = 8 << 20  # the broker takes requests up to max_request_bytes (default 16 MiB)
MAX_BATCH = 10_000  # the broker's per-request limit (API.md)
IDLE_RECONNECT_S = 20.0  # open a fresh connection rather than reuse one idle this long

COMMITLOG_COLUMNS = ("offset long, record_type string, topic string, id string, key string, tag string, "
                     "deliver_at long, produced_at long, body_size int")
READY_COLUMNS = ("topic string, queue_index long, commit_offset long, id string, deliver_at long, "
                 "released_at long, lateness_ms long")

WRITE_COLUMNS = ("body", "delay_ms", "deliver_at", "key", "tag", "headers", "topic")


class DelaydSparkError(Exception):
    """A delayd Spark job cannot go on: bad options or columns, a rejected row, a damaged file."""


class DelaydWriteError(DelaydSparkError):
    """The broker refused a batch (or could not be reached). `row` is the refused row's 0-based index
    within its Spark partition (None when the refusal concerns the whole request: see `rows`)."""

    def __init__(self, code: str, message: str, *, partition: int, row: int | None,
                 rows: tuple[int, int] | None = None, topic: str = "", status: int = 0) -> None:
        self.code, self.partition, self.row, self.topic, self.status = code, partition, row, topic, status
        self.rows = rows
        where = (f"row {row} of partition {partition}" if row is not None
                 else f"rows {rows[0]}..{rows[1]} of partition {partition}" if rows else f"partition {partition}")
        verb = "could not send" if code == "connection_failed" else "rejected"
        super().__init__(f"delayd {verb} {where} (topic {topic!r}): {code}: {message}"
                         + (f" [HTTP {status}]" if status else ""))


# ------------------------------------------------------------------------------------ registration

def register(spark: Any) -> None:
    """Register the `delayd` format with `spark` (a SparkSession)."""
    from pyspark import cloudpickle

    import delayd

    # Ship the package's code to the Python workers by value: they need not have it installed.
    # (storage's byte tables are storage.bytetable.ByteTable, which pickles.)
    cloudpickle.register_pickle_by_value(delayd)
    spark.dataSource.register(DelaydDataSource)


def _opt(options: Any, name: str, default: str | None = None) -> str | None:
    v = options.get(name)
    if v is None:
        v = options.get(name.lower(), default)
    return v


def _bool_opt(options: Any, name: str, default: bool) -> bool:
    v = _opt(options, name)
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    raise DelaydSparkError(f"option {name} must be true or false, not {v!r}")


def _int_opt(options: Any, name: str, default: int, lo: int, hi: int) -> int:
    v = _opt(options, name)
    if v is None:
        return default
    try:
        n = int(str(v).strip())
    except ValueError:
        raise DelaydSparkError(f"option {name} must be an integer, not {v!r}") from None
    if not lo <= n <= hi:
        raise DelaydSparkError(f"option {name} must be within {lo}..{hi}, not {n}")
    return n


class DelaydDataSource(DataSource):
    """`spark.read.format("delayd")` / `df.write.format("delayd")`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        kind = (_opt(self.options, "kind", "commitlog") or "commitlog").lower()
        if kind == "ready":
            return READY_COLUMNS
        if kind != "commitlog":
            raise DelaydSparkError(f"option kind must be commitlog or ready, not {kind!r}")
        cols = COMMITLOG_COLUMNS
        if _bool_opt(self.options, "headers", False):
            cols += ", headers map<string,string>"
        if _bool_opt(self.options, "body", False):
            cols += ", body binary"
        return cols

    def reader(self, schema: StructType) -> DataSourceReader:
        return DataDirReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise DelaydSparkError("the delayd format only appends: use .mode('append') "
                                   "(scheduled messages cannot be overwritten; cancel them by key)")
        return ScheduleWriter(dict(self.options), schema)


# ======================================================================================== write

@dataclass
class WriteReport:
    """What one write job did, summed over its partitions."""

    rows: int = 0
    scheduled: int = 0  # new messages
    duplicates: int = 0  # rows whose key matched a pending (or recently delivered) message
    requests: int = 0
    retries: int = 0
    partitions: int = 0
    topics: dict[str, int] = field(default_factory=dict)  # rows per topic
    seconds: float = 0.0  # wall time of the slowest partition

    def add(self, other: WriteReport) -> None:
        self.rows += other.rows
        self.scheduled += other.scheduled
        self.duplicates += other.duplicates
        self.requests += other.requests
        self.retries += other.retries
        self.partitions += other.partitions
        for t, n in other.topics.items():
            self.topics[t] = self.topics.get(t, 0) + n
        self.seconds = max(self.seconds, other.seconds)


@dataclass
class ScheduleCommit(WriterCommitMessage):
    report: WriteReport


def _check_write_schema(schema: StructType, has_topic_option: bool) -> None:
    names = [f.name for f in schema.fields]
    unknown = [n for n in names if n not in WRITE_COLUMNS]
    if unknown:
        raise DelaydSparkError(f"unknown column(s) {unknown} for format delayd; the columns are "
                               f"{', '.join(WRITE_COLUMNS)} (select or rename first)")
    if "body" not in names:
        raise DelaydSparkError("the delayd format needs a body column (string or binary)")
    ints = (LongType, IntegerType, ShortType, ByteType)
    for f in schema.fields:
        t: DataType = f.dataType
        ok = {
            "body": isinstance(t, StringType | BinaryType),
            "delay_ms": isinstance(t, ints),
            "deliver_at": isinstance(t, ints + (TimestampType, TimestampNTZType)),
            "key": isinstance(t, StringType),
            "tag": isinstance(t, StringType),
            "topic": isinstance(t, StringType),
            "headers": isinstance(t, MapType) and isinstance(t.keyType, StringType)
            and isinstance(t.valueType, StringType),
        }[f.name]
        if not ok:
            raise DelaydSparkError(f"column {f.name} has type {t.simpleString()}; see docs/spark.md for the "
                                   "accepted types")
    if "topic" not in names and not has_topic_option:
        raise DelaydSparkError("set .option('topic', ...) or give the DataFrame a topic column")


def _ms_list(col: pa.Array | pa.ChunkedArray) -> list[int | None]:
    """Epoch milliseconds of an integer (already ms) or timestamp column (floored)."""
    t = col.type
    if pa.types.is_timestamp(t):
        per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[t.unit]
        raw = col.cast(pa.int64()).to_pylist()
        if per_ms is None:
            return [None if v is None else v * 1000 for v in raw]
        if per_ms == 1:
            return raw
        return [None if v is None else v // per_ms for v in raw]
    return col.cast(pa.int64()).to_pylist()


class _Http:
    """One keep-alive HTTP/1.1 connection to the broker (per partition; never shared)."""

    def __init__(self, url: str, token: str | None, timeout_s: float) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise DelaydSparkError(f"option url must be http(s)://host:port, not {url!r}")
        self.https = u.scheme == "https"
        self.host, self.port = u.hostname, u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.conn: http.client.HTTPConnection | None = None
        self.last_used = 0.0

    def post(self, path: str, payload: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.conn is not None and time.monotonic() - self.last_used > IDLE_RECONNECT_S:
            self.close()  # the server may be closing it as idle: do not race it
        if self.conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.conn = cls(self.host, self.port, timeout=self.timeout_s)
        try:
            self.conn.request("POST", self.prefix + path, body=payload, headers=self.headers)
            resp = self.conn.getresponse()
            data = resp.read()
        except BaseException:
            self.close()
            raise
        self.last_used = time.monotonic()
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _decode_error(status: int, data: bytes) -> tuple[str, str, int | None]:
    try:
        obj = msgpack.unpackb(data, raw=False)
    except Exception:
        try:
            obj = json.loads(data)
        except Exception:
            obj = None
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        err = obj["error"]
        idx = err.get("index")
        return str(err.get("code", f"http_{status}")), str(err.get("message", "")), \
            idx if isinstance(idx, int) else None
    return f"http_{status}", data[:200].decode(errors="replace"), None


class _Sender:
    """Sends one partition's requests, in order, from a background thread: the next batch is built
    while the broker works on (and fsyncs) the previous one. The first failure stops the sending
    and is raised in the task's thread."""

    def __init__(self, send: Any, depth: int = 2) -> None:
        self.send = send
        self.queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="delayd-spark-sender", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self.send(*item)
                except BaseException as e:  # handed to the task's thread
                    self.error = e

    def put(self, *item: Any) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(item)

    def finish(self) -> None:
        """Wait until everything was sent; raise the first failure."""
        self.stop()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()


class ScheduleWriter(DataSourceArrowWriter):
    """Turns Arrow record batches into produce requests of at most `batch_size` messages and about
    `batch_bytes` bytes each."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.url = _opt(options, "url", DEFAULT_URL) or DEFAULT_URL
        self.topic = _opt(options, "topic")
        self.token = _opt(options, "token")
        self.batch_size = _int_opt(options, "batch_size", DEFAULT_BATCH, 1, MAX_BATCH)
        self.batch_bytes = _int_opt(options, "batch_bytes", DEFAULT_BATCH_BYTES, 1024, 1 << 30)
        self.max_retries = _int_opt(options, "max_retries", 10, 0, 1000)
        self.timeout_s = float(_int_opt(options, "timeout_ms", 120_000, 100, 3_600_000)) / 1000
        self.replace = _bool_opt(options, "replace", False)
        self.report_path = _opt(options, "report_path")
        _check_write_schema(schema, bool(self.topic))
        _Http(self.url, None, 1)  # validates the url on the driver, before any task runs
        self.columns = [f.name for f in schema.fields]

    # -- executor side ------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> ScheduleCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        self._partition = ctx.partitionId() if ctx is not None else 0
        self._http = _Http(self.url, self.token, self.timeout_s)
        self._report = WriteReport(partitions=1)
        started = time.monotonic()
        # topic -> (row indexes, messages, their approximate encoded sizes) not yet sent
        pending: dict[str, tuple[list[int], list[dict[str, Any]], list[int]]] = {}
        bs, limit = self.batch_size, self.batch_bytes
        row = 0
        sender = _Sender(self._send)

        def send_some(topic: str, rows: list[int], msgs: list[dict[str, Any]], sizes: list[int]) -> None:
            k, total = 0, 0
            for size in sizes[:bs]:
                if k and total + size > limit:
                    break
                total += size
                k += 1
            sender.put(topic, rows[:k], msgs[:k])
            del rows[:k], msgs[:k], sizes[:k]

        try:
            for batch in iterator:
                for topic, rows, msgs, sizes in self._messages(batch, row):
                    buf = pending.setdefault(topic, ([], [], []))
                    buf[0].extend(rows)
                    buf[1].extend(msgs)
                    buf[2].extend(sizes)
                    while len(buf[1]) >= bs or sum(buf[2]) >= limit:
                        send_some(topic, *buf)
                row += batch.num_rows
            for topic, buf in pending.items():
                while buf[1]:
                    send_some(topic, *buf)
            sender.finish()
        finally:
            sender.stop()
            self._http.close()
        self._report.rows = row
        self._report.seconds = time.monotonic() - started
        return ScheduleCommit(self._report)

    def _messages(self, batch: pa.RecordBatch, first_row: int) \
            -> Iterator[tuple[str, list[int], list[dict[str, Any]], list[int]]]:
        """(topic, row indexes, message objects, approximate encoded sizes) groups for one Arrow batch."""
        n = batch.num_rows
        cols = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        body_col = cols["body"]
        if pa.types.is_string(body_col.type) or pa.types.is_large_string(body_col.type):
            body_col = body_col.cast(pa.large_binary())
        bodies = body_col.to_pylist()
        # body bytes plus room for the key (<= 256), tag (<= 128) and the field names
        sizes = pc.add(pc.binary_length(body_col).fill_null(0), 512).to_pylist()
        fields: list[tuple[str, list[Any]]] = []
        if "delay_ms" in cols:
            fields.append(("delay_ms", cols["delay_ms"].cast(pa.int64()).to_pylist()))
        if "deliver_at" in cols:
            fields.append(("deliver_at", _ms_list(cols["deliver_at"])))
        for name in ("key", "tag"):
            if name in cols:
                fields.append((name, cols[name].to_pylist()))
        headers = cols["headers"].to_pylist() if "headers" in cols else None
        topics = cols["topic"].to_pylist() if "topic" in cols else None
        keyed_replace = self.replace
        groups: dict[str, tuple[list[int], list[dict[str, Any]], list[int]]] = {}
        for j in range(n):
            body = bodies[j]
            if body is None:
                raise DelaydWriteError("invalid_message", "body is null", partition=self._partition,
                                       row=first_row + j, topic=self.topic or "")
            m: dict[str, Any] = {"body": body}
            for name, values in fields:
                v = values[j]
                if v is not None:
                    m[name] = v
            size = sizes[j]
            if headers is not None and headers[j] is not None:
                m["headers"] = dict(headers[j])
                size += sum(len(k) + len(v or "") + 4 for k, v in headers[j])
            if keyed_replace and "key" in m:
                m["replace"] = True
            topic = (topics[j] if topics is not None else None) or self.topic
            if not topic:
                raise DelaydWriteError("invalid_name", "no topic: the topic column is null and no topic "
                                       "option is set", partition=self._partition, row=first_row + j)
            g = groups.get(topic)
            if g is None:
                g = groups[topic] = ([], [], [])
            g[0].append(first_row + j)
            g[1].append(m)
            g[2].append(size)
        for topic, (rows, msgs, msg_sizes) in groups.items():
            yield topic, rows, msgs, msg_sizes

    def _send(self, topic: str, rows: list[int], msgs: list[dict[str, Any]]) -> None:
        payload = msgpack.packb({"messages": msgs}, use_bin_type=True)
        path = f"/v1/topics/{urllib.parse.quote(topic, safe='')}/messages"
        all_keyed = all("key" in m for m in msgs)
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                status, headers, data = self._http.post(path, payload)
            except (OSError, http.client.HTTPException) as e:
                status, headers, data = 0, {}, b""
                code, message, index = "connection_failed", f"{type(e).__name__}: {e}", None
            else:
                if status == 200:
                    break
                code, message, index = _decode_error(status, data)
                ra = headers.get("retry-after")
                if ra:
                    try:
                        retry_after = float(ra)
                    except ValueError:
                        retry_after = None
            retryable = status in (0, 429, 503)
            # A 429 stores nothing (docs/api.md): its batch is resent whatever it holds.
            if retryable and (all_keyed or status == 429) and attempt < self.max_retries:
                attempt += 1
                self._report.retries += 1
                backoff = min(5.0, 0.1 * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                time.sleep(max(backoff, retry_after or 0.0))
                continue
            if retryable and not all_keyed:
                message += " (not retried: some rows have no key, so a retry could schedule them twice)"
            elif retryable:
                message += f" (gave up after {attempt} retries)"
            row = rows[index] if index is not None and 0 <= index < len(rows) else None
            raise DelaydWriteError(code, message, partition=self._partition, row=row,
                                   rows=(rows[0], rows[-1]), topic=topic, status=status)
        obj = msgpack.unpackb(data, raw=False)
        results = obj.get("messages", []) if isinstance(obj, dict) else []
        if len(results) != len(msgs):
            raise DelaydWriteError("protocol_error", f"{len(results)} results for {len(msgs)} messages",
                                   partition=self._partition, row=None, rows=(rows[0], rows[-1]), topic=topic)
        dup = sum(1 for r in results if r.get("duplicate"))
        self._report.requests += 1
        self._report.duplicates += dup
        self._report.scheduled += len(msgs) - dup
        self._report.topics[topic] = self._report.topics.get(topic, 0) + len(msgs)

    # -- driver side --------------------------------------------------------------------------
    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        total = WriteReport()
        for m in messages:
            if isinstance(m, ScheduleCommit):
                total.add(m.report)
        if self.report_path:
            tmp = f"{self.report_path}.tmp"
            with open(tmp, "w") as f:
                json.dump(dataclasses.asdict(total), f)
            os.replace(tmp, self.report_path)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        # Nothing to undo: every batch a task sent before the failure stays scheduled. Rows with
        # keys make running the job again safe (the broker answers them as duplicates).
        pass


def write(df: Any, url: str = DEFAULT_URL, topic: str | None = None, **options: Any) -> WriteReport:
    """`df.write.format("delayd")...save()` that returns what the job did.

    `options` are the format's options (batch_size, batch_bytes, token, replace, max_retries, timeout_ms).
    """
    with tempfile.TemporaryDirectory(prefix="delayd-spark-") as d:
        path = os.path.join(d, "report.json")
        w = df.write.format(FORMAT).option("url", url).option("report_path", path)
        if topic is not None:
            w = w.option("topic", topic)
        for k, v in options.items():
            w = w.option(k, str(v).lower() if isinstance(v, bool) else str(v))
        w.mode("append").save()
        with open(path) as f:
            raw = json.load(f)
    return WriteReport(**raw)


# ========================================================================================= read

_RECORD_TYPES = pa.array(["unknown", "message", "cancel", "roll", "group", "release"])
_MESSAGE, _CANCEL, _ROLL, _GROUP, _RELEASE = (int(t) for t in (RecordType.MESSAGE, RecordType.CANCEL,
                                                                RecordType.ROLL, RecordType.GROUP,
                                                                RecordType.RELEASE))
# The commit-log record header (storage/commitlog.py HEADER) as a numpy dtype, to view the packed
# headers commitlog.scan_buffer returns as columns.
_HEADER = np.dtype([("length", "<u4"), ("crc", "<u4"), ("version", "u1"), ("type", "u1"), ("flags", "<u2"),
                    ("seq", "<u8"), ("deliver_at", "<i8"), ("produced_at", "<i8"), ("roll_count", "<u2"),
                    ("topic_len", "u1"), ("tag_len", "u1"), ("key_len", "<u2"), ("headers_len", "<u2"),
                    ("body_len", "<u4")])
assert _HEADER.itemsize == HEADER_SIZE == HEADER.size
# storage/readyqueue.py UNIT, as a numpy dtype.
_READY_UNIT = np.dtype([("commit_offset", "<i8"), ("commit_size", "<u4"), ("tag_hash", "<u4"),
                        ("deliver_at", "<i8"), ("released_at", "<i8"), ("seq", "<u8")])
assert _READY_UNIT.itemsize == READY_UNIT_SIZE
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


class Segment(InputPartition):
    """One segment file: the unit of read parallelism."""

    def __init__(self, path: str, base: int, topic: str | None = None) -> None:
        super().__init__(path)
        self.path, self.base, self.topic = path, base, topic


def _segments(directory: str) -> list[tuple[int, str]]:
    return [(b, os.path.join(directory, segment_name(b))) for b in list_segments(Path(directory))]


def _node_id(data_dir: str) -> str:
    """The node id the data directory recorded (its `meta` file), or "d" for a directory from
    before node ids were recorded (storage.datadir)."""
    try:
        meta = read_meta(Layout(Path(data_dir)).meta)
    except UnsupportedVersion as e:
        raise DelaydSparkError(str(e)) from e
    except CorruptData as e:
        raise DelaydSparkError(f"cannot tell the node id: {e}; set option node_id") from e
    return meta.node_id if meta is not None else LEGACY_NODE_ID


class DataDirReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        path = _opt(options, "path")
        if not path:
            raise DelaydSparkError("spark.read.format('delayd').load(DATA_DIR): the data directory is missing")
        self.data_dir = os.path.abspath(path)
        self.kind = (_opt(options, "kind", "commitlog") or "commitlog").lower()
        if not os.path.isdir(self.data_dir):
            raise DelaydSparkError(f"{self.data_dir} is not a directory")
        if self.kind == "commitlog" and not os.path.isdir(os.path.join(self.data_dir, "commitlog")):
            raise DelaydSparkError(f"{self.data_dir} is not a delayd data directory (no commitlog/ in it)")
        self.node = _opt(options, "node_id") or _node_id(self.data_dir)
        if not self.node.isalnum():
            raise DelaydSparkError(f"option node_id must be alphanumeric, not {self.node!r}")
        self.verify = _bool_opt(options, "verify", True)
        on_damage = (_opt(options, "on_damage", "skip") or "skip").lower()
        if on_damage not in ("skip", "fail"):
            raise DelaydSparkError(f"option on_damage must be skip or fail, not {on_damage!r}")
        self.fail_on_damage = on_damage == "fail"
        self.chunk_bytes = _int_opt(options, "chunk_bytes", 8 << 20, 1 << 16, 1 << 30)
        self.names = [f.name for f in schema.fields]
        self.with_body = "body" in self.names
        self.with_headers = "headers" in self.names

    def partitions(self) -> Sequence[InputPartition]:
        if self.kind == "ready":
            parts = []
            root = os.path.join(self.data_dir, "ready")
            for topic in sorted(os.listdir(root)) if os.path.isdir(root) else []:
                parts += [Segment(p, base, topic) for base, p in _segments(os.path.join(root, topic))]
        else:
            parts = [Segment(p, base) for base, p in _segments(os.path.join(self.data_dir, "commitlog"))]
        # Spark wants at least one partition; an empty one reads nothing.
        return parts or [Segment("", 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Segment)
        if not partition.path:
            return
        try:
            if self.kind == "ready":
                yield from self._read_ready(partition)
            else:
                yield from self._read_commitlog(partition)
        except UnsupportedVersion as e:
            raise DelaydSparkError(f"{e} (this reader is delayd's storage decoder: upgrade delayd)") from e

    # -- commit log ---------------------------------------------------------------------------
    def _read_commitlog(self, seg: Segment) -> Iterator[pa.RecordBatch]:
        """One segment, chunk by chunk, through storage's batch decoder (commitlog.scan_buffer)."""
        try:
            fd = os.open(seg.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # deleted by retention since planning
        try:
            directory = os.path.dirname(seg.path)
            pos = 0  # file-relative offset of the next unread record
            size = self.chunk_bytes
            last = _is_last(directory, seg.base)
            while True:
                buf = os.pread(fd, size, pos)
                if not buf:
                    return
                full = len(buf) == size
                scan = scan_buffer(buf, verify=self.verify)
                end, stop = scan.end, scan.stop
                held = last and stop is not ScanStop.DAMAGED and scan.batch_end < end
                if held:
                    # The segment the daemon appends to: an atomic batch is one write, so records
                    # of a batch whose end is not there yet are held back (and never shown if the
                    # batch stays unfinished). Before damage they are shown: that batch cannot end.
                    end = scan.batch_end
                    scan.starts = scan.starts[:bisect.bisect_left(scan.starts, end)]
                if len(scan.starts):
                    yield self._commitlog_batch(buf, seg.base + pos, scan)
                pos += end
                if full and stop is not ScanStop.DAMAGED:
                    # More of the file than this buffer held: go on from the first byte not yet
                    # shown (with a bigger buffer for one record, or one batch, larger than it).
                    size = self.chunk_bytes if end else max(2 * size, declared_length(buf, 0))
                    continue
                if held or stop is ScanStop.END:
                    return  # the end of the file (or the unfinished batch the daemon is writing)
                # The bytes at `pos` are not a whole record: damage (an intact record follows), or
                # a torn tail (nothing intact follows: the live segment's is being written).
                rest = os.pread(fd, os.fstat(fd).st_size - pos, pos)
                nxt = find_record(rest, 1, seg.base + pos)
                if nxt is None:
                    if not last and rest:
                        self._damage(seg, pos, f"{len(rest)} bytes at the end of a sealed segment are not records")
                    return
                self._damage(seg, pos, f"{nxt} damaged bytes before the next intact record")
                pos += nxt
                size = self.chunk_bytes
        finally:
            os.close(fd)

    def _damage(self, seg: Segment, pos: int, what: str) -> None:
        msg = f"damaged commit log {seg.path} at offset {seg.base + pos}: {what}"
        if self.fail_on_damage:
            raise DelaydSparkError(msg + " (on_damage=fail)")
        print(f"delayd spark reader: {msg}; skipped", file=sys.stderr)

    def _commitlog_batch(self, buf: bytes, base: int, scan: BufferScan) -> pa.RecordBatch:
        raw = np.frombuffer(buf, np.uint8)
        st = np.frombuffer(scan.starts, np.int64)
        # The records' headers as one structured array (what scan.headers() packs, gathered here
        # by numpy without a Python loop).
        h = sliding_window_view(raw, HEADER_SIZE)[st].view(_HEADER).reshape(-1)
        tl = h["topic_len"].astype(np.int64)
        gl = h["tag_len"].astype(np.int64)
        kl = h["key_len"].astype(np.int64)
        hl = h["headers_len"].astype(np.int64)
        bl = h["body_len"].astype(np.int64)
        types = h["type"]
        is_msg = (types == _MESSAGE) | (types == _ROLL)
        p_topic = st + HEADER_SIZE
        p_tag = p_topic + tl
        p_key = p_tag + gl
        p_hdr = p_key + kl
        p_body = p_hdr + hl
        cols: dict[str, pa.Array] = {
            "offset": pa.array(st + base),
            "record_type": pc.take(_RECORD_TYPES, pa.array(np.minimum(types, len(_RECORD_TYPES) - 1))),
            "topic": _ragged(raw, p_topic, tl, pa.string()),
            "id": _ids(h["seq"], self.node, (types != _GROUP) & (types != _RELEASE)),
            "key": _ragged(raw, p_key, kl, pa.string(), kl > 0),
            "tag": _ragged(raw, p_tag, gl, pa.string(), gl > 0),
            "deliver_at": pa.array(h["deliver_at"], mask=~is_msg),
            "produced_at": pa.array(h["produced_at"]),
            "body_size": pa.array(h["body_len"].astype(np.int32)),
        }
        if self.with_headers:
            cols["headers"] = _headers(buf, p_hdr, hl)
        if self.with_body:
            cols["body"] = _ragged(raw, p_body, bl, pa.binary())
        return pa.record_batch([cols[n] for n in self.names], names=self.names)

    # -- ready queues -------------------------------------------------------------------------
    def _read_ready(self, seg: Segment) -> Iterator[pa.RecordBatch]:
        unit = READY_UNIT_SIZE
        per_read = max(1, self.chunk_bytes // unit) * unit
        try:
            header, _data = read_header(READY_FORMAT, Path(seg.path), seg.base)  # 0 for a version-1 segment
            fd = os.open(seg.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            pos = 0
            while True:
                buf = os.pread(fd, per_read, header + pos)
                n = len(buf) // unit
                if n == 0:
                    return
                u = np.frombuffer(buf, _READY_UNIT, count=n)
                index = np.arange(n, dtype=np.int64) + (seg.base + pos) // unit
                real = u["seq"] != 0  # a unit the daemon is writing right now can still read as zeros
                if not real.all():
                    u, index = u[real], index[real]
                cols = {
                    "topic": pa.array([seg.topic] * len(u), pa.string()),
                    "queue_index": pa.array(index),
                    "commit_offset": pa.array(u["commit_offset"]),
                    "id": _ids(u["seq"], self.node),
                    "deliver_at": pa.array(u["deliver_at"]),
                    "released_at": pa.array(u["released_at"]),
                    "lateness_ms": pa.array(u["released_at"] - u["deliver_at"]),
                }
                yield pa.record_batch([cols[c] for c in self.names], names=self.names)
                if len(buf) < per_read:
                    return
                pos += n * unit
        finally:
            os.close(fd)


def _is_last(directory: str, base: int) -> bool:
    """No segment after `base`: it is the one the daemon appends to (or did, last)."""
    return all(b <= base for b in list_segments(Path(directory)))


def _ragged(raw: np.ndarray, starts: np.ndarray, lens: np.ndarray, typ: pa.DataType,
            valid: np.ndarray | None = None) -> pa.Array:
    """A string/binary array of the byte ranges [starts[i], starts[i] + lens[i]) of `raw`."""
    n = len(starts)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        idx = np.repeat(starts - offsets[:-1], lens)
        idx += np.arange(total, dtype=np.int64)
        data = raw[idx]
    else:
        data = np.zeros(0, np.uint8)
    if total >= 1 << 31:
        raise DelaydSparkError("more than 2 GiB of one column in one batch; lower option chunk_bytes")
    validity = None
    nulls = 0
    if valid is not None:
        nulls = n - int(np.count_nonzero(valid))
        if nulls:
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
                                 null_count=nulls)


def _ids(seq: np.ndarray, node: str, valid: np.ndarray | None = None) -> pa.Array:
    """Message ids `{node}-{seq in lowercase hex}` (broker/service.py), vectorized."""
    n = len(seq)
    prefix = (node + "-").encode()
    p = len(prefix)
    w = p + 16
    m = np.empty((n, w), np.uint8)
    nib = m[:, p:]
    be = seq.astype(">u8").view(np.uint8).reshape(n, 8)
    nib[:, 0::2] = be >> 4
    nib[:, 1::2] = be & 15
    nz = nib != 0
    lead = np.argmax(nz, axis=1)
    lead[~nz.any(axis=1)] = 15
    digits = 16 - lead
    nib[...] = _HEX[nib]
    flat = m.reshape(-1)
    row0 = np.arange(n, dtype=np.int64) * w
    first = row0 + (16 - digits)  # the prefix goes over leading zeros, right before the digits
    for k in range(p):
        flat[first + k] = prefix[k]
    return _ragged(flat, first, p + digits, pa.string(), valid)


def _headers(buf: bytes, starts: np.ndarray, lens: np.ndarray) -> pa.Array:
    out: list[list[tuple[str, str]] | None] = []
    for s, n in zip(starts.tolist(), lens.tolist(), strict=True):
        out.append(list(msgpack.unpackb(buf[s:s + n], raw=False).items()) if n else None)
    return pa.array(out, pa.map_(pa.string(), pa.string()))
