"""Serve :class:`~statestore.ops.metrics.RestoreMetrics` to Prometheus (``pip install statestore[metrics]``).

The exporter registers one collector that takes a snapshot when scraped, so a
restore pays nothing for it between scrapes. Names and labels are stable:

================================================  =======  ==========================================
metric                                            type     labels
================================================  =======  ==========================================
``statestore_restore_records_total``              counter  application_id, task, store
``statestore_restore_records_per_second``         gauge    application_id, task, store
``statestore_restore_remaining_records``          gauge    application_id, task, store
``statestore_restore_seconds``                    gauge    application_id, task, store
``statestore_standby_records_total``              counter  application_id, task, store
``statestore_standby_records_per_second``         gauge    application_id, task, store
``statestore_standby_lag_records``                gauge    application_id, task, store
``statestore_tasks``                              gauge    application_id, state
``statestore_task_state``                         gauge    application_id, task, state
``statestore_standby_promotions_total``           counter  application_id, result
``statestore_promotion_replayed_records_total``    counter  application_id, result
``statestore_app_last_poll_age_seconds``          gauge    application_id, state
================================================  =======  ==========================================

``statestore_task_state`` is 1 for each task of the process with its state
(``RESTORING``, ``RUNNING``, ``STANDBY``). ``statestore_standby_promotions_total``
counts the tasks that moved to this process, ``result="hit"`` when it held a
standby of the task, ``"miss"`` when not: the hit rate is
``hit / (hit + miss)``; ``statestore_promotion_replayed_records_total`` the
records those tasks restored before they ran (a hit replays only what its
standby lacked). ``statestore_app_last_poll_age_seconds`` is an application's
liveness: seconds since its loop last polled, labelled with its state
(``STARTING``, ``RUNNING``, ``REBALANCING``, ``CLOSING``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from statestore.errors import StateStoreError
from statestore.ops.metrics import RestoreMetrics

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

_STORE_LABELS = ["application_id", "task", "store"]


def _client() -> object:
    try:
        import prometheus_client
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise StateStoreError(
            "the Prometheus exporter needs prometheus_client: pip install 'statestore[metrics]'"
        ) from e
    return prometheus_client


class RestoreMetricsCollector:
    """A ``prometheus_client`` collector reading a :class:`RestoreMetrics` at each scrape."""

    def __init__(self, metrics: RestoreMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        """The metric families of one snapshot."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.metrics.snapshot()
        restored = CounterMetricFamily(
            "statestore_restore_records", "Records restored into an active task's store", labels=_STORE_LABELS
        )
        rate = GaugeMetricFamily(
            "statestore_restore_records_per_second",
            "Restore rate over the last seconds",
            labels=_STORE_LABELS,
        )
        remaining = GaugeMetricFamily(
            "statestore_restore_remaining_records",
            "End offset minus position of a restoration (an upper bound on records; 0 when complete)",
            labels=_STORE_LABELS,
        )
        seconds = GaugeMetricFamily(
            "statestore_restore_seconds", "Time a restoration has run (or took)", labels=_STORE_LABELS
        )
        standby = CounterMetricFamily(
            "statestore_standby_records", "Records loaded into a standby task's store", labels=_STORE_LABELS
        )
        standby_rate = GaugeMetricFamily(
            "statestore_standby_records_per_second",
            "Standby update rate over the last seconds",
            labels=_STORE_LABELS,
        )
        standby_lag = GaugeMetricFamily(
            "statestore_standby_lag_records",
            "Offsets a standby is behind its changelog's end",
            labels=_STORE_LABELS,
        )
        for s in snap.stores:
            labels = [s.application_id, s.task_id, s.store]
            if s.kind == "active":
                restored.add_metric(labels, s.records_restored)
                rate.add_metric(labels, s.rate)
                if s.remaining_records is not None:
                    remaining.add_metric(labels, s.remaining_records)
                seconds.add_metric(labels, s.seconds)
            else:
                standby.add_metric(labels, s.records_restored)
                standby_rate.add_metric(labels, s.rate)
                if s.remaining_records is not None:
                    standby_lag.add_metric(labels, s.remaining_records)
        tasks = GaugeMetricFamily(
            "statestore_tasks", "Tasks of this process by state", labels=["application_id", "state"]
        )
        for state, n in sorted(snap.tasks_by_state.items()):
            tasks.add_metric([snap.application_id, state], n)
        task_state = GaugeMetricFamily(
            "statestore_task_state",
            "1 for each task of this process, labelled with its state (RESTORING, RUNNING, STANDBY)",
            labels=["application_id", "task", "state"],
        )
        for task, state in sorted(snap.task_states.items()):
            task_state.add_metric([snap.application_id, task, state], 1)
        promotions = CounterMetricFamily(
            "statestore_standby_promotions",
            "Tasks that moved to this process, by whether they found a standby here (hit) or not (miss)",
            labels=["application_id", "result"],
        )
        replayed = CounterMetricFamily(
            "statestore_promotion_replayed_records",
            "Records the tasks that moved here restored before they ran, by hit or miss of a standby",
            labels=["application_id", "result"],
        )
        for result in ("hit", "miss"):
            promotions.add_metric([snap.application_id, result], snap.standby_promotions.get(result, 0))
            replayed.add_metric([snap.application_id, result], snap.promotion_replayed_records.get(result, 0))
        families = [restored, rate, remaining, seconds, standby, standby_rate, standby_lag, tasks, task_state]
        families += [promotions, replayed]
        last_poll = snap.liveness.get("last_poll_at")
        if last_poll is not None:
            alive = GaugeMetricFamily(
                "statestore_app_last_poll_age_seconds",
                "Seconds since the application's loop last polled (its liveness), labelled with its state",
                labels=["application_id", "state"],
            )
            alive.add_metric(
                [snap.application_id, str(snap.liveness.get("state", "UNKNOWN"))],
                max(0.0, time.time() - float(last_poll)),
            )
            families.append(alive)
        yield from families


def register(metrics: RestoreMetrics, registry: CollectorRegistry | None = None) -> RestoreMetricsCollector:
    """Register ``metrics`` with ``registry`` (prometheus_client's default registry when None)."""
    _client()
    from prometheus_client import REGISTRY

    collector = RestoreMetricsCollector(metrics)
    (registry if registry is not None else REGISTRY).register(collector)
    return collector


def start_exporter(
    metrics: RestoreMetrics, port: int = 0, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> tuple[int, RestoreMetricsCollector]:
    """Serve ``metrics`` over HTTP at ``http://addr:port/metrics``; returns the bound port and the collector.

    ``port=0`` picks a free port. A fresh registry is used unless one is given,
    so several applications in one process do not collide.
    """
    _client()
    from prometheus_client import CollectorRegistry, start_http_server

    reg = registry if registry is not None else CollectorRegistry()
    collector = register(metrics, reg)
    server, _thread = start_http_server(port, addr=addr, registry=reg)
    return int(server.server_address[1]), collector


__all__ = ["RestoreMetricsCollector", "register", "start_exporter"]
