"""Generates deploy/grafana/dashboards/delayd.json, the provisioned "delayd" dashboard.

Edit the panels here and run `python deploy/grafana/gen_dashboard.py`; tests/deploy/test_grafana.py
checks that the committed JSON is this script's output and that every query is valid PromQL over
metrics the daemon exports. (A dashboard edited in the Grafana UI can be exported and compared,
but this file is the source.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "delayd.json"

DS = {"type": "prometheus", "uid": "delayd-prometheus"}
# Shards are told apart by the labels every Prometheus adds to a scrape (job, instance), never by
# a label only this repository's prometheus.yml adds: the dashboard works on anyone's Prometheus.
# The variables come from delayd_build_info, which only delayd exports.
N = 'job=~"$job", instance=~"$instance"'
RI = "$__rate_interval"
panels: list[dict[str, Any]] = []
pid = 0


def panel(
    title: str,
    targets: list[tuple[str, str]],
    x: int,
    y: int,
    w: int,
    h: int,
    unit: str = "short",
    kind: str = "timeseries",
    desc: str = "",
    stack: bool = False,
    extra: dict[str, Any] | None = None,
) -> None:
    global pid
    pid += 1
    p: dict[str, Any] = {
        "id": pid,
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DS,
                "expr": e,
                "legendFormat": lf,
                **({"instant": True, "range": False} if kind in ("stat", "bargauge") else {"range": True}),
            }
            for i, (e, lf) in enumerate(targets)
        ],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
    }
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10 if not stack else 40,
            "showPoints": "never",
            "stacking": {"mode": "normal" if stack else "none"},
        }
        p["options"] = {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif kind == "stat":
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "auto",
        }
    elif kind == "bargauge":
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
        }
    if extra:
        for k, v in extra.items():
            p["fieldConfig"]["defaults"][k] = v
    panels.append(p)


def row(title: str, y: int) -> None:
    global pid
    pid += 1
    panels.append(
        {
            "id": pid,
            "type": "row",
            "title": title,
            "collapsed": False,
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
            "panels": [],
        }
    )


def thr(*steps: tuple[str, float | None]) -> dict[str, Any]:
    return {"thresholds": {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}}


row("Overview", 0)
panel(
    "Shards up",
    [(f"count(up{{{N}}} == 1)", "up")],
    0,
    1,
    4,
    4,
    kind="stat",
    desc="Shards answering /metrics (of the selected ones).",
    extra=thr(("red", None), ("green", 1)),
)
panel(
    "Scheduled (pending)",
    [(f"sum(delayd_scheduled_messages{{{N}}})", "pending")],
    4,
    1,
    4,
    4,
    kind="stat",
    desc="Messages produced and not yet due, across the selected shards.",
)
panel(
    "Dead letters",
    [(f"sum(delayd_group_dead{{{N}}})", "dead")],
    8,
    1,
    4,
    4,
    kind="stat",
    desc="Messages in any group's dead letters. Anything above 0 needs a look.",
    extra=thr(("green", None), ("orange", 1)),
)
panel(
    "Oldest unacked",
    [(f"max(delayd_group_oldest_unacked_age_seconds{{{N}}})", "oldest")],
    12,
    1,
    4,
    4,
    unit="s",
    kind="stat",
    desc="How long ago the oldest due message that some group has not acked fell due (SQS's "
    "ApproximateAgeOfOldestMessage). Growing means a consumer is stuck or too slow.",
    extra=thr(("green", None), ("orange", 60), ("red", 600)),
)
panel(
    "Disk used",
    [(f"sum(delayd_disk_bytes{{{N}}})", "disk")],
    16,
    1,
    4,
    4,
    unit="bytes",
    kind="stat",
    desc="Bytes of commit log, timer log, wheel, queues and checkpoints.",
)
panel(
    "Last recovery",
    [(f"max(delayd_recovery_seconds{{{N}}})", "recovery")],
    20,
    1,
    4,
    4,
    unit="s",
    kind="stat",
    desc="Longest time from start to /readyz among the shards (target <= 2 s).",
    extra=thr(("green", None), ("orange", 2), ("red", 10)),
)

row("Throughput", 5)
panel(
    "Produce rate by topic",
    [(f"sum by (topic) (rate(delayd_produced_total{{{N}}}[{RI}]))", "{{topic}}")],
    0,
    6,
    12,
    8,
    unit="ops",
    stack=True,
    desc="Messages accepted (durable) per second.",
)
panel(
    "Delivery and cancel rate by topic",
    [
        (f"sum by (topic) (rate(delayd_delivered_total{{{N}}}[{RI}]))", "delivered {{topic}}"),
        (f"sum by (topic) (rate(delayd_cancelled_total{{{N}}}[{RI}]))", "cancelled {{topic}}"),
    ],
    12,
    6,
    12,
    8,
    unit="ops",
    desc="Messages that became due and were released to their topic, and cancels.",
)

row("Timing", 14)
panel(
    "Delivery lateness percentiles",
    [
        (f"histogram_quantile(0.5, sum by (le) (rate(delayd_lateness_seconds_bucket{{{N}}}[{RI}])))", "p50"),
        (f"histogram_quantile(0.99, sum by (le) (rate(delayd_lateness_seconds_bucket{{{N}}}[{RI}])))", "p99"),
        (
            f"histogram_quantile(0.999, sum by (le) (rate(delayd_lateness_seconds_bucket{{{N}}}[{RI}])))",
            "p99.9",
        ),
    ],
    0,
    15,
    12,
    8,
    unit="s",
    desc="delivered_at - deliver_at. Never negative (never early); target p99 <= 10 ms. Buckets reach a "
    "day, so the lateness after an outage is measured too.",
    extra=thr(("green", None), ("orange", 0.01), ("red", 0.05)),
)
panel(
    "Lateness p99 by shard",
    [
        (
            f"histogram_quantile(0.99, sum by (instance, le) (rate(delayd_lateness_seconds_bucket{{{N}}}[{RI}])))",
            "{{instance}}",
        )
    ],
    12,
    15,
    12,
    8,
    unit="s",
    desc="One slow shard shows here before it shows in the total.",
)
panel(
    "Pending by shard",
    [(f"sum by (instance) (delayd_scheduled_messages{{{N}}})", "{{instance}}")],
    0,
    23,
    8,
    8,
    unit="short",
    stack=True,
    desc="Scheduled (not yet due) messages per shard. For how many fall due when, use GET /v1/schedule "
    "(buckets of due time) on each shard.",
)
panel(
    "Pending by topic",
    [(f"sum by (topic) (delayd_topic_scheduled_messages{{{N}}})", "{{topic}}")],
    8,
    23,
    8,
    8,
    unit="short",
    stack=True,
    desc="Scheduled (not yet due) messages per topic, all shards.",
)
panel(
    "Pipeline stage queue depths",
    [(f"sum by (stage) (delayd_stage_queue_depth{{{N}}})", "{{stage}}")],
    16,
    23,
    8,
    8,
    unit="short",
    desc="Items waiting between pipeline stages (enqueue_get, enqueue_put, dequeue_get, dequeue_get_message, dequeue_put). "
    "Bursts rise and drain; a queue that stays high means the next stage cannot keep up.",
)

row("Consumers", 31)
panel(
    "Consumer backlog (due, not delivered)",
    [(f"sum by (topic, group) (delayd_group_backlog{{{N}}})", "{{topic}}/{{group}}")],
    0,
    32,
    8,
    8,
    unit="short",
    desc="Due messages a group has not pulled yet.",
)
panel(
    "In flight (leased, not acked)",
    [(f"sum by (topic, group) (delayd_group_inflight{{{N}}})", "{{topic}}/{{group}}")],
    8,
    32,
    8,
    8,
    unit="short",
)
panel(
    "Dead letters by group",
    [(f"sum by (topic, group) (delayd_group_dead{{{N}}})", "{{topic}}/{{group}}")],
    16,
    32,
    8,
    8,
    unit="short",
    desc="Messages that used up max_attempts. Redrive after fixing the consumer.",
)
panel(
    "Oldest unacked message age by group",
    [(f"max by (topic, group) (delayd_group_oldest_unacked_age_seconds{{{N}}})", "{{topic}}/{{group}}")],
    0,
    40,
    12,
    8,
    unit="s",
    desc="Now minus deliver_at of each group's oldest due message not yet acked (0: none waiting).",
)
panel(
    "Ack / nack / dead rate by group",
    [
        (f"sum by (topic, group) (rate(delayd_acked_total{{{N}}}[{RI}]))", "ack {{topic}}/{{group}}"),
        (f"sum by (topic, group) (rate(delayd_nacked_total{{{N}}}[{RI}]))", "nack {{topic}}/{{group}}"),
        (f"sum by (topic, group) (rate(delayd_dead_total{{{N}}}[{RI}]))", "dead {{topic}}/{{group}}"),
    ],
    12,
    40,
    12,
    8,
    unit="ops",
)

row("HTTP and disk", 48)
panel(
    "Requests by route and status",
    [
        (
            f"sum by (method, route, status) (rate(delayd_http_request_duration_seconds_count{{{N}}}[{RI}]))",
            "{{method}} {{route}} {{status}}",
        )
    ],
    0,
    49,
    8,
    8,
    unit="reqps",
    desc="Routes are the API's path templates, never raw paths. 5xx should never appear.",
)
panel(
    "Request duration p99 by route",
    [
        (
            "histogram_quantile(0.99, sum by (route, le) "
            f"(rate(delayd_http_request_duration_seconds_bucket{{{N}}}[{RI}])))",
            "{{route}}",
        )
    ],
    8,
    49,
    8,
    8,
    unit="s",
    desc="Produce includes the group-commit fsync; pull includes its long-poll wait (up to 30 s).",
)
panel(
    "Commit-log fsync duration",
    [
        (
            f"histogram_quantile(0.5, sum by (le) (rate(delayd_commitlog_fsync_duration_seconds_bucket{{{N}}}[{RI}])))",
            "p50",
        ),
        (
            f"histogram_quantile(0.99, sum by (le) (rate(delayd_commitlog_fsync_duration_seconds_bucket{{{N}}}[{RI}])))",
            "p99",
        ),
    ],
    16,
    49,
    8,
    8,
    unit="s",
    desc="Each group commit's fsync. Produce latency under fsync=always cannot be lower than this.",
)
panel(
    "Disk used by shard",
    [(f"sum by (instance) (delayd_disk_bytes{{{N}}})", "{{instance}}")],
    0,
    57,
    12,
    8,
    unit="bytes",
    desc="Should track the backlog: payload plus a small constant per message.",
)
panel(
    "Versions running",
    [(f"count by (version) (delayd_build_info{{{N}}})", "{{version}}")],
    12,
    57,
    12,
    8,
    unit="short",
    kind="bargauge",
    desc="Shards per delayd version (delayd_build_info); more than one bar during a rolling upgrade.",
)

dash = {
    "uid": "delayd-overview",
    "title": "delayd",
    "description": "delayd delay-message broker: throughput, lateness, pipeline and consumers (all shards).",
    "tags": ["delayd"],
    "timezone": "utc",
    "editable": False,
    "graphTooltip": 1,
    "schemaVersion": 39,
    "version": 1,
    "refresh": "10s",
    "time": {"from": "now-1h", "to": "now"},
    "templating": {
        "list": [
            {
                "name": "job",
                "label": "job",
                "type": "query",
                "datasource": DS,
                "query": {"query": "label_values(delayd_build_info, job)", "refId": "job"},
                "definition": "label_values(delayd_build_info, job)",
                "refresh": 2,
                "multi": False,
                "includeAll": False,
                "sort": 1,
            },
            {
                "name": "instance",
                "label": "shard",
                "type": "query",
                "datasource": DS,
                "query": {"query": 'label_values(delayd_build_info{job=~"$job"}, instance)', "refId": "instance"},
                "definition": 'label_values(delayd_build_info{job=~"$job"}, instance)',
                "refresh": 2,
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "sort": 1,
            },
        ]
    },
    "annotations": {"list": []},
    "links": [],
    "panels": panels,
}


def render() -> str:
    return json.dumps(dash, indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
