"""API v1 as OpenAPI 3, kept beside the routes (broker.http) and tested against real answers."""

from __future__ import annotations

from typing import Any

NAME = {"type": "string", "pattern": r"^[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}$"}
INT = {"type": "integer"}
STR = {"type": "string"}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message"],
    "properties": {"code": STR, "message": STR, "index": INT}}}}
MESSAGE_IN = {"type": "object", "additionalProperties": False, "properties": {
    "body": STR, "body_b64": STR, "delay_ms": {"type": "integer", "minimum": 0}, "deliver_at": INT,
    "key": {"type": "string", "minLength": 1}, "tag": {"type": "string", "maxLength": 128},
    "headers": {"type": "object", "additionalProperties": STR}, "replace": {"type": "boolean"}}}
PRODUCED = {"type": "object", "required": ["messages"], "properties": {"messages": {"type": "array", "items": {
    "type": "object", "required": ["id", "deliver_at", "duplicate"],
    "properties": {"id": STR, "deliver_at": INT, "duplicate": {"type": "boolean"}}}}}}
VIEW_PROPS = {"id": STR, "topic": STR, "key": {"type": ["string", "null"]}, "tag": {"type": ["string", "null"]},
              "headers": {"type": "object"}, "body": STR, "body_b64": STR, "deliver_at": INT}
MESSAGE_VIEW = {"type": "object", "required": ["id", "topic", "deliver_at", "produced_at", "state"],
                "properties": {**VIEW_PROPS, "produced_at": INT,
                               "state": {"enum": ["scheduled", "delivered", "cancelled"]}}}
PULLED = {"type": "object", "required": ["id", "receipt", "topic", "deliver_at", "delivered_at", "attempt"],
          "properties": {**VIEW_PROPS, "receipt": STR, "delivered_at": INT, "attempt": INT}}
RECEIPTS = {"type": "object", "required": ["receipts"], "properties": {
    "receipts": {"type": "array", "items": STR}, "delay_ms": INT, "lease_ms": INT}}


def _params(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "in": "path", "required": True, "schema": NAME if n in ("topic", "group") else STR}
            for n in names]


def _op(summary: str, ok: dict[str, Any], body: dict[str, Any] | None = None,
        params: list[dict[str, Any]] | None = None, extra: dict[str, str] | None = None) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "OK", "content": {"application/json": {"schema": ok}}}}
    for code, text in {"400": "Bad input", **(extra or {})}.items():
        responses[code] = {"description": text, "content": {"application/json": {"schema": ERROR}}}
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body},
                                                           "application/msgpack": {"schema": body}}}
    return op


def spec() -> dict[str, Any]:
    t, g = "/v1/topics/{topic}", "/v1/topics/{topic}/subscriptions/{group}"
    obj = {"type": "object"}
    return {
        "openapi": "3.0.3",
        "info": {"title": "delayd API", "version": "1"},
        "paths": {
            f"{t}/messages": {"post": _op(
                "Schedule one message or a batch", PRODUCED,
                {"oneOf": [MESSAGE_IN, {"type": "object", "required": ["messages"], "properties": {
                    "messages": {"type": "array", "minItems": 1, "maxItems": 10000, "items": MESSAGE_IN}}}]},
                _params("topic"), {"413": "Too large", "415": "Unsupported type", "429": "Backpressure",
                                   "507": "Disk full"})},
            "/v1/messages/{id}": {
                "get": _op("Inspect a message", MESSAGE_VIEW, None, _params("id"), {"404": "Not found"}),
                "delete": _op("Cancel a message", {"type": "object", "required": ["id", "state"]}, None,
                              _params("id"), {"404": "Not found", "409": "Already delivered"})},
            f"{t}/keys/{{key}}": {
                "get": _op("Inspect the pending message with this key", MESSAGE_VIEW, None,
                           _params("topic", "key"), {"404": "Not found"}),
                "delete": _op("Cancel the pending message with this key", obj, None, _params("topic", "key"),
                              {"404": "Not found", "409": "Already delivered"})},
            g: {"put": _op("Create or update a subscription group", obj, {"type": "object", "properties": {
                "start": {"enum": ["earliest", "latest"]}, "max_attempts": INT}}, _params("topic", "group"))},
            f"{g}/pull": {"post": _op("Lease due messages", {"type": "object", "required": ["messages"],
                                                             "properties": {"messages": {"type": "array",
                                                                                         "items": PULLED}}},
                                      {"type": "object", "properties": {
                                          "max": INT, "wait_ms": INT, "lease_ms": INT,
                                          "tags": {"type": "array", "items": STR}}}, _params("topic", "group"))},
            f"{g}/ack": {"post": _op("Acknowledge", {"type": "object", "required": ["acked", "stale"]}, RECEIPTS,
                                     _params("topic", "group"))},
            f"{g}/nack": {"post": _op("Negative-acknowledge", {"type": "object", "required": ["stale"]}, RECEIPTS,
                                      _params("topic", "group"))},
            f"{g}/extend": {"post": _op("Extend leases", {"type": "object", "required": ["extended", "stale"]},
                                        RECEIPTS, _params("topic", "group"))},
            f"{g}/dead": {"get": _op("List dead letters", {"type": "object", "required": ["messages"]}, None,
                                     _params("topic", "group") + [{"name": "limit", "in": "query",
                                                                   "schema": INT}])},
            f"{g}/dead/redrive": {"post": _op("Re-queue dead letters", obj, {"type": "object", "properties": {
                "ids": {"type": "array", "items": STR}}}, _params("topic", "group"))},
            "/v1/stats": {"get": _op("Statistics", {"type": "object", "required": [
                "scheduled", "produced_total", "delivered_total", "cancelled_total", "lateness_ms", "topics",
                "groups", "pipeline", "disk_bytes"]})},
            "/v1/schedule": {"get": _op("Pending messages per due-time bucket", {
                "type": "object", "required": ["buckets"]}, None, [
                {"name": n, "in": "query", "required": True, "schema": INT} for n in ("from", "to", "step_ms")])},
            "/v1/info": {"get": _op("Node identity", {"type": "object", "required": ["node_id", "version"]})},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "OK"}}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "serving"}}}},
            "/readyz": {"get": {"summary": "Readiness", "responses": {"200": {"description": "recovered"},
                                                                      "503": {"description": "recovering"}}}},
        },
    }
