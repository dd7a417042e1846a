"""Prometheus metrics of runs, steps, queues, workers and webhooks
(``pip install 'pikku-django[prometheus]'``, ``PIKKU["PROMETHEUS_METRICS"] = True``).

Counted in each process as it happens (from :mod:`pikku_django.signals`):

- ``pikku_runs_started_total{workflow}`` and ``pikku_runs_finished_total{workflow,
  status}`` (status ``completed``, ``failed`` or ``cancelled``);
- ``pikku_step_claims_total{workflow, step, queue}``: step attempts a worker (or an
  orchestration pass, for an inline step) claimed and started;
- ``pikku_step_attempts_total{workflow, step, queue, outcome}``: attempts that ended,
  ``succeeded``, ``retried`` (failed, another attempt follows) or ``failed`` (no attempt
  left);
- ``pikku_step_lease_losses_total{workflow, step, queue}``: attempts whose lease lapsed
  and another attempt took the step over (nothing they did was recorded);
- ``pikku_step_duration_seconds{workflow, step}``: a histogram of attempt durations;
- ``pikku_webhook_requests_total{source, outcome, code}``: requests to each declared
  webhook source, ``accepted`` (2xx), ``refused`` (4xx) or ``unavailable`` (5xx).

Read from the workflow database at each scrape (two bounded queries):

- ``pikku_queue_depth{queue}`` and ``pikku_queue_oldest_wait_seconds{queue}``: steps
  due and waiting for a worker, and how long the oldest has waited;
- ``pikku_worker_heartbeat_age_seconds{worker, hostname}``,
  ``pikku_worker_running_steps`` and ``pikku_worker_concurrency``: each worker seen in
  the last ten minutes (stopped workers are left out).

The step label is the step's name without the ``#n`` a repeated name gets. Processes
share their counts through prometheus-client's multiprocess mode: set
``PROMETHEUS_MULTIPROC_DIR`` for every web and worker process of a host (see the
operations guide), and the web process's scrape adds up every process's counts.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.dispatch import Signal

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - said to the user at import
    raise ImportError(
        "pikku_django.integrations.prometheus needs prometheus-client: "
        "pip install 'pikku-django[prometheus]'"
    ) from exc

from pikku_django import signals
from pikku_django.integrations._queries import queue_depths, worker_heartbeats

logger = logging.getLogger(__name__)

#: The environment variable that turns prometheus-client's multiprocess mode on.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Seconds: from a few milliseconds (no-op steps) to a quarter of an hour.
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    float("inf"),
)
STEP = ("workflow", "step", "queue")

#: The counters and histograms this process adds to (in multiprocess mode their values
#: go to the shared directory as well).
REGISTRY = CollectorRegistry(auto_describe=True)
RUNS_STARTED = Counter(
    "pikku_runs_started", "Workflow runs started", ("workflow",), registry=REGISTRY
)
RUNS_FINISHED = Counter(
    "pikku_runs_finished",
    "Workflow runs that reached a final status",
    ("workflow", "status"),
    registry=REGISTRY,
)
STEP_CLAIMS = Counter(
    "pikku_step_claims", "Step attempts claimed and started", STEP, registry=REGISTRY
)
STEP_ATTEMPTS = Counter(
    "pikku_step_attempts",
    "Step attempts that ended, by outcome (succeeded, retried, failed)",
    (*STEP, "outcome"),
    registry=REGISTRY,
)
LEASE_LOSSES = Counter(
    "pikku_step_lease_losses",
    "Step attempts superseded after their lease lapsed (nothing they did was recorded)",
    STEP,
    registry=REGISTRY,
)
STEP_DURATION = Histogram(
    "pikku_step_duration_seconds",
    "How long step attempts ran",
    ("workflow", "step"),
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
WEBHOOK_REQUESTS = Counter(
    "pikku_webhook_requests",
    "Requests to declared webhook sources, by outcome (accepted, refused, unavailable)",
    ("source", "outcome", "code"),
    registry=REGISTRY,
)

_REPEAT = re.compile(r"#\d+$")


def step_label(step: str) -> str:
    """The step label: its name without the ``#n`` of a repeated name."""
    return _REPEAT.sub("", step)


def webhook_outcome(status_code: int) -> str:
    """What a webhook answer's status says: accepted, refused or unavailable."""
    if status_code < 400:
        return "accepted"
    return "refused" if status_code < 500 else "unavailable"


# -- receivers -----------------------------------------------------------------------------


class _StepSeries:
    """One step's series (by workflow, step label and queue), looked up once."""

    __slots__ = ("claims", "duration", "failed", "lost", "retried", "succeeded")

    def __init__(self, workflow: str, step: str, queue: str) -> None:
        self.claims = STEP_CLAIMS.labels(workflow, step, queue)
        self.succeeded = STEP_ATTEMPTS.labels(workflow, step, queue, "succeeded")
        self.retried = STEP_ATTEMPTS.labels(workflow, step, queue, "retried")
        self.failed = STEP_ATTEMPTS.labels(workflow, step, queue, "failed")
        self.lost = LEASE_LOSSES.labels(workflow, step, queue)
        self.duration = STEP_DURATION.labels(workflow, step)


#: By (workflow, step name, queue) as the signals give them: each step's series.
_series: dict[tuple[Any, Any, Any], _StepSeries] = {}


def _step(kw: dict[str, Any]) -> _StepSeries:
    key = (kw.get("workflow"), kw["step"], kw.get("queue"))
    found = _series.get(key)
    if found is None:
        workflow, step, queue = key
        found = _series.setdefault(
            key, _StepSeries(str(workflow or ""), step_label(str(step)), str(queue or ""))
        )
    return found


def on_run_started(sender: Any, *, workflow: str, **kw: Any) -> None:
    RUNS_STARTED.labels(workflow).inc()


def on_run_finished(sender: Any, *, workflow: str, status: str, **kw: Any) -> None:
    RUNS_FINISHED.labels(workflow, status).inc()


def on_step_attempt_started(sender: Any, **kw: Any) -> None:
    _step(kw).claims.inc()


def _observe(series: _StepSeries, duration: Any) -> None:
    if duration is not None:
        series.duration.observe(max(0.0, float(duration)))


def on_step_attempt_succeeded(sender: Any, **kw: Any) -> None:
    series = _step(kw)
    series.succeeded.inc()
    _observe(series, kw.get("duration"))


def on_step_attempt_failed(sender: Any, **kw: Any) -> None:
    series = _step(kw)
    (series.retried if kw.get("will_retry") else series.failed).inc()
    _observe(series, kw.get("duration"))


def on_step_attempt_superseded(sender: Any, **kw: Any) -> None:
    _step(kw).lost.inc()


def on_webhook_received(sender: Any, *, source: str, status_code: int, **kw: Any) -> None:
    WEBHOOK_REQUESTS.labels(source, webhook_outcome(status_code), str(status_code)).inc()


RECEIVERS: dict[Signal, Callable[..., None]] = {
    signals.run_started: on_run_started,
    signals.run_finished: on_run_finished,
    signals.step_attempt_started: on_step_attempt_started,
    signals.step_attempt_succeeded: on_step_attempt_succeeded,
    signals.step_attempt_failed: on_step_attempt_failed,
    signals.step_attempt_superseded: on_step_attempt_superseded,
    signals.webhook_received: on_webhook_received,
}
_UID = "pikku_django.integrations.prometheus"
_lock = threading.Lock()


def install() -> None:
    """Count runs, steps and webhook requests in this process from now on (idempotent)."""
    with _lock:
        for signal, receiver in RECEIVERS.items():
            signal.connect(receiver, weak=False, dispatch_uid=(_UID, receiver.__name__))


def uninstall() -> None:
    """Stop counting (the counts so far stay)."""
    with _lock:
        for signal, receiver in RECEIVERS.items():
            signal.disconnect(dispatch_uid=(_UID, receiver.__name__))


# -- collection ----------------------------------------------------------------------------


class DatabaseCollector(Collector):
    """The queue and worker gauges, read from the workflow database when collected."""

    def __init__(self, using: str) -> None:
        self.using = using

    def collect(self) -> Iterable[Metric]:
        depth = GaugeMetricFamily(
            "pikku_queue_depth", "Steps due and waiting for a worker", labels=("queue",)
        )
        wait = GaugeMetricFamily(
            "pikku_queue_oldest_wait_seconds",
            "How long the oldest step waiting in the queue has waited",
            labels=("queue",),
        )
        try:
            for queue, n, oldest in queue_depths(self.using):
                depth.add_metric((queue,), n)
                wait.add_metric((queue,), oldest)
        except Exception:
            logger.warning("Could not read the queue depths for the metrics", exc_info=True)
        yield depth
        yield wait
        age = GaugeMetricFamily(
            "pikku_worker_heartbeat_age_seconds",
            "Seconds since each running worker's last heartbeat",
            labels=("worker", "hostname"),
        )
        running = GaugeMetricFamily(
            "pikku_worker_running_steps",
            "Steps each worker held at its last heartbeat",
            labels=("worker", "hostname"),
        )
        threads = GaugeMetricFamily(
            "pikku_worker_concurrency", "Each worker's threads", labels=("worker", "hostname")
        )
        try:
            for seen in worker_heartbeats(self.using):
                if seen.stopped:
                    continue
                labels = (seen.worker, seen.hostname)
                age.add_metric(labels, seen.age)
                running.add_metric(labels, seen.running)
                threads.add_metric(labels, seen.concurrency)
        except Exception:
            logger.warning("Could not read the worker heartbeats for the metrics", exc_info=True)
        yield age
        yield running
        yield threads


class _Counted(Collector):
    """This process's own counts (outside multiprocess mode)."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def multiproc_dir() -> str | None:
    """The directory prometheus-client's multiprocess mode shares, if it is on."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


def scrape(using: str) -> bytes:
    """The metrics in Prometheus's text format: every process's counts (in multiprocess
    mode, else this process's) and the database's gauges."""
    registry = CollectorRegistry(auto_describe=False)
    if multiproc_dir() is not None:
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Counted())
    registry.register(DatabaseCollector(using))
    return generate_latest(registry)


__all__ = [
    "REGISTRY",
    "DatabaseCollector",
    "install",
    "multiproc_dir",
    "scrape",
    "step_label",
    "uninstall",
    "webhook_outcome",
]
