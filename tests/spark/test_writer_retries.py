"""The writer's retry rule, against a scripted HTTP server (no Spark job needed: the writer runs in-process).

Connection errors and 503 are retried only when every message of the batch has a key: the broker
answers a resent keyed message as a duplicate, while a resent unkeyed one would be scheduled twice.
A 429 is answered before anything is stored, so any batch is resent after it.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from delayd.spark import DelaydWriteError, ScheduleWriter
from tests.support.daemon import free_port

SCHEMA = StructType([StructField("body", StringType()), StructField("key", StringType())])


class Scripted(http.server.ThreadingHTTPServer):
    """Answers each POST with the next (status, body, headers) of `script`, then with 200s."""

    def __init__(self) -> None:
        self.script: list[tuple[int, Any, dict[str, str]]] = []
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = msgpack.unpackb(self.rfile.read(int(self.headers["Content-Length"])), raw=False)
                server.requests.append({"path": self.path, "type": self.headers["Content-Type"], "body": body})
                if server.script:
                    status, obj, headers = server.script.pop(0)
                else:
                    n = len(body["messages"])
                    status, obj, headers = 200, {"messages": [{"id": f"d-{i}", "deliver_at": 1, "duplicate": False}
                                                              for i in range(n)]}, {}
                data = msgpack.packb(obj)
                self.send_response(status)
                self.send_header("Content-Type", "application/msgpack")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def server() -> Iterator[Scripted]:
    s = Scripted()
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()
    t.join(10)


def batch(n: int, keyed: bool = True) -> pa.RecordBatch:
    return pa.record_batch([pa.array([f"b{i}" for i in range(n)]),
                            pa.array([f"k{i}" if keyed or i else None for i in range(n)], pa.string())],
                           names=["body", "key"])


def err(code: str, index: int | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"code": code, "message": f"{code} for the test"}
    if index is not None:
        e["index"] = index
    return {"error": e}


def writer(url: str, **options: str) -> ScheduleWriter:
    return ScheduleWriter({"url": url, "topic": "t.retry", "max_retries": "3", **options}, SCHEMA)


def test_batches_are_msgpack_with_binary_bodies(server: Scripted) -> None:
    commit = writer(server.url, batch_size="4").write(iter([batch(5), batch(5)]))
    assert (commit.report.rows, commit.report.scheduled, commit.report.requests) == (10, 10, 3)
    assert [len(r["body"]["messages"]) for r in server.requests] == [4, 4, 2]
    first = server.requests[0]
    assert first["path"] == "/v1/topics/t.retry/messages" and first["type"] == "application/msgpack"
    assert first["body"]["messages"][0] == {"body": b"b0", "key": "k0"}


def test_requests_are_also_cut_by_bytes(server: Scripted) -> None:
    big = pa.record_batch([pa.array(["x" * 300] * 5), pa.array([f"k{i}" for i in range(5)])], names=["body", "key"])
    commit = writer(server.url, batch_bytes="2048").write(iter([big]))  # ~812 bytes a message
    assert [len(r["body"]["messages"]) for r in server.requests] == [2, 2, 1]
    assert commit.report.scheduled == 5


@pytest.mark.parametrize("status,code", [(503, "unavailable"), (429, "backpressure")])
def test_keyed_batch_is_retried(server: Scripted, status: int, code: str) -> None:
    server.script = [(status, err(code), {}), (status, err(code), {})]
    commit = writer(server.url).write(iter([batch(3)]))
    assert (commit.report.scheduled, commit.report.retries, len(server.requests)) == (3, 2, 3)


def test_unkeyed_batch_is_not_retried(server: Scripted) -> None:
    server.script = [(503, err("unavailable"), {})]
    with pytest.raises(DelaydWriteError, match="rows 0..2 of partition 0 .*unavailable.*not retried: some rows "
                                               "have no key") as e:
        writer(server.url).write(iter([batch(3, keyed=False)]))
    assert e.value.code == "unavailable" and len(server.requests) == 1


def test_unkeyed_batch_is_retried_after_a_429(server: Scripted) -> None:
    server.script = [(429, err("backpressure"), {"Retry-After": "0"})]
    commit = writer(server.url).write(iter([batch(3, keyed=False)]))
    assert (commit.report.scheduled, commit.report.retries, len(server.requests)) == (3, 1, 2)


def test_gives_up_after_max_retries(server: Scripted) -> None:
    server.script = [(429, err("backpressure"), {"Retry-After": "0"})] * 4
    with pytest.raises(DelaydWriteError, match="backpressure.*gave up after 3 retries"):
        writer(server.url).write(iter([batch(2)]))
    assert len(server.requests) == 4


def test_refusals_are_not_retried_and_name_the_row(server: Scripted) -> None:
    # the second request (rows 2, 3) is refused at its index 1: row 3
    server.script = [(200, {"messages": [{"id": "a", "deliver_at": 1, "duplicate": False}] * 2}, {}),
                     (400, err("invalid_message", index=1), {})]
    with pytest.raises(DelaydWriteError, match="delayd rejected row 3 of partition 0 \\(topic 't.retry'\\): "
                                               "invalid_message") as e:
        writer(server.url, batch_size="2").write(iter([batch(2), batch(2)]))
    assert (e.value.row, e.value.status, len(server.requests)) == (3, 400, 2)
    server.script = [(413, err("too_large"), {})]  # no index: the whole request's rows
    with pytest.raises(DelaydWriteError, match="rows 0..1 of partition 0 .*too_large.*HTTP 413"):
        writer(server.url).write(iter([batch(2)]))


def test_connection_refused_is_retried_for_keyed_rows_then_fails() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(DelaydWriteError, match="connection_failed.*gave up after 2 retries"):
        writer(url, max_retries="2").write(iter([batch(2)]))
    with pytest.raises(DelaydWriteError, match="connection_failed.*not retried"):
        writer(url).write(iter([batch(2, keyed=False)]))
