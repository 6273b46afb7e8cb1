"""Prometheus metrics. Counters move with events; gauges are read live at scrape time."""

from __future__ import annotations

import platform
from array import array
from collections.abc import Iterator
from typing import Any

from delayd.broker.service import Broker
from delayd.storage import batch
from delayd.storage.dispatch import Released
from delayd.storage.readyqueue import UNIT_DELIVER_AT
from delayd.storage.readyqueue import UNIT_SIZE as READY_UNIT
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from delayd import __version__

# Up to a day: after an outage, messages that fell due meanwhile are released hours late, and
# that is exactly when an operator needs to see how late (not one +Inf bucket).
LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                    120, 300, 600, 1800, 3600, 7200, 21600, 86400)
# Long-polls wait up to 30 s by design, so the request buckets reach past that.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
FSYNC_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
UNMATCHED_ROUTE = "unmatched"  # 404s are labelled by this, never by the raw path (cardinality)
PUSH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)


class Metrics:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.registry = CollectorRegistry()
        self.lateness = BatchHistogram("delayd_lateness_seconds", "delivered_at - deliver_at of released messages",
                                       LATENESS_BUCKETS)
        self.registry.register(self.lateness)
        self.delivered = Counter("delayd_delivered", "Messages released to their topic", ["topic"],
                                 registry=self.registry)
        self.http = Histogram("delayd_http_request_duration_seconds",
                              "HTTP requests by method, route template and status",
                              ["method", "route", "status"], buckets=HTTP_BUCKETS, registry=self.registry)
        # Each (method, route, status)'s series, found once: labels() costs more than the observe.
        self._http_series: dict[tuple[str, str | None, int], Any] = {}
        self.fsync = Histogram("delayd_commitlog_fsync_duration_seconds",
                               "Duration of each group-commit fsync of the commit log",
                               buckets=FSYNC_BUCKETS, registry=self.registry)
        self.pushes = Counter("delayd_push_requests", "Push POSTs by subscription and outcome "
                              "(ok, http_error, timeout, connection_error)", ["topic", "group", "outcome"],
                              registry=self.registry)
        self.push_latency = Histogram("delayd_push_duration_seconds", "Time from sending a push POST to its "
                                      "answer (or timeout)", ["topic", "group"], buckets=PUSH_BUCKETS,
                                      registry=self.registry)
        self.registry.register(_Live(broker))
        broker.listeners.append(self)
        broker.fsync_listeners.append(self.fsync.observe)

    def observe_request(self, method: str, route: str | None, status: int, seconds: float) -> None:
        series = self._http_series.get((method, route, status))
        if series is None:
            series = self.http.labels(method, route or UNMATCHED_ROUTE, str(status))
            self._http_series[(method, route, status)] = series
        series.observe(seconds)

    def on_release(self, released: Released, now: int) -> None:
        for topic, _first, units in released.batches:
            self.lateness.observe_ms(batch.ops.lateness(units, READY_UNIT, UNIT_DELIVER_AT, now))
            self.delivered.labels(topic).inc(len(units) // READY_UNIT)

    def on_push(self, topic: str, group: str, outcome: str, seconds: float) -> None:
        self.pushes.labels(topic, group, outcome).inc()
        self.push_latency.labels(topic, group).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class BatchHistogram(Collector):
    """A label-less histogram fed a batch of millisecond values at a time: the batch core counts
    a whole release batch into the buckets (a Histogram.observe per message cost more than the
    release itself). Bucket bounds are in seconds, whole milliseconds each."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.buckets = name, doc, buckets
        bounds_ms = [round(b * 1000) for b in buckets]
        assert all(abs(b * 1000 - ms) < 1e-6 for b, ms in zip(buckets, bounds_ms, strict=True)), "whole ms bounds"
        self._bounds = array("q", bounds_ms).tobytes()
        self._counts = [0] * (len(buckets) + 1)  # the last: past every bound (+Inf)
        self._sum_ms = 0

    def observe_ms(self, values: bytes) -> None:
        """Count i64 millisecond values (packed) into the buckets."""
        counts, total = batch.ops.bucket_counts(values, self._bounds)
        for k, n in enumerate(counts):
            self._counts[k] += n
        self._sum_ms += total

    def collect(self) -> Iterator[Any]:
        cumulative, running = [], 0
        for b, n in zip((*self.buckets, float("inf")), self._counts, strict=True):
            running += n
            cumulative.append((floatToGoString(b), running))
        yield HistogramMetricFamily(self.name, self.doc, buckets=cumulative, sum_value=self._sum_ms / 1000)


class _Live(Collector):
    """Values that already live in the broker, exported without double bookkeeping."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Any]:
        b = self.broker
        info = GaugeMetricFamily("delayd_build_info", "Always 1; the labels say which build runs",
                                 labels=["version", "python", "node_id"])
        info.add_metric([__version__, platform.python_version(), b.cfg.node_id], 1)
        yield info
        if b.repl is not None:
            yield from _replication(b.repl.metrics())
        store, groups, pipeline = b.store, b.groups, b.pipeline
        if store is None or groups is None or pipeline is None or not b.ready:
            return
        produced = _counter("delayd_produced_total", "Messages accepted", ["topic"])
        cancelled = _counter("delayd_cancelled_total", "Messages cancelled", ["topic"])
        sched = GaugeMetricFamily("delayd_topic_scheduled_messages", "Pending messages per topic", labels=["topic"])
        for t, c in store.topic_counts.items():
            produced.add_metric([t], c.get("produced_total", 0))
            cancelled.add_metric([t], c.get("cancelled_total", 0))
            sched.add_metric([t], c.get("scheduled", 0))
        yield from (produced, cancelled, sched)
        acked = _counter("delayd_acked_total", "Acknowledged deliveries", ["topic", "group"])
        nacked = _counter("delayd_nacked_total", "Negative acknowledgements", ["topic", "group"])
        dead_t = _counter("delayd_dead_total", "Messages moved to dead letters", ["topic", "group"])
        backlog = GaugeMetricFamily("delayd_group_backlog", "Due messages not yet handed out", labels=["topic", "group"])
        inflight = GaugeMetricFamily("delayd_group_inflight", "Messages leased to consumers", labels=["topic", "group"])
        dead = GaugeMetricFamily("delayd_group_dead", "Dead letters held", labels=["topic", "group"])
        oldest = GaugeMetricFamily("delayd_group_oldest_unacked_age_seconds",
                                   "Now minus deliver_at of the group's oldest due, unacked message (0: none)",
                                   labels=["topic", "group"])
        for g in groups.groups.values():
            s = groups.stats(g)
            acked.add_metric([g.topic, g.name], g.acked_total)
            nacked.add_metric([g.topic, g.name], g.nacked_total)
            dead_t.add_metric([g.topic, g.name], g.dead_total)
            backlog.add_metric([g.topic, g.name], s["backlog"])
            inflight.add_metric([g.topic, g.name], s["inflight"])
            dead.add_metric([g.topic, g.name], s["dead"])
            oldest.add_metric([g.topic, g.name], s["oldest_unacked_age_ms"] / 1000)
        yield from (acked, nacked, dead_t, backlog, inflight, dead, oldest)
        depth = GaugeMetricFamily("delayd_stage_queue_depth", "Items waiting in front of each stage", labels=["stage"])
        for name, n in pipeline.depths().items():
            depth.add_metric([name], n)
        yield depth
        yield GaugeMetricFamily("delayd_scheduled_messages", "Pending (scheduled) messages", value=store.scheduled)
        yield GaugeMetricFamily("delayd_disk_bytes", "Bytes on disk in the data directory", value=store.disk_bytes())
        yield GaugeMetricFamily("delayd_recovery_seconds", "Duration of the last recovery", value=b.recovery_seconds)


def _replication(m: dict[str, Any]) -> Iterator[Any]:
    role = GaugeMetricFamily("delayd_replication_role", "1 for this member's role (docs/replication.md)",
                             labels=["role"])
    for r in ("primary", "follower"):
        role.add_metric([r], 1 if m["role"] == r else 0)
    yield role
    yield GaugeMetricFamily("delayd_replication_epoch", "The shard's epoch as this member knows it", value=m["epoch"])
    yield GaugeMetricFamily("delayd_replication_isr_size", "Members in the in-sync set (primary only)",
                            value=m["isr_size"])
    yield _counter_value("delayd_replication_elections", "Elections this member won", m["elections"])
    lag_b = GaugeMetricFamily("delayd_replication_follower_lag_bytes", "How far each follower's fsynced log "
                              "is behind the primary's (primary only)", labels=["member"])
    lag_s = GaugeMetricFamily("delayd_replication_follower_lag_seconds", "How long ago the primary's log first "
                              "went past each follower's (primary only)", labels=["member"])
    for member, (b, s) in m["lag"].items():
        lag_b.add_metric([member], b)
        lag_s.add_metric([member], s)
    yield lag_b
    yield lag_s
    yield GaugeMetricFamily("delayd_replication_behind_primary_bytes", "A follower: how far its log is behind "
                            "the primary's last known end", value=m["follower_lag_bytes"])


def _counter_value(name: str, doc: str, value: int) -> Any:
    from prometheus_client.core import CounterMetricFamily
    return CounterMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, labels: list[str]) -> Any:
    from prometheus_client.core import CounterMetricFamily
    return CounterMetricFamily(name.removesuffix("_total"), doc, labels=labels)
