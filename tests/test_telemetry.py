"""The signals, and the OpenTelemetry receivers on them, with the SDK's in-memory exporters.

The signals are sent here as the engine sends them (see pikku_django/signals.py);
the spans' tree and the metrics are read back from the in-memory exporter.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from pikku_django import signals
from pikku_django.models import StepKind, StepStatus

otel = pytest.importorskip("opentelemetry.sdk", reason="pip install 'pikku-django[otel]'")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

from pikku_django import telemetry  # noqa: E402
from tests.factories import WorkflowRunFactory, WorkflowStepFactory  # noqa: E402


@pytest.fixture
def otel_setup() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader, TracerProvider]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry.install(tracer_provider, meter_provider, using="default")
    yield exporter, reader, tracer_provider
    telemetry.uninstall()


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


def one_run(trace_context: Any) -> str:
    """Send what the engine sends for a run whose step fails once, then succeeds."""
    run = str(uuid.uuid4())
    common = {"run_id": run, "workflow": "shop.checkout"}
    step = {**common, "step": "charge", "queue": "payments", "worker": "host:1"}
    send = signals.send
    send(
        signals.run_started,
        None,
        **common,
        input={},
        parent_run_id=None,
        trace_context=trace_context,
    )
    send(signals.run_pass_started, None, **common, trace_context=trace_context)
    send(signals.run_pass_finished, None, **common, trace_context=trace_context, status="running")
    send(
        signals.step_attempt_started,
        None,
        **step,
        attempt=1,
        claim_latency=0.25,
        trace_context=trace_context,
    )
    send(
        signals.step_attempt_failed,
        None,
        **step,
        attempt=1,
        duration=0.5,
        error_type="TimeoutError",
        error_message="gateway",
        will_retry=True,
    )
    send(
        signals.step_attempt_started,
        None,
        **step,
        attempt=2,
        claim_latency=1.0,
        trace_context=trace_context,
    )
    send(signals.step_attempt_succeeded, None, **step, attempt=2, duration=0.1)
    send(signals.run_pass_started, None, **common, trace_context=trace_context)
    send(signals.run_pass_finished, None, **common, trace_context=trace_context, status="completed")
    send(signals.run_finished, None, **common, status="completed", error_type=None, duration=2.0)
    return run


@pytest.mark.django_db
def test_spans_hang_under_the_caller_trace_and_metrics_count_attempts(otel_setup: Any) -> None:
    exporter, reader, tracer_provider = otel_setup
    tracer = tracer_provider.get_tracer("the-app")
    with tracer.start_as_current_span("POST /checkout") as caller:
        context = telemetry.current_trace_context()
    assert context is not None
    assert "traceparent" in context
    run = one_run(context)

    finished = exporter.get_finished_spans()
    assert sorted(s.name for s in finished) == [
        "POST /checkout",
        "pikku.run_pass shop.checkout",
        "pikku.run_pass shop.checkout",
        "pikku.step charge",
        "pikku.step charge",
    ]
    [root] = [s for s in finished if s.name == "POST /checkout"]
    passes = [s for s in exporter.get_finished_spans() if s.name.startswith("pikku.run_pass")]
    steps = [s for s in exporter.get_finished_spans() if s.name.startswith("pikku.step")]
    assert len(passes) == 2
    assert len(steps) == 2
    for span in passes + steps:
        assert span.context.trace_id == caller.get_span_context().trace_id
        assert span.parent.span_id == root.context.span_id
        assert span.attributes["pikku.run_id"] == run
    first, second = sorted(steps, key=lambda s: s.attributes["pikku.attempt"])
    assert first.status.status_code == StatusCode.ERROR
    assert first.attributes["error.type"] == "TimeoutError"
    assert first.attributes["pikku.will_retry"] is True
    assert [e.name for e in first.events] == ["exception"]
    assert first.events[0].attributes["exception.type"] == "TimeoutError"
    assert second.status.status_code == StatusCode.UNSET
    assert second.attributes["pikku.queue"] == "payments"
    assert second.attributes["pikku.worker"] == "host:1"

    points = metric_points(reader)
    assert sum(p.value for p in points["pikku.steps.started"]) == 2
    assert sum(p.value for p in points["pikku.steps.succeeded"]) == 1
    [failed] = points["pikku.steps.failed"]
    assert (failed.value, failed.attributes["error.type"]) == (1, "TimeoutError")
    [latency] = points["pikku.step.claim_latency"]
    assert (latency.count, latency.sum) == (2, 1.25)
    [done] = points["pikku.runs.finished"]
    assert done.attributes == {"pikku.workflow": "shop.checkout", "pikku.run_status": "completed"}


@pytest.mark.django_db
def test_without_a_caller_trace_each_pass_starts_its_own(otel_setup: Any) -> None:
    exporter, _, _ = otel_setup
    one_run(None)
    passes = [s for s in exporter.get_finished_spans() if s.name.startswith("pikku.run_pass")]
    assert all(s.parent is None for s in passes)


@pytest.mark.django_db
def test_queue_depth_and_age_are_read_from_the_database(otel_setup: Any) -> None:
    _, reader, _ = otel_setup
    run = WorkflowRunFactory()
    now = timezone.now()
    for n, queue in enumerate(("payments", "payments", "reports")):
        WorkflowStepFactory(
            run=run,
            name=f"s{n}",
            kind=StepKind.QUEUED,
            status=StepStatus.SCHEDULED,
            queue=queue,
            available_at=now - timedelta(seconds=30 * (n + 1)),
        )
    WorkflowStepFactory(
        run=run,
        name="later",
        status=StepStatus.SCHEDULED,
        queue="reports",
        available_at=now + timedelta(hours=1),
    )
    points = metric_points(reader)
    depth = {p.attributes["pikku.queue"]: p.value for p in points["pikku.queue.depth"]}
    assert depth == {"payments": 2, "reports": 1}
    age = {p.attributes["pikku.queue"]: p.value for p in points["pikku.queue.oldest_age"]}
    assert 60 <= age["payments"] < 120
    assert 90 <= age["reports"] < 150


def test_a_receiver_that_raises_does_not_stop_the_sender(caplog: Any) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver broke")

    seen: list[dict[str, Any]] = []

    def fine(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs)

    signals.run_suspended.connect(broken, weak=False, dispatch_uid="t-broken")
    signals.run_suspended.connect(fine, weak=False, dispatch_uid="t-fine")
    try:
        signals.send(signals.run_suspended, None, run_id="r", workflow="w", reason="why")
    finally:
        signals.run_suspended.disconnect(dispatch_uid="t-broken")
        signals.run_suspended.disconnect(dispatch_uid="t-fine")
    assert seen == [
        {"signal": signals.run_suspended, "run_id": "r", "workflow": "w", "reason": "why"}
    ]
    assert "receiver broke" in caplog.text


def test_uninstall_stops_reporting(otel_setup: Any) -> None:
    exporter, _, _ = otel_setup
    telemetry.uninstall()
    signals.send(signals.run_pass_started, None, run_id="r", workflow="w", trace_context=None)
    signals.send(signals.run_pass_finished, None, run_id="r", workflow="w", status="completed")
    assert exporter.get_finished_spans() == ()
