"""API v1 (docs/api.md) as an OpenAPI 3.0 document, kept beside the routes (broker.http).

Tested three ways: openapi-spec-validator checks the document itself; every endpoint's real
answers are validated against these schemas (tests/integration/test_observe.py); schemathesis
generates requests from it against a live daemon (tests/robustness/test_schemathesis.py).

Shapes used by more than one operation live in `components` and are referenced with `$ref`.
"""

from __future__ import annotations

from typing import Any

from delayd.storage.batch_pull import PULL_FIELDS

from delayd import __version__

MAX_HOURS_MS = 12 * 3_600_000
JSON = "application/json"
MSGPACK = "application/msgpack"


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props: dict[str, Any], required: tuple[str, ...] = (), closed: bool = False) -> dict[str, Any]:
    """An object schema. `closed` (no other fields) is how request bodies are validated: the
    daemon refuses unknown fields. OpenAPI 3.0 forbids an empty `required` list, so none is
    written when nothing is required."""
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


INT = {"type": "integer"}
COUNT = {"type": "integer", "minimum": 0}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
NULLABLE_STR = {"type": "string", "nullable": True}
EPOCH_MS = {"type": "integer", "minimum": 0, "description": "epoch milliseconds (UTC)"}
RECEIPTS = {"type": "array", "items": STR, "maxItems": 10_000}
LEASE = {"type": "integer", "minimum": 1000, "maximum": MAX_HOURS_MS}
HEADERS = {"type": "object", "additionalProperties": STR}
BODY_PROPS = {"body": {"type": "string", "description": "UTF-8 text (bytes in msgpack)"},
              "body_b64": {"type": "string", "description": "base64 of a binary body (JSON only)"}}
# A message as the daemon shows it: JSON answers carry `body` (UTF-8 text) or `body_b64`.
VIEW_PROPS = {"id": STR, "topic": STR, "key": NULLABLE_STR, "tag": NULLABLE_STR, "headers": HEADERS,
              **BODY_PROPS, "deliver_at": EPOCH_MS}
VIEW_REQUIRED = ("id", "topic", "key", "tag", "headers", "deliver_at")


def count_map(*fields: str) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": obj({f: COUNT for f in fields}, fields)}


SCHEMAS: dict[str, Any] = {
    "Error": obj({"error": obj({"code": {"type": "string", "pattern": "^[a-z_]+$"}, "message": STR,
                                "index": {"type": "integer", "minimum": 0}}, ("code", "message"))},
                 ("error",)),
    "MessageIn": {
        **obj({**BODY_PROPS,
               "delay_ms": {"type": "integer", "minimum": 0},
               "deliver_at": {"oneOf": [{"type": "integer", "minimum": 0},
                                        {"type": "string", "format": "date-time",
                                         "description": "ISO 8601 with a zone (Z or +hh:mm); "
                                                        "a time without a zone is refused"}]},
               "key": {"type": "string", "minLength": 1, "description": "1-256 UTF-8 bytes"},
               "tag": {"type": "string", "maxLength": 128},
               "headers": {**HEADERS, "maxProperties": 64},
               "replace": BOOL}, closed=True),
        # Exactly one of body / body_b64; at most one of delay_ms / deliver_at.
        "oneOf": [{"required": ["body"]}, {"required": ["body_b64"]}],
        "not": {"required": ["delay_ms", "deliver_at"]},
    },
    "ProduceBatch": obj({"messages": {"type": "array", "minItems": 1, "maxItems": 10_000,
                                      "items": ref("MessageIn")}}, ("messages",), closed=True),
    "Produced": obj({"messages": {"type": "array", "items": obj(
        {"id": STR, "deliver_at": EPOCH_MS, "duplicate": BOOL}, ("id", "deliver_at", "duplicate"))}},
        ("messages",)),
    "Cancelled": obj({"id": STR, "state": {"type": "string", "enum": ["cancelled"]}}, ("id", "state")),
    "MessageView": obj({**VIEW_PROPS, "produced_at": EPOCH_MS,
                        "state": {"type": "string", "enum": ["scheduled", "delivered", "cancelled"]}},
                       (*VIEW_REQUIRED, "produced_at", "state")),
    "SubscriptionSettings": obj({"start": {"type": "string", "enum": ["earliest", "latest"]},
                                 "max_attempts": {"type": "integer", "minimum": 1, "maximum": 1000},
                                 "push": ref("PushIn")},
                                closed=True),
    # Push subscriptions (docs/push.md): the PUT's `push` object, and what answers show of it (never the secret).
    "PushIn": {**obj({
        "url": {"type": "string", "minLength": 1, "maxLength": 2048, "pattern": "^https?://[^\\s]+$"},
        "timeout_ms": {"type": "integer", "minimum": 100, "maximum": 600_000},
        "max_in_flight": {"type": "integer", "minimum": 1, "maximum": 1000},
        "secret": {"type": "string", "nullable": True, "minLength": 16, "maxLength": 256},
        "format": {"type": "string", "enum": ["json", "msgpack"]}}, ("url",), closed=True), "nullable": True},
    "PushView": obj({"url": STR, "timeout_ms": INT, "max_in_flight": INT,
                     "format": {"type": "string", "enum": ["json", "msgpack"]}, "secret_fingerprint": NULLABLE_STR},
                    ("url", "timeout_ms", "max_in_flight", "format", "secret_fingerprint")),
    "Pushed": obj({**VIEW_PROPS, "group": STR, "delivered_at": EPOCH_MS, "attempt": {"type": "integer", "minimum": 1}},
                  (*VIEW_REQUIRED, "group", "delivered_at", "attempt")),
    "Subscription": obj({"topic": STR, "group": STR, "start": {"type": "string", "enum": ["earliest", "latest"]},
                         "max_attempts": {"type": "integer", "minimum": 1}, "push": ref("PushView")},
                        ("topic", "group", "start", "max_attempts")),
    "SubscriptionStatus": {"allOf": [ref("Subscription"), obj(
        {"backlog": COUNT, "inflight": COUNT, "dead": COUNT, "oldest_unacked_age_ms": COUNT},
        ("backlog", "inflight", "dead", "oldest_unacked_age_ms"))]},
    "SubscriptionDeleted": obj({"topic": STR, "group": STR, "deleted": {"type": "boolean", "enum": [True]}},
                               ("topic", "group", "deleted")),
    "PullRequest": obj({"max": {"type": "integer", "minimum": 1, "maximum": 1000},
                        "wait_ms": {"type": "integer", "minimum": 0, "maximum": 30_000},
                        "lease_ms": LEASE, "tags": {"type": "array", "items": STR, "maxItems": 1000},
                        "fields": {"type": "array", "maxItems": 100,
                                   "items": {"type": "string", "enum": list(PULL_FIELDS)}}},
                       closed=True),
    # Every field, unless the pull's `fields` named fewer: then id, receipt and those.
    "PulledMessage": obj({**VIEW_PROPS, "receipt": STR, "delivered_at": EPOCH_MS,
                          "attempt": {"type": "integer", "minimum": 1}}, ("id", "receipt")),
    "Pulled": obj({"messages": {"type": "array", "items": ref("PulledMessage")}}, ("messages",)),
    "AckRequest": obj({"receipts": RECEIPTS}, ("receipts",), closed=True),
    "Acked": obj({"acked": COUNT, "stale": RECEIPTS}, ("acked", "stale")),
    "NackRequest": obj({"receipts": RECEIPTS, "delay_ms": {"type": "integer", "minimum": 0,
                                                           "maximum": MAX_HOURS_MS}},
                       ("receipts",), closed=True),
    "Nacked": obj({"nacked": COUNT, "stale": RECEIPTS}, ("nacked", "stale")),
    "ExtendRequest": obj({"receipts": RECEIPTS, "lease_ms": LEASE}, ("receipts", "lease_ms"), closed=True),
    "Extended": obj({"extended": COUNT, "stale": RECEIPTS}, ("extended", "stale")),
    "DeadLetter": obj({**VIEW_PROPS, "produced_at": EPOCH_MS, "attempt": COUNT, "reason": STR},
                      ("id", "attempt", "reason")),
    "DeadLetters": obj({"messages": {"type": "array", "items": ref("DeadLetter")}}, ("messages",)),
    "RedriveRequest": obj({"ids": {"type": "array", "items": STR, "maxItems": 10_000}}, closed=True),
    "Redriven": obj({"redriven": COUNT}, ("redriven",)),
    "Stats": obj({
        "node_id": STR, "scheduled": COUNT, "produced_total": COUNT, "delivered_total": COUNT,
        "cancelled_total": COUNT, "rolled_total": COUNT,
        "lateness_ms": obj({"p50": INT, "p99": INT, "max": INT}, ("p50", "p99", "max")),
        "topics": count_map("scheduled", "delivered_total"),
        "groups": {"type": "object", "additionalProperties": obj(
            {"backlog": COUNT, "inflight": COUNT, "dead": COUNT, "oldest_unacked_age_ms": COUNT},  # oldest_unacked_age_ms: addition
            ("backlog", "inflight", "dead"))},
        "pipeline": {"type": "object", "additionalProperties": COUNT},
        "pipeline_state": {"type": "object", "additionalProperties": {
            "type": "string", "enum": ["initial", "running", "waiting", "end"]}},  # addition
        "disk_bytes": COUNT,
        "recovery_seconds": {"type": "number", "minimum": 0}, "wall_clock_skew_ms": INT},
        ("scheduled", "produced_total", "delivered_total", "cancelled_total", "lateness_ms", "topics", "groups",
         "pipeline", "disk_bytes")),
    "Schedule": obj({"buckets": {"type": "array", "maxItems": 10_000, "items": {
        "type": "array", "items": INT, "minItems": 2, "maxItems": 2}}}, ("buckets",)),
    "Info": obj({"node_id": STR, "version": STR,
                 # (addition) replication: this member's role and the primary it knows.
                 "role": {"type": "string", "enum": ["primary", "follower", "candidate"]},
                 "primary": NULLABLE_STR}, ("node_id", "version")),
    # (addition) Replication: a follower's 421 names the primary; GET /v1/cluster describes the shard.
    "NotPrimaryError": obj({"error": obj({"code": {"type": "string", "enum": ["not_primary"]}, "message": STR,
                                          "primary": {**NULLABLE_STR, "description": "the primary's advertised "
                                                      "URL; null while this member knows none"}},
                                         ("code", "message", "primary"))}, ("error",)),
    "ClusterMember": obj({"member": STR, "url": STR,
                          "role": {"type": "string", "enum": ["primary", "follower", "candidate"]},
                          "in_sync": BOOL, "registered": BOOL, "log_end": COUNT, "lag_bytes": COUNT, "lag_ms": COUNT},
                         ("member", "url", "role", "in_sync", "registered")),
    "ClusterReplicated": obj({
        "shard": STR, "epoch": COUNT,
        "primary": {**obj({"member": STR, "url": STR, "epoch": COUNT}, ("member", "url", "epoch")), "nullable": True},
        "isr": obj({"epoch": COUNT, "members": {"type": "array", "items": STR}, "revision": COUNT},
                   ("epoch", "members")),
        "members": {"type": "array", "items": ref("ClusterMember")},
        "replication": {"type": "boolean", "enum": [True]},
        "role": {"type": "string", "enum": ["primary", "follower", "candidate"]},
        "log_end": COUNT, "primary_log_end": COUNT,
        "read_time_ms": {**EPOCH_MS, "description": "the answering member's durable dequeue cursor"},
        "self": obj({"member": STR, "role": {"type": "string", "enum": ["primary", "follower", "candidate"]},
                     "epoch": COUNT, "may_acknowledge": BOOL, "fence_left_ms": {"type": "integer", "nullable": True}},
                    ("member", "role", "epoch", "may_acknowledge", "fence_left_ms"))},
        ("shard", "epoch", "primary", "isr", "members", "self")),
    "ClusterSingle": obj({"replication": {"type": "boolean", "enum": [False]}, "shard": STR,
                          "role": {"type": "string", "enum": ["primary"]}}, ("replication", "shard", "role")),
    "Cluster": {"oneOf": [ref("ClusterReplicated"), ref("ClusterSingle")]},
    # (addition) GET /v1/topics/{topic}/messages and GET /v1/messages: pending messages in due order.
    "Listed": obj({**VIEW_PROPS, "produced_at": EPOCH_MS, "body_size": COUNT}, (*VIEW_REQUIRED, "produced_at", "body_size")),
    "Listing": obj({"messages": {"type": "array", "maxItems": 1000, "items": ref("Listed")},
                    "next_cursor": NULLABLE_STR}, ("messages", "next_cursor")),
    "Status": obj({"status": STR}, ("status",)),
}

ERRORS = {
    "400": "Bad input (invalid_message, invalid_name, invalid_parameter, invalid_json, ...)",
    "401": "Missing or wrong bearer token (only when tokens are configured)",
    "403": "The token may not do this, or not on this topic",
    "404": "No such message, key or subscription",
    "405": "Method not allowed on this path",
    "408": "The request body did not arrive in time",
    "409": "Already delivered: too late to cancel (a pull on a push subscription: push_subscription)",
    "413": "The body is over max_request_bytes (1 MiB for bodies other than a produce's) or "
           "max_request_elements (docs/api.md, Limits)",
    "415": "Content-Type is neither application/json nor application/msgpack",
    "421": "not_primary: this member is a follower of a replicated shard; nothing was done. Send the request "
           "to error.primary (docs/api.md, Replication)",
    "429": "Backpressure: indexing is behind; retry after Retry-After seconds",
    "503": "Recovery is still running (not_ready), or the broker is out of file descriptors (unavailable); "
           "with replication: no primary is known (no_primary), too few in-sync members to accept a write "
           "(insufficient_replicas; nothing stored), or a stored write lost copies while it waited "
           "(under_replicated; outcome uncertain). Retry after Retry-After seconds",
    "507": "Disk full (or a failed fsync): nothing was stored",
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying",
                               "schema": {"type": "integer", "minimum": 1}}}
PARAMETERS = {
    "topic": {"name": "topic", "in": "path", "required": True, "description": "topic name",
              "schema": {"type": "string", "pattern": r"^[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}$"}},
    "group": {"name": "group", "in": "path", "required": True, "description": "subscription group name",
              "schema": {"type": "string", "pattern": r"^[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}$"}},
    "id": {"name": "id", "in": "path", "required": True, "description": "message id ({node_id}-{n})",
           "schema": STR},
    "key": {"name": "key", "in": "path", "required": True, "description": "business key, 1-256 UTF-8 bytes",
            "schema": {"type": "string", "minLength": 1}},
}


def content(schema: dict[str, Any]) -> dict[str, Any]:
    """Requests and answers come in JSON or msgpack (the answer in the request's format)."""
    return {JSON: {"schema": schema}, MSGPACK: {"schema": schema}}


def params(*names: str) -> list[dict[str, str]]:
    return [{"$ref": f"#/components/parameters/{n}"} for n in names]


def op(operation_id: str, summary: str, ok: str, errors: tuple[str, ...], *, path: tuple[str, ...] = (),
       body: str | dict[str, Any] | None = None, body_required: bool = True,
       query: list[dict[str, Any]] | None = None, primary_only: bool = True) -> dict[str, Any]:
    """One operation. Every operation may also answer 400 (bad input), 401/403 (auth), 405 and
    503 (recovery), so those are always listed; `errors` adds the operation's own. `primary_only`:
    a follower of a replicated shard answers it 421 (every /v1 operation except those a member
    answers about itself: info, cluster, stats, schedule)."""
    codes = sorted({"400", "401", "403", "405", "503", *errors, *(("408", "413", "415") if body else ()),
                    *(("421",) if primary_only else ())})
    responses: dict[str, Any] = {"200": {"description": "OK", "content": content(ref(ok))}}
    for code in codes:
        responses[code] = {"$ref": f"#/components/responses/E{code}"}
    out: dict[str, Any] = {"operationId": operation_id, "summary": summary, "responses": responses}
    parameters = params(*path) + (query or [])
    if parameters:
        out["parameters"] = parameters
    if body is not None:
        out["requestBody"] = {"required": body_required,
                              "content": content(ref(body) if isinstance(body, str) else body)}
    return out


PUSH_HEADERS = [("Delayd-Id", True), ("Delayd-Topic", True), ("Delayd-Group", True), ("Delayd-Deliver-At", True),
                ("Delayd-Delivered-At", True), ("Delayd-Attempt", True), ("Delayd-Key", False),
                ("Delayd-Tag", False), ("Delayd-Signature", False)]


def push_callback() -> dict[str, Any]:
    """The POST the daemon sends to a push subscription's URL (an OpenAPI 3.0 callback)."""
    return {"push": {"{$request.body#/push/url}": {"post": {
        "summary": "A due message, pushed (signed when the subscription has a secret; see docs/push.md)",
        "parameters": [{"name": n, "in": "header", "required": r, "schema": STR} for n, r in PUSH_HEADERS],
        "requestBody": {"required": True, "content": content(ref("Pushed"))},
        "responses": {"2XX": {"description": "Acknowledged: never delivered to this group again"},
                      "default": {"description": "Anything else, a timeout or a connection error: redelivered "
                                                 "after the group's backoff (Retry-After on 429/503), dead "
                                                 "letter after max_attempts"}}}}}}


def plain(operation_id: str, summary: str, responses: dict[str, Any]) -> dict[str, Any]:
    """The unversioned endpoints (health, readiness, this document): no token needed."""
    return {"operationId": operation_id, "summary": summary, "security": [], "responses": responses}


LIST_QUERY = [
    {"name": "from", "in": "query", "schema": {"type": "integer", "minimum": 0}},
    {"name": "to", "in": "query", "schema": {"type": "integer", "minimum": 0}},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
    {"name": "cursor", "in": "query", "schema": STR},
    {"name": "body", "in": "query", "schema": BOOL},
]


def spec() -> dict[str, Any]:
    t, g = "/v1/topics/{topic}", "/v1/topics/{topic}/subscriptions/{group}"
    tg = ("topic", "group")
    return {
        "openapi": "3.0.3",
        "info": {"title": "delayd API", "version": __version__,
                 "description": "The delayd HTTP API v1 (docs/api.md). Bearer tokens are required only "
                                "when the daemon is configured with tokens."},
        "security": [{"bearer": []}],
        "paths": {
            f"{t}/messages": {"post": op(
                "produce", "Schedule one message or a batch (all-or-nothing)", "Produced", ("429", "507"),
                path=("topic",), body={"oneOf": [ref("MessageIn"), ref("ProduceBatch")]}),
                "get": op("listTopicMessages", "List the topic's pending messages in due order, a page at a time",
                          "Listing", (), path=("topic",), query=LIST_QUERY)},
            "/v1/messages": {"get": op("listMessages", "List every topic's pending messages in due order (admin)",
                                       "Listing", (), query=LIST_QUERY)},
            "/v1/messages/{id}": {
                "get": op("getMessage", "Inspect a message", "MessageView", ("404",), path=("id",)),
                "delete": op("cancelMessage", "Cancel a message (idempotent)", "Cancelled", ("404", "409", "507"),
                             path=("id",))},
            f"{t}/keys/{{key}}": {
                "get": op("getMessageByKey", "Inspect the pending message with this key", "MessageView", ("404",),
                          path=("topic", "key")),
                "delete": op("cancelMessageByKey", "Cancel the pending message with this key", "Cancelled",
                             ("404", "409", "507"), path=("topic", "key"))},
            g: {
                "put": {**op("putSubscription", "Create or update a subscription group (pull, or push with `push`)",
                             "Subscription", ("507",), path=tg, body="SubscriptionSettings", body_required=False),
                        "callbacks": push_callback()},
                "get": op("getSubscription", "A subscription's settings and counts (does not create it)",
                          "SubscriptionStatus", ("404",), path=tg),
                "delete": op("deleteSubscription", "Delete a subscription group and its state (404 if none)",
                             "SubscriptionDeleted", ("404", "507"), path=tg)},
            f"{g}/pull": {"post": op("pull", "Lease due messages (409 push_subscription on a push group)", "Pulled",
                                     ("409", "507"), path=tg, body="PullRequest", body_required=False)},
            f"{g}/ack": {"post": op("ack", "Acknowledge", "Acked", ("507",), path=tg, body="AckRequest")},
            f"{g}/nack": {"post": op("nack", "Redeliver after delay_ms (default: exponential backoff)",
                                     "Nacked", ("507",), path=tg, body="NackRequest")},
            f"{g}/extend": {"post": op("extend", "Extend leases", "Extended", (), path=tg, body="ExtendRequest")},
            f"{g}/dead": {"get": op("listDeadLetters", "List dead letters", "DeadLetters", (), path=tg, query=[
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}])},
            f"{g}/dead/redrive": {"post": op(
                "redrive", "Re-queue dead letters (all, or those in ids)", "Redriven", ("507",), path=tg,
                body="RedriveRequest", body_required=False)},
            "/v1/stats": {"get": op("stats", "Statistics", "Stats", (), primary_only=False)},
            "/v1/schedule": {"get": op("schedule", "Pending messages per due-time bucket", "Schedule", (), query=[
                {"name": n, "in": "query", "required": True, "schema": INT} for n in ("from", "to", "step_ms")],
                primary_only=False)},
            "/v1/info": {"get": op("info", "Node identity and version (with replication: role, primary)", "Info", (),
                                   primary_only=False)},
            "/v1/cluster": {"get": op("cluster", "The shard's members, roles, epoch, in-sync set and lag "
                                      "(replication; any member answers)", "Cluster", (), primary_only=False)},
            "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics (admin right)",
                                 "responses": {
                                     "200": {"description": "Prometheus text format",
                                             "content": {"text/plain": {"schema": STR}}},
                                     "401": {"$ref": "#/components/responses/E401"},
                                     "403": {"$ref": "#/components/responses/E403"}}}},
            "/healthz": {"get": plain("healthz", "Liveness: 200 while the process serves", {
                "200": {"description": "serving", "content": {JSON: {"schema": ref("Status")}}}})},
            "/readyz": {"get": plain("readyz", "Readiness: 200 once recovery is complete", {
                "200": {"description": "recovered", "content": {JSON: {"schema": ref("Status")}}},
                "503": {"description": "recovering or failed", "content": {JSON: {"schema": ref("Status")}}}})},
            "/openapi.json": {"get": plain("openapi", "This document", {"200": {
                "description": "OpenAPI 3", "content": {JSON: {"schema": {"type": "object"}}}}})},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a token of the daemon's [[auth.tokens]]"}},
            "parameters": PARAMETERS,
            "schemas": SCHEMAS,
            "responses": {f"E{code}": {
                "description": text, "content": content(ref("NotPrimaryError" if code == "421" else "Error")),
                **({"headers": RETRY_AFTER} if code in ("429", "503") else {})} for code, text in ERRORS.items()},
        },
    }
