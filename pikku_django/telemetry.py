"""OpenTelemetry traces and metrics for workflow runs (``pip install pikku-django[otel]``).

:func:`install` subscribes to :mod:`pikku_django.signals` and reports through the
OpenTelemetry API, so whatever SDK and exporter the project configures receives:

- a span ``pikku.run_pass <workflow>`` per orchestration pass and a span
  ``pikku.step <step>`` per step attempt (error status and the exception type on a
  failed attempt); both are children of the trace that started the run when the
  run carries its caller's ``trace_context`` (see :func:`current_trace_context`);
- counters ``pikku.steps.started``, ``pikku.steps.succeeded``, ``pikku.steps.failed``
  and ``pikku.runs.finished`` (by workflow, step, queue, status), histograms
  ``pikku.step.claim_latency`` and ``pikku.step.duration`` (seconds), and gauges
  ``pikku.queue.depth`` and ``pikku.queue.oldest_age`` (seconds) per queue, read
  from the workflow database when the metrics are collected.

Call :func:`install` once, e.g. in an ``AppConfig.ready()`` after configuring the SDK:
from then on each run started stores its caller's trace context, and its child runs
inherit it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.dispatch import Signal

try:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.propagate import extract, inject
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - said to the user at import
    raise ImportError(
        "pikku_django.telemetry needs OpenTelemetry: pip install 'pikku-django[otel]'"
    ) from exc

from pikku_django import signals
from pikku_django._version import __version__
from pikku_django.integrations._queries import queue_depths
from pikku_django.workflows.tracing import set_trace_context_provider

logger = logging.getLogger(__name__)

SCOPE = "pikku_django"


def current_trace_context() -> dict[str, str] | None:
    """The caller's trace context as W3C headers, to store on a run it starts; None outside
    a trace."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier or None


class Telemetry:
    """Receivers of the pikku signals that report spans and metrics."""

    def __init__(
        self,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        *,
        using: str | None = None,
        queue_metrics: bool = True,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, __version__, meter_provider=meter_provider)
        self.using = using
        self.steps_started = meter.create_counter(
            "pikku.steps.started", unit="{attempt}", description="Step attempts started"
        )
        self.steps_succeeded = meter.create_counter(
            "pikku.steps.succeeded", unit="{attempt}", description="Step attempts that succeeded"
        )
        self.steps_failed = meter.create_counter(
            "pikku.steps.failed", unit="{attempt}", description="Step attempts that failed"
        )
        self.runs_finished = meter.create_counter(
            "pikku.runs.finished", unit="{run}", description="Runs that reached a final status"
        )
        self.claim_latency = meter.create_histogram(
            "pikku.step.claim_latency", unit="s", description="From a step being due to its claim"
        )
        self.step_duration = meter.create_histogram(
            "pikku.step.duration", unit="s", description="How long a step attempt ran"
        )
        if queue_metrics:
            meter.create_observable_gauge(
                "pikku.queue.depth",
                callbacks=[self._observe_depth],
                unit="{step}",
                description="Steps due and waiting for a worker",
            )
            meter.create_observable_gauge(
                "pikku.queue.oldest_age",
                callbacks=[self._observe_age],
                unit="s",
                description="How long the oldest waiting step has waited",
            )
        self._spans: dict[tuple[Any, ...], Span] = {}
        self._lock = threading.Lock()
        self._receivers: dict[Signal, Callable[..., Any]] = {
            signals.run_pass_started: self.on_run_pass_started,
            signals.run_pass_finished: self.on_run_pass_finished,
            signals.step_attempt_started: self.on_step_attempt_started,
            signals.step_attempt_succeeded: self.on_step_attempt_succeeded,
            signals.step_attempt_failed: self.on_step_attempt_failed,
            signals.run_finished: self.on_run_finished,
        }

    # -- wiring ----------------------------------------------------------------------------

    def connect(self) -> None:
        for signal, receiver in self._receivers.items():
            signal.connect(receiver, weak=False, dispatch_uid=(SCOPE, id(self), receiver.__name__))

    def disconnect(self) -> None:
        for signal, receiver in self._receivers.items():
            signal.disconnect(dispatch_uid=(SCOPE, id(self), receiver.__name__))
        with self._lock:
            spans, self._spans = list(self._spans.values()), {}
        for span in spans:  # left open by a pass or attempt that never reported back
            span.end()

    # -- spans -----------------------------------------------------------------------------

    def _start(self, key: tuple[Any, ...], name: str, trace_context: Any, **attrs: Any) -> None:
        parent = extract(trace_context) if isinstance(trace_context, Mapping) else None
        span = self.tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={k: v for k, v in attrs.items() if v is not None},
        )
        with self._lock:
            old = self._spans.pop(key, None)
            self._spans[key] = span
        if old is not None:  # a pass or attempt that never reported back
            old.end()

    def _end(self, key: tuple[Any, ...], error: str | None = None, **attrs: Any) -> None:
        with self._lock:
            span = self._spans.pop(key, None)
        if span is None:
            return
        for name, value in attrs.items():
            if value is not None:
                span.set_attribute(name, value)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def on_run_pass_started(self, sender: Any, *, run_id: Any, workflow: str, **kw: Any) -> None:
        self._start(
            ("pass", str(run_id)),
            f"pikku.run_pass {workflow}",
            kw.get("trace_context"),
            **{"pikku.run_id": str(run_id), "pikku.workflow": workflow},
        )

    def on_run_pass_finished(self, sender: Any, *, run_id: Any, **kw: Any) -> None:
        status = kw.get("status")
        error = "run failed" if status == "failed" else None
        self._end(("pass", str(run_id)), error, **{"pikku.run_status": status})

    def on_step_attempt_started(
        self, sender: Any, *, run_id: Any, workflow: str, step: str, attempt: int, **kw: Any
    ) -> None:
        attrs = self._step_attrs(workflow, step, kw.get("queue"))
        self.steps_started.add(1, attrs)
        latency = kw.get("claim_latency")
        if latency is not None:
            self.claim_latency.record(max(0.0, float(latency)), attrs)
        self._start(
            ("step", str(run_id), step, attempt),
            f"pikku.step {step}",
            kw.get("trace_context"),
            **{
                "pikku.run_id": str(run_id),
                "pikku.attempt": attempt,
                "pikku.worker": kw.get("worker"),
                **attrs,
            },
        )

    def on_step_attempt_succeeded(
        self, sender: Any, *, run_id: Any, workflow: str, step: str, attempt: int, **kw: Any
    ) -> None:
        attrs = self._step_attrs(workflow, step, kw.get("queue"))
        self.steps_succeeded.add(1, attrs)
        self._record_duration(kw.get("duration"), attrs)
        self._end(("step", str(run_id), step, attempt))

    def on_step_attempt_failed(
        self, sender: Any, *, run_id: Any, workflow: str, step: str, attempt: int, **kw: Any
    ) -> None:
        attrs = self._step_attrs(workflow, step, kw.get("queue"))
        error_type = kw.get("error_type") or "Exception"
        self.steps_failed.add(1, {**attrs, "error.type": error_type})
        self._record_duration(kw.get("duration"), attrs)
        key = ("step", str(run_id), step, attempt)
        with self._lock:
            span = self._spans.get(key)
        if span is not None:
            span.add_event(
                "exception",
                {
                    "exception.type": error_type,
                    "exception.message": str(kw.get("error_message") or ""),
                },
            )
        self._end(
            key,
            f"{error_type}: {kw.get('error_message') or ''}".rstrip(": "),
            **{"error.type": error_type, "pikku.will_retry": bool(kw.get("will_retry"))},
        )

    def on_run_finished(
        self, sender: Any, *, run_id: Any, workflow: str, status: str, **kw: Any
    ) -> None:
        self.runs_finished.add(1, {"pikku.workflow": workflow, "pikku.run_status": status})

    # -- metrics ---------------------------------------------------------------------------

    @staticmethod
    def _step_attrs(workflow: str, step: str, queue: str | None) -> dict[str, str]:
        attrs = {"pikku.workflow": workflow, "pikku.step": step}
        if queue:
            attrs["pikku.queue"] = queue
        return attrs

    def _record_duration(self, duration: Any, attrs: dict[str, str]) -> None:
        if duration is not None:
            self.step_duration.record(max(0.0, float(duration)), attrs)

    def _depths(self) -> list[tuple[str, int, float]]:
        from pikku_django.conf import pikku_settings

        try:
            return queue_depths(self.using or str(pikku_settings.WORKFLOW_DATABASE))
        except Exception:
            logger.warning("Could not read the queue depths for metrics", exc_info=True)
            return []

    def _observe_depth(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"pikku.queue": q}) for q, n, _ in self._depths()]

    def _observe_age(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(age, {"pikku.queue": q}) for q, _, age in self._depths()]


_installed: Telemetry | None = None
_install_lock = threading.Lock()


def install(
    tracer_provider: Any = None,
    meter_provider: Any = None,
    *,
    using: str | None = None,
    queue_metrics: bool = True,
) -> Telemetry:
    """Report runs and steps through OpenTelemetry from now on (again: replaces the last)."""
    global _installed
    with _install_lock:
        if _installed is not None:
            _installed.disconnect()
        _installed = Telemetry(
            tracer_provider, meter_provider, using=using, queue_metrics=queue_metrics
        )
        _installed.connect()
        set_trace_context_provider(current_trace_context)
        return _installed


def uninstall() -> None:
    """Stop reporting (ending any span left open)."""
    global _installed
    with _install_lock:
        if _installed is not None:
            _installed.disconnect()
            _installed = None
        set_trace_context_provider(None)


__all__ = ["Telemetry", "current_trace_context", "install", "queue_depths", "uninstall"]
