"""API v1 as OpenAPI 3, kept beside the routes (broker.http) and tested against real answers
(tests/integration/test_observe.py validates every endpoint's responses with these schemas)."""

from __future__ import annotations

from typing import Any

NAME = {"type": "string", "pattern": r"^[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}$"}
INT = {"type": "integer"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
NULLABLE_STR = {"type": "string", "nullable": True}


def obj(required: list[str], props: dict[str, Any], closed: bool = False) -> dict[str, Any]:
    """An object schema; `closed` (no other fields) is how request bodies are validated."""
    out: dict[str, Any] = {"type": "object", "required": required, "properties": props}
    if closed:
        out["additionalProperties"] = False
    return out


def count_map(*fields: str) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": obj(list(fields), {f: INT for f in fields})}


ERROR = obj(["error"], {"error": obj(["code", "message"], {"code": STR, "message": STR, "index": INT})})
MESSAGE_IN = {"type": "object", "additionalProperties": False, "properties": {
    "body": STR, "body_b64": STR, "delay_ms": {"type": "integer", "minimum": 0}, "deliver_at": INT,
    "key": {"type": "string", "minLength": 1}, "tag": {"type": "string", "maxLength": 128},
    "headers": {"type": "object", "additionalProperties": STR, "maxProperties": 64}, "replace": BOOL}}
PRODUCED = obj(["messages"], {"messages": {"type": "array", "items": obj(
    ["id", "deliver_at", "duplicate"], {"id": STR, "deliver_at": INT, "duplicate": BOOL})}})
# JSON answers carry `body` (UTF-8 text) or `body_b64` (anything else); msgpack answers `body` as bin.
VIEW_PROPS = {"id": STR, "topic": STR, "key": NULLABLE_STR, "tag": NULLABLE_STR,
              "headers": {"type": "object", "additionalProperties": STR}, "body": STR, "body_b64": STR,
              "deliver_at": INT}
VIEW_REQUIRED = ["id", "topic", "key", "tag", "headers", "deliver_at"]
MESSAGE_VIEW = obj(VIEW_REQUIRED + ["produced_at", "state"], {
    **VIEW_PROPS, "produced_at": INT, "state": {"type": "string", "enum": ["scheduled", "delivered", "cancelled"]}})
PULLED = obj(VIEW_REQUIRED + ["receipt", "delivered_at", "attempt"],
             {**VIEW_PROPS, "receipt": STR, "delivered_at": INT, "attempt": {"type": "integer", "minimum": 1}})
DEAD = obj(["id", "attempt", "reason"], {**VIEW_PROPS, "produced_at": INT, "attempt": INT, "reason": STR})
RECEIPT_LIST = {"type": "array", "items": STR, "maxItems": 10000}
DURATION = {"type": "integer", "minimum": 0, "maximum": 12 * 3_600_000}
LEASE = {"type": "integer", "minimum": 1000, "maximum": 12 * 3_600_000}
SETTINGS = obj(["topic", "group", "start", "max_attempts"], {"topic": STR, "group": STR, "start": {"enum": ["earliest", "latest"]}, "max_attempts": INT})
STATS = obj(["scheduled", "produced_total", "delivered_total", "cancelled_total", "lateness_ms", "topics",
             "groups", "pipeline", "disk_bytes"], {
    "node_id": STR, "scheduled": INT, "produced_total": INT, "delivered_total": INT, "cancelled_total": INT,
    "rolled_total": INT, "lateness_ms": obj(["p50", "p99", "max"], {"p50": INT, "p99": INT, "max": INT}),
    "topics": count_map("scheduled", "delivered_total"), "groups": count_map("backlog", "inflight", "dead"),
    "pipeline": {"type": "object", "additionalProperties": INT},
    "pipeline_state": {"type": "object", "additionalProperties": {
        "type": "string", "enum": ["initial", "running", "waiting", "end"]}}, "disk_bytes": INT,
    "recovery_seconds": {"type": "number"}, "wall_clock_skew_ms": INT})
SCHEDULE = obj(["buckets"], {"buckets": {"type": "array", "maxItems": 10000, "items": {
    "type": "array", "items": INT, "minItems": 2, "maxItems": 2}}})
STATUS = obj(["status"], {"status": STR})


def _params(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "in": "path", "required": True, "schema": NAME if n in ("topic", "group") else STR}
            for n in names]


def _op(summary: str, ok: dict[str, Any], body: dict[str, Any] | None = None,
        params: list[dict[str, Any]] | None = None, extra: dict[str, str] | None = None,
        body_required: bool = True) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "OK", "content": {"application/json": {"schema": ok}}}}
    errors = {"400": "Bad input", "401": "Missing or wrong token", "403": "Not allowed",
              "503": "Recovery is still running (not_ready), or the broker is out of file descriptors "
                     "(unavailable); both with Retry-After", **(extra or {})}
    if body is not None:
        errors["408"] = "The request body did not arrive in time"
        errors["415"] = "Content-Type is neither application/json nor application/msgpack"
    for code, text in errors.items():
        responses[code] = {"description": text, "content": {"application/json": {"schema": ERROR}}}
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": {"application/json": {"schema": body},
                                                            "application/msgpack": {"schema": body}}}
    return op


def spec() -> dict[str, Any]:
    t, g = "/v1/topics/{topic}", "/v1/topics/{topic}/subscriptions/{group}"
    tg = _params("topic", "group")
    return {
        "openapi": "3.0.3",
        "info": {"title": "delayd API", "version": "1"},
        "paths": {
            f"{t}/messages": {"post": _op(
                "Schedule one message or a batch", PRODUCED,
                {"oneOf": [MESSAGE_IN, obj(["messages"], {"messages": {
                    "type": "array", "minItems": 1, "maxItems": 10000, "items": MESSAGE_IN}}, closed=True)]},
                _params("topic"), {"413": "Too large", "429": "Backpressure", "507": "Disk full"})},
            "/v1/messages/{id}": {
                "get": _op("Inspect a message", MESSAGE_VIEW, None, _params("id"), {"404": "Not found"}),
                "delete": _op("Cancel a message", obj(["id", "state"], {"id": STR, "state": {
                    "type": "string", "enum": ["cancelled"]}}), None, _params("id"),
                    {"404": "Not found", "409": "Already delivered"})},
            f"{t}/keys/{{key}}": {
                "get": _op("Inspect the pending message with this key", MESSAGE_VIEW, None,
                           _params("topic", "key"), {"404": "Not found"}),
                "delete": _op("Cancel the pending message with this key", obj(["id", "state"], {
                    "id": STR, "state": STR}), None, _params("topic", "key"),
                    {"404": "Not found", "409": "Already delivered"})},
            g: {"put": _op("Create or update a subscription group", SETTINGS, obj([], {
                "start": {"type": "string", "enum": ["earliest", "latest"]},
                "max_attempts": {"type": "integer", "minimum": 1, "maximum": 1000}}, closed=True), tg,
                body_required=False)},
            f"{g}/pull": {"post": _op(
                "Lease due messages", obj(["messages"], {"messages": {"type": "array", "items": PULLED}}),
                obj([], {"max": {"type": "integer", "minimum": 1, "maximum": 1000},
                         "wait_ms": {"type": "integer", "minimum": 0, "maximum": 30000}, "lease_ms": LEASE,
                         "tags": {"type": "array", "items": STR, "maxItems": 1000}}, closed=True), tg,
                body_required=False)},
            f"{g}/ack": {"post": _op("Acknowledge", obj(["acked", "stale"], {"acked": INT, "stale": RECEIPT_LIST}),
                                     obj(["receipts"], {"receipts": RECEIPT_LIST}, closed=True), tg)},
            f"{g}/nack": {"post": _op(
                "Negative-acknowledge: redeliver after delay_ms (default: backoff)",
                obj(["nacked", "stale"], {"nacked": INT, "stale": RECEIPT_LIST}),
                obj(["receipts"], {"receipts": RECEIPT_LIST, "delay_ms": DURATION}, closed=True), tg)},
            f"{g}/extend": {"post": _op(
                "Extend leases", obj(["extended", "stale"], {"extended": INT, "stale": RECEIPT_LIST}),
                obj(["receipts", "lease_ms"], {"receipts": RECEIPT_LIST, "lease_ms": LEASE}, closed=True), tg)},
            f"{g}/dead": {"get": _op("List dead letters", obj(["messages"], {"messages": {
                "type": "array", "items": DEAD}}), None, tg + [
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}])},
            f"{g}/dead/redrive": {"post": _op(
                "Re-queue dead letters (all, or those in ids)", obj(["redriven"], {"redriven": INT}),
                obj([], {"ids": {"type": "array", "items": STR}}, closed=True), tg, body_required=False)},
            "/v1/stats": {"get": _op("Statistics", STATS)},
            "/v1/schedule": {"get": _op("Pending messages per due-time bucket", SCHEDULE, None, [
                {"name": n, "in": "query", "required": True, "schema": INT} for n in ("from", "to", "step_ms")])},
            "/v1/info": {"get": _op("Node identity", obj(["node_id", "version"], {"node_id": STR, "version": STR}))},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {
                "description": "Prometheus text format", "content": {"text/plain": {"schema": STR}}}}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {
                "description": "serving", "content": {"application/json": {"schema": STATUS}}}}}},
            "/readyz": {"get": {"summary": "Readiness", "responses": {
                "200": {"description": "recovered", "content": {"application/json": {"schema": STATUS}}},
                "503": {"description": "recovering", "content": {"application/json": {"schema": STATUS}}}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {
                "description": "OpenAPI 3", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
        },
    }
