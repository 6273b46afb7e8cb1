"""Schemathesis over the daemon's own /openapi.json, against a live daemon on loopback.

For every operation of the document, schemathesis generates requests from its schemas (a bounded
number per operation, so the whole file stays well under a minute) and checks each answer: never
a 5xx, a status the operation documents, a Content-Type it documents, and a body that fits the
documented schema. Both request encodings are exercised (JSON, and msgpack through the serializer
registered below).
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import schemathesis
from delayd.broker.openapi import spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.wire import daemon_log_clean
from tests.support.daemon import DaemonProcess

EXAMPLES_PER_OPERATION = 30
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


def _wire_ints(v: Any) -> Any:
    """msgpack integers are 64-bit; a bigger generated one goes on the wire as a float, which
    is how a client would have to send such a number (and the daemon must refuse it)."""
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**64:
        return float(v)
    if isinstance(v, dict):
        return {k: _wire_ints(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_wire_ints(x) for x in v]
    return v


@schemathesis.serializer("application/msgpack")
def _to_msgpack(ctx: Any, value: Any) -> bytes:
    return msgpack.packb(_wire_ints(value), use_bin_type=True)


@schemathesis.deserializer("application/msgpack")
def _from_msgpack(ctx: Any, response: Any) -> Any:
    # msgpack answers carry bodies as `bin`; the document describes them as strings (JSON's
    # form), so bytes are shown to the validator as text.
    def text(v: Any) -> Any:
        if isinstance(v, bytes):
            return v.decode("latin-1")
        if isinstance(v, dict):
            return {k: text(x) for k, x in v.items()}
        if isinstance(v, list):
            return [text(x) for x in v]
        return v
    return text(msgpack.unpackb(response.content, raw=False))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    d = DaemonProcess(tmp_path_factory.mktemp("schemathesis") / "data").start()
    yield d
    code = d.stop()
    daemon_log_clean(d)
    assert code == 0, d.log_tail()


@pytest.fixture(scope="module")
def api_schema(live: DaemonProcess):
    # The document the daemon serves, not a copy: what is tested is what users get.
    return schemathesis.openapi.from_url(live.url + "/openapi.json")


OPERATIONS = [(method, path) for path, item in spec()["paths"].items() for method in item]


LONG_POLL_MS = 100


def _short_long_poll(case: Any) -> None:
    """A valid long poll (`wait_ms` up to 30 s) on an empty topic waits its whole time, which
    tests nothing more than a short one: valid waits become at most LONG_POLL_MS (invalid ones,
    below 0 or above the limit, stay as generated)."""
    body = case.body
    if isinstance(body, dict):
        wait = body.get("wait_ms")
        if isinstance(wait, int) and not isinstance(wait, bool) and LONG_POLL_MS < wait <= 30_000:
            body["wait_ms"] = LONG_POLL_MS


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m.upper()} {p}" for m, p in OPERATIONS])
def test_operation(api_schema: Any, method: str, path: str) -> None:
    operation = api_schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

    @given(case=cases)
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        _short_long_poll(case)
        case.call_and_validate(checks=CHECKS, timeout=40)

    run()
