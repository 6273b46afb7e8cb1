"""Observing a real daemon: /v1/stats, /v1/schedule, /metrics, health, and /openapi.json — the
document itself and every endpoint's real answers validated against it (API.md, Observe).
"""

from __future__ import annotations

import json
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate as validate_openapi_document
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.wire import JSON, MSGPACK, Api, Resp, daemon_log_clean, now_ms, ok
from tests.support.daemon import ROOT, DaemonProcess, wait_until

SUB = "/v1/topics/{topic}/subscriptions/{group}"
# The endpoints of the original contract (docs/api.md above "## Additions");
# test_api_md_paths_match_the_lists_tested_here checks both lists against the document.
API_MD_PATHS = {
    ("POST", "/v1/topics/{topic}/messages"), ("DELETE", "/v1/messages/{id}"),
    ("DELETE", "/v1/topics/{topic}/keys/{key}"), ("GET", "/v1/messages/{id}"),
    ("GET", "/v1/topics/{topic}/keys/{key}"), ("PUT", SUB), ("POST", f"{SUB}/pull"), ("POST", f"{SUB}/ack"),
    ("POST", f"{SUB}/nack"), ("POST", f"{SUB}/extend"), ("GET", f"{SUB}/dead"), ("POST", f"{SUB}/dead/redrive"),
    ("GET", "/v1/stats"), ("GET", "/v1/schedule"), ("GET", "/metrics"), ("GET", "/healthz"), ("GET", "/readyz"),
    ("GET", "/openapi.json"),
}
# The endpoints docs/api.md's "## Additions" section adds.
ADDED_PATHS = {("GET", "/v1/info"), ("GET", SUB), ("DELETE", SUB), ("GET", "/v1/topics/{topic}/messages"),
               ("GET", "/v1/messages"), ("GET", "/v1/cluster")}
# The contract lives in the repository; a clone without it is broken, so this is never skipped.
API_MD = ROOT / "docs" / "api.md"
STAGES = {"enqueue_get", "enqueue_put", "dequeue_get", "dequeue_get_message", "dequeue_put"}


@pytest.fixture(scope="module")
def spec(daemon: DaemonProcess) -> dict[str, Any]:
    return ok(Api(daemon).call("GET", "/openapi.json"))


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate(spec: dict[str, Any], schema: dict[str, Any], value: Any) -> list[str]:
    """Errors of `value` against an OpenAPI 3.0 schema of `spec` ([] when valid), by the
    openapi-schema-validator library; `$ref`s resolve against the spec's components."""
    validator = OAS30Validator({**schema, "components": spec["components"]})
    return [f"{'.'.join(map(str, e.absolute_path)) or '$'}: {e.message}" for e in validator.iter_errors(value)]


def test_validator_catches_what_it_claims(spec: dict[str, Any]) -> None:
    view = {"$ref": "#/components/schemas/MessageView"}
    good = {"id": "d-1", "topic": "t", "key": None, "tag": None, "headers": {}, "body": "x", "deliver_at": 1,
            "produced_at": 1, "state": "scheduled"}
    assert validate(spec, view, good) == []
    assert validate(spec, view, {**good, "state": "lost"}) != []
    assert validate(spec, view, {**good, "deliver_at": True}) != [], "a boolean is not an integer"
    assert validate(spec, view, {k: v for k, v in good.items() if k != "id"}) != []
    message_in = {"$ref": "#/components/schemas/MessageIn"}
    assert validate(spec, message_in, {"body": "x", "deliver_at": "2027-01-01T08:00:00Z"}) == []
    assert validate(spec, message_in, {"body": "x", "body_b64": "eA=="}) != [], "exactly one body form"
    assert validate(spec, message_in, {"body": "x", "delay_ms": 1, "deliver_at": 2}) != []
    assert validate(spec, message_in, {"body": "x", "bogus": 1}) != []


def response_schema(spec: dict[str, Any], method: str, template: str, status: int) -> dict[str, Any] | None:
    op = spec["paths"][template][method.lower()]
    assert str(status) in op["responses"], f"{method} {template} answered {status}, which the spec does not list"
    response = op["responses"][str(status)]
    if "$ref" in response:  # "#/components/responses/E404"
        response = spec["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    return response.get("content", {}).get("application/json", {}).get("schema")


def check(spec: dict[str, Any], resp: Resp, method: str, template: str) -> Any:
    """The response's status is documented for this operation and its body fits the schema."""
    schema = response_schema(spec, method, template, resp.status)
    body = resp.body if resp.content_type in (JSON, MSGPACK) else resp.raw
    if schema is not None:
        errs = validate(spec, schema, body)
        assert not errs, f"{method} {template} -> {resp.status}: {errs[:5]}\n{body!r:.500}"
    return body


# -- stats ----------------------------------------------------------------------------------------
def test_stats_has_every_field_with_the_right_types_and_true_values(api: Api) -> None:
    t = "stats-t"
    before = api.stats()
    sent = api.produce(t, *({"body": str(i)} for i in range(3)),
                       *({"body": "later", "delay_ms": 600_000} for _ in range(2)))
    ok(api.call("DELETE", f"/v1/messages/{sent[3]['id']}"))
    wait_until(lambda: api.stats()["topics"].get(t, {}).get("delivered_total") == 3, 10, what="3 delivered")
    got = api.pull_until(t, "g", 2)
    wait_until(lambda: api.stats()["scheduled"] - before["scheduled"] == 1, 10, what="scheduled settles")
    s = api.stats()
    for field in ("scheduled", "produced_total", "delivered_total", "cancelled_total", "disk_bytes"):
        assert is_int(s[field]) and s[field] >= 0, (field, s[field])
    assert s["produced_total"] - before["produced_total"] == 5
    assert s["delivered_total"] - before["delivered_total"] == 3
    assert s["cancelled_total"] - before["cancelled_total"] == 1
    assert s["disk_bytes"] > 0
    lat = s["lateness_ms"]
    assert set(lat) >= {"p50", "p99", "max"} and all(is_int(v) for v in lat.values())
    assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"]
    assert s["topics"][t]["scheduled"] == 1 and s["topics"][t]["delivered_total"] == 3
    assert all(is_int(v) for c in s["topics"].values() for v in c.values())
    g = s["groups"][f"{t}/g"]
    assert {k: g[k] for k in ("backlog", "inflight", "dead")} == {"backlog": 1, "inflight": 2, "dead": 0}
    # (addition) the oldest unacked message became due when it was delivered, moments ago
    assert is_int(g["oldest_unacked_age_ms"]) and 0 <= g["oldest_unacked_age_ms"] < 60_000
    assert all(set(c) >= {"backlog", "inflight", "dead"} and all(is_int(v) for v in c.values())
               for c in s["groups"].values())
    assert set(s["pipeline"]) >= STAGES and all(is_int(v) and v >= 0 for v in s["pipeline"].values())
    api.ack(t, "g", [m["receipt"] for m in got])
    g = api.stats()["groups"][f"{t}/g"]
    assert {k: g[k] for k in ("backlog", "inflight", "dead")} == {"backlog": 1, "inflight": 0, "dead": 0}


def test_stats_in_msgpack(api: Api) -> None:
    resp = api.call("GET", "/v1/stats", accept=MSGPACK)
    assert resp.content_type == MSGPACK and is_int(resp.body["scheduled"])


# -- schedule -------------------------------------------------------------------------------------
def schedule(api: Api, start: int, end: int, step: int) -> list[list[int]]:
    return ok(api.call("GET", f"/v1/schedule?from={start}&to={end}&step_ms={step}"))["buckets"]


def test_schedule_buckets_equal_the_true_pending_counts(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        api = Api(d)
        step = 10_000
        base = (now_ms() // step + 4) * step  # 30-40 s ahead; 27 buckets reach ~300 s ahead
        rng = random.Random(11)
        due = [base + b * step + rng.randrange(step) for b in range(27) for _ in range(rng.randint(0, 6))]
        due += [base + 5 * step] * 4 + [base + 9 * step - 1] * 3  # bucket edges
        sent = api.produce("sched", *({"body": "x", "deliver_at": t} for t in due))
        cancelled = {p["id"] for p in sent[::3]}
        for i in cancelled:
            ok(api.call("DELETE", f"/v1/messages/{i}"))
        pending = [p["deliver_at"] for p in sent if p["id"] not in cancelled]
        expect = [[base + b * step, sum(1 for t in pending if base + b * step <= t < base + (b + 1) * step)]
                  for b in range(27)]
        wait_until(lambda: schedule(api, base, base + 27 * step, step) == expect, 10, 0.05,
                   "schedule to match the pending messages")
        # Finer buckets over the first minute, and one bucket over everything.
        fine = [[base + s * 1000, sum(1 for t in pending if base + s * 1000 <= t < base + (s + 1) * 1000)]
                for s in range(60)]
        assert schedule(api, base, base + 60_000, 1000) == fine
        assert schedule(api, base - 30_000, base + 300_000, 330_000) == [[base - 30_000, len(pending)]]
        assert api.stats()["scheduled"] == len(pending)
        # Nothing before or after.
        assert all(c == 0 for _, c in schedule(api, base - 60_000, base, 1000))
        assert all(c == 0 for _, c in schedule(api, base + 27 * step, base + 27 * step + 60_000, 1000))
    finally:
        d.stop()
    daemon_log_clean(d)


def test_schedule_counts_far_messages_by_the_hour(tmp_path) -> None:
    """Beyond the timer wheel (default 2 days) the schedule is kept per hour of due time."""
    d = DaemonProcess(tmp_path / "data").start()
    try:
        api = Api(d)
        hour = 3_600_000
        h0 = (now_ms() // hour + 72) * hour
        sent = api.produce("far", *({"body": "x", "deliver_at": h0 + 60_000 * i} for i in range(5)),
                           *({"body": "y", "deliver_at": h0 + 2 * hour + 1} for _ in range(2)))
        ok(api.call("DELETE", f"/v1/messages/{sent[0]['id']}"))
        wait_until(lambda: schedule(api, h0, h0 + 3 * hour, hour) == [[h0, 4], [h0 + hour, 0], [h0 + 2 * hour, 2]],
                   10, 0.05, "far schedule")
        assert api.stats()["scheduled"] == 6
    finally:
        d.stop()


def test_schedule_from_not_aligned_to_the_timer_precision_loses_nothing(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        api = Api(d)
        base = (now_ms() // 1000 + 60) * 1000
        api.produce("unaligned", {"body": "x", "deliver_at": base + 600}, {"body": "y", "deliver_at": base + 1200})
        wait_until(lambda: sum(c for _, c in schedule(api, base, base + 2000, 1000)) == 2, 10, what="indexed")
        # [base+500, base+1500) holds both messages; [base+500, base+3500) in one bucket as well.
        assert sum(c for _, c in schedule(api, base + 500, base + 3500, 1000)) == 2
        assert schedule(api, base + 500, base + 3500, 3000) == [[base + 500, 2]]
    finally:
        d.stop()


def test_schedule_queries_do_not_delay_deliveries(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        api = Api(d)
        done = threading.Event()

        def poll_schedule() -> None:  # what a dashboard refreshing a 3-day view does, twice over
            while not done.is_set():
                n = now_ms()
                assert api.call("GET", f"/v1/schedule?from={n}&to={n + 3 * 86_400_000}&step_ms=3600000").status == 200

        base = now_ms() + 1000
        api.produce("lat", *({"body": "x", "deliver_at": base + i * 25} for i in range(40)))
        with ThreadPoolExecutor(2) as pool:
            polls = [pool.submit(poll_schedule) for _ in range(2)]
            try:
                got = api.pull_until("lat", "g", 40, timeout_s=20)
            finally:
                done.set()
            for f in polls:
                f.result()
        late = sorted(m["delivered_at"] - m["deliver_at"] for m in got)
        assert late[int(len(late) * 0.9)] < 100, f"lateness p50 {late[20]} ms, max {late[-1]} ms"
    finally:
        d.stop()


# -- metrics, health ------------------------------------------------------------------------------
def metric_names_in_source() -> set[str]:
    """Every metric broker/metrics.py defines; counters are exposed (and parsed) without `_total`."""
    text = (ROOT / "broker" / "metrics.py").read_text()
    names = set(re.findall(r'"(delayd_[a-z0-9_]+)"', text))
    assert len(names) >= 10, names
    return {n.removesuffix("_total") for n in names}


def test_metrics_parse_and_carry_every_metric_with_true_values(api: Api) -> None:
    t = "metrics-t"
    api.produce(t, {"body": "a"}, {"body": "b"}, {"body": "c", "delay_ms": 600_000})
    (m,) = api.pull_until(t, "g", 1)
    api.ack(t, "g", [m["receipt"]])
    wait_until(lambda: api.stats()["topics"][t]["delivered_total"] == 2, 10, what="delivered")
    resp = api.call("GET", "/metrics")
    assert resp.status == 200 and resp.content_type == "text/plain", resp.headers
    families = {f.name: f for f in text_string_to_metric_families(resp.raw.decode())}
    # (delayd_replication_* exist on members of a replicated shard only: tests/replication)
    missing = {n for n in metric_names_in_source() - set(families) if not n.startswith("delayd_replication_")}
    assert not missing, f"metrics missing from /metrics: {sorted(missing)}"

    def sample(family: str, suffix: str = "", **labels: str) -> float:
        vals = [s.value for s in families[family].samples
                if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(vals) == 1, (family, labels, families[family].samples[:5])
        return vals[0]

    s = api.stats()
    assert sample("delayd_produced", "_total", topic=t) == 3
    assert sample("delayd_delivered", "_total", topic=t) == 2
    assert sample("delayd_topic_scheduled_messages", topic=t) == 1
    assert sample("delayd_acked", "_total", topic=t, group="g") == 1
    assert sample("delayd_group_backlog", topic=t, group="g") == s["groups"][f"{t}/g"]["backlog"] == 1
    assert sample("delayd_group_inflight", topic=t, group="g") == 0
    assert sample("delayd_scheduled_messages") == s["scheduled"]
    assert sample("delayd_disk_bytes") > 0
    assert {s.labels["stage"] for s in families["delayd_stage_queue_depth"].samples} >= STAGES
    assert sample("delayd_lateness_seconds", "_count") >= 2


def test_metrics_users_of_sqs_and_rocketmq_expect(api: Api) -> None:
    """Build info, request duration by route template and status, fsync duration, the age of
    each group's oldest due and unacked message, and lateness buckets past a minute."""
    from delayd import __version__
    t = "expect-t"
    past = now_ms() - 90_000  # due 90 s ago: released now, 90 s late, and 90 s old for the group
    api.produce(t, {"body": "old", "deliver_at": past}, {"body": "new"})
    got = api.pull_until(t, "g", 2)
    old = next(m for m in got if m["body"] == "old")
    api.ack(t, "g", [m["receipt"] for m in got if m is not old])
    api.call("GET", "/v1/messages/d-fffff1")  # 404 on a templated route
    api.call("GET", "/no/such/route/abc123")  # 404 on no route
    families = {f.name: f for f in text_string_to_metric_families(api.call("GET", "/metrics").raw.decode())}

    (info,) = families["delayd_build_info"].samples
    assert info.value == 1 and info.labels["version"] == __version__ and info.labels["node_id"]
    http = families["delayd_http_request_duration_seconds"].samples
    counts = {(s.labels["method"], s.labels["route"], s.labels["status"]): s.value for s in http
              if s.name.endswith("_count")}
    assert counts[("POST", "/v1/topics/{topic}/messages", "200")] >= 1
    assert counts[("GET", "/v1/messages/{id}", "404")] >= 1
    assert counts[("GET", "unmatched", "404")] >= 1
    assert not any("d-fffff1" in r or "abc123" in r or t in r for _, r, _ in counts), "raw paths are not labels"
    fsync = {s.name: s.value for s in families["delayd_commitlog_fsync_duration_seconds"].samples}
    assert fsync["delayd_commitlog_fsync_duration_seconds_count"] >= 1
    age = [s.value for s in families["delayd_group_oldest_unacked_age_seconds"].samples
           if s.labels == {"topic": t, "group": "g"}]
    assert len(age) == 1 and 89 <= age[0] < 200, age
    late = {float(s.labels["le"]): s.value for s in families["delayd_lateness_seconds"].samples
            if s.name.endswith("_bucket")}
    assert late[60.0] < late[120.0], "a message 90 s late lands in a bucket of its own, not only +Inf"
    assert max(le for le in late if le != float("inf")) >= 3600
    api.ack(t, "g", [old["receipt"]])
    families = {f.name: f for f in text_string_to_metric_families(api.call("GET", "/metrics").raw.decode())}
    assert [s.value for s in families["delayd_group_oldest_unacked_age_seconds"].samples
            if s.labels == {"topic": t, "group": "g"}] == [0], "all acked: nothing is waiting"


def test_health_and_readiness(api: Api) -> None:
    assert ok(api.call("GET", "/healthz")) == {"status": "ok"}
    assert ok(api.call("GET", "/readyz")) == {"status": "ready"}
    assert api.call("HEAD", "/healthz").status == 200


def test_readyz_becomes_200_after_start_and_healthz_serves_first(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data")
    d.start(wait_ready=False)
    try:
        seen: list[int] = []

        def ready() -> bool:
            try:
                status = Api(d).call("GET", "/readyz", timeout_s=2).status
            except OSError:
                return False  # not listening yet
            seen.append(status)
            return status == 200
        wait_until(ready, 30, 0.005, "readyz 200")
        assert set(seen) <= {200, 503}, seen
        assert Api(d).call("GET", "/healthz").status == 200
    finally:
        d.stop()


# -- OpenAPI --------------------------------------------------------------------------------------
def test_openapi_document_is_valid_openapi_3(spec: dict[str, Any]) -> None:
    """The served document passes the real openapi-spec-validator (it raises on any error)."""
    assert spec["openapi"].startswith("3.0.")
    validate_openapi_document(spec)


def test_openapi_has_operation_ids_components_and_bearer_security(spec: dict[str, Any]) -> None:
    ops = [(m, p, op) for p, item in spec["paths"].items() for m, op in item.items()]
    ids = [op["operationId"] for _, _, op in ops]
    assert len(ids) == len(set(ids)) == len(ops), "every operation has its own operationId"
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": spec["components"]["securitySchemes"]["bearer"]["description"]}
    assert spec["security"] == [{"bearer": []}]
    for m, p, op in ops:
        assert ("security" in op and op["security"] == []) == (p in ("/healthz", "/readyz", "/openapi.json")), \
            f"{m} {p}: only health, readiness and this document are open without a token"
    text = json.dumps(spec["paths"])
    for name in ("Error", "MessageIn", "MessageView", "PulledMessage", "Stats", "SubscriptionStatus"):
        assert f'"#/components/schemas/{name}"' in json.dumps(spec), f"{name} is not referenced"
    assert '"#/components/responses/E400"' in text, "shared error answers are referenced, not repeated"


def test_openapi_has_every_documented_path(spec: dict[str, Any]) -> None:
    ops = {(m.upper(), p) for p, item in spec["paths"].items() for m in item}
    assert API_MD_PATHS | ADDED_PATHS == ops, (sorted((API_MD_PATHS | ADDED_PATHS) - ops), sorted(ops - API_MD_PATHS - ADDED_PATHS))
    for path, item in spec["paths"].items():
        for method, op in item.items():
            assert method in ("get", "put", "post", "delete") and op["responses"], (path, method)


def _doc_paths(text: str) -> set[tuple[str, str]]:
    found = set()
    for method, path in re.findall(r"`(GET|POST|PUT|DELETE) ([^`\s]+)", text):
        if not path.startswith(("/", "...")) or path == "/ui" or path.startswith("/ui/"):
            continue  # `POST <push.url>` is a request the daemon sends; /ui/ serves the console's files
        path = path.split("?", 1)[0]
        found.add((method, SUB + path[3:] if path.startswith("...") else path))
    return found


def test_api_md_paths_match_the_lists_tested_here() -> None:
    assert API_MD.is_file(), f"the API contract {API_MD} is missing from the repository"
    contract, additions = API_MD.read_text().split("\n## Additions\n", 1)
    assert _doc_paths(contract) == API_MD_PATHS
    assert _doc_paths(additions) - API_MD_PATHS == ADDED_PATHS


def test_every_endpoint_answers_as_its_schema_says(api: Api, spec: dict[str, Any]) -> None:
    t, g = "schema-t", "g"
    sub = f"/v1/topics/{t}/subscriptions/{g}"
    M, T, S = "/v1/topics/{topic}/messages", "/v1/messages/{id}", SUB

    def c(method: str, template: str, path: str, *body: Any, **kw: Any) -> Any:
        return check(spec, api.call(method, path, *body, **kw), method, template)

    # Requests the server accepts must fit the spec's request schemas, too.
    pull_schema = spec["paths"][f"{S}/pull"]["post"]["requestBody"]["content"][JSON]["schema"]
    produce_schema = spec["paths"][M]["post"]["requestBody"]["content"][JSON]["schema"]
    single = {"body": "hello", "key": "k-1", "tag": "a", "headers": {"h": "v"}, "delay_ms": 0}
    batch = {"messages": [{"body_b64": "/wA="}, {"body": "later", "delay_ms": 600_000}]}
    assert validate(spec, produce_schema, single) == [] and validate(spec, produce_schema, batch) == []
    assert c("PUT", S, sub, {"start": "earliest", "max_attempts": 2})["max_attempts"] == 2
    (p1,) = c("POST", M, f"/v1/topics/{t}/messages", single)["messages"]
    p2, p3 = c("POST", M, f"/v1/topics/{t}/messages", batch)["messages"]
    assert c("GET", T, f"/v1/messages/{p3['id']}")["state"] == "scheduled"
    assert c("DELETE", T, f"/v1/messages/{p3['id']}") == {"id": p3["id"], "state": "cancelled"}
    c("GET", T, "/v1/messages/d-fffffff")
    c("DELETE", T, "/v1/messages/d-fffffff")
    c("GET", "/v1/topics/{topic}/keys/{key}", f"/v1/topics/{t}/keys/k-1")
    c("DELETE", "/v1/topics/{topic}/keys/{key}", f"/v1/topics/{t}/keys/k-2")
    pull = {"max": 10, "wait_ms": 1000, "lease_ms": 5000}
    assert validate(spec, pull_schema, pull) == []
    got: list[dict[str, Any]] = []
    while len(got) < 2:
        got += c("POST", f"{S}/pull", f"{sub}/pull", pull)["messages"]
    assert {"body", "body_b64"} <= {k for m in got for k in m}, "both body forms were checked"
    wait_until(lambda: api.state(p1["id"]) == "delivered", 5, what="delivered")
    assert c("GET", T, f"/v1/messages/{p1['id']}")["state"] == "delivered"
    assert c("GET", T, f"/v1/messages/{p2['id']}")["body_b64"] == "/wA="
    c("DELETE", T, f"/v1/messages/{p1['id']}")  # 409
    r1, r2 = (m["receipt"] for m in got)
    assert c("POST", f"{S}/extend", f"{sub}/extend", {"receipts": [r1, "x"], "lease_ms": 5000})["extended"] == 1
    assert c("POST", f"{S}/ack", f"{sub}/ack", {"receipts": [r1, "x"]})["acked"] == 1
    assert c("POST", f"{S}/nack", f"{sub}/nack", {"receipts": [r2], "delay_ms": 0})["nacked"] == 1
    (again,) = api.pull_until(t, g, 1)
    c("POST", f"{S}/nack", f"{sub}/nack", {"receipts": [again["receipt"]]})
    dead = c("GET", f"{S}/dead", f"{sub}/dead?limit=10")["messages"]
    assert [m["id"] for m in dead] == [p2["id"]] and dead[0]["reason"]
    assert c("POST", f"{S}/dead/redrive", f"{sub}/dead/redrive", {"ids": [p2["id"]]}) == {"redriven": 1}
    assert c("POST", f"{S}/dead/redrive", f"{sub}/dead/redrive", {}) == {"redriven": 0}
    stats = c("GET", "/v1/stats", "/v1/stats")
    assert stats["groups"][f"{t}/{g}"]["dead"] == 0
    c("GET", "/v1/schedule", f"/v1/schedule?from={now_ms()}&to={now_ms() + 3_600_000}&step_ms=60000")
    c("GET", "/v1/info", "/v1/info")
    c("GET", "/healthz", "/healthz")
    c("GET", "/readyz", "/readyz")
    c("GET", "/metrics", "/metrics")
    c("GET", "/openapi.json", "/openapi.json")
    shown = c("GET", S, sub)
    assert (shown["group"], shown["max_attempts"], shown["dead"]) == (g, 2, 0)
    gone = f"/v1/topics/{t}/subscriptions/gone"
    c("PUT", S, gone)
    assert c("DELETE", S, gone) == {"topic": t, "group": "gone", "deleted": True}
    c("DELETE", S, gone)  # 404
    c("GET", S, gone)  # 404
    # Errors, with the statuses each operation documents.
    c("POST", M, f"/v1/topics/{t}/messages", {"body": "x", "bogus": 1})
    c("POST", M, f"/v1/topics/{t}/messages", {"body": "x" * (1024 * 1024 + 1)})
    c("POST", M, f"/v1/topics/{t}/messages", raw=b"x", content_type="text/plain")
    c("POST", f"{S}/pull", f"{sub}/pull", {"max": 0})
    c("POST", f"{S}/pull", f"{sub}/pull", raw=b"{}", content_type="text/plain")
    c("PUT", S, sub, {"start": "middle"})
    c("GET", f"{S}/dead", f"{sub}/dead?limit=0")
    c("GET", "/v1/schedule", "/v1/schedule?from=1&to=0&step_ms=1")
    # The spec and the server agree on which request bodies are acceptable.
    for body in ({}, {"max": 1}, {"max": 0}, {"max": 1001}, {"lease_ms": 999}, {"wait_ms": 30_001},
                 {"tags": "a"}, {"tags": ["a"]}, {"lease": 1000}, {"max": "1"}):
        accepted = api.call("POST", f"{sub}/pull", body).status == 200
        assert accepted == (validate(spec, pull_schema, body) == []), body
    for body in ({"body": "x"}, {"body_b64": "eA=="}, {"body": "x", "body_b64": "eA=="}, {}, {"delay_ms": 1},
                 {"body": "x", "delay_ms": -1}, {"body": "x", "delay_ms": 1, "deliver_at": 2},
                 {"body": "x", "deliver_at": "2027-01-01T09:00:00+01:00"}, {"body": "x", "deliver_at": 1.5},
                 {"body": "x", "tag": "t" * 129}, {"body": "x", "replace": "yes"}, {"messages": []},
                 {"messages": [{"body": "x"}]}, {"messages": [{"body": "x"}], "body": "y"}):
        accepted = api.call("POST", f"/v1/topics/{t}/messages", body).status == 200
        assert accepted == (validate(spec, produce_schema, body) == []), body
    put_schema = spec["paths"][S]["put"]["requestBody"]["content"][JSON]["schema"]
    for body in ({}, {"start": "latest"}, {"start": "x"}, {"max_attempts": 0}, {"max_attempts": 3}, {"m": 1}):
        accepted = api.call("PUT", f"/v1/topics/{t}/subscriptions/other", body).status == 200
        assert accepted == (validate(spec, put_schema, body) == []), body
