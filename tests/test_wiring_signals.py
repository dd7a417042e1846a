"""The engine sends pikku_django.signals, and the telemetry receivers turn a real run
(with a child run, and a step that fails once) into spans and metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from pikku_django import signals
from pikku_django.models import RunStatus
from pikku_django.workflows import WorkflowContext, WorkflowEngine, registry, step, workflow
from pikku_django.workflows.tracing import current_trace_context

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

ATTEMPTS: dict[str, int] = {}


@step(name="wiring.flaky", retries=2, retry_delay=0)
def flaky(data: dict[str, Any]) -> str:
    ATTEMPTS[data["tag"]] = ATTEMPTS.get(data["tag"], 0) + 1
    if ATTEMPTS[data["tag"]] == 1:
        raise KeyError("amount")
    return "charged"


@workflow(name="wiring.child")
def child(ctx: WorkflowContext, input: dict[str, Any]) -> str:
    return "child done"


@workflow(name="wiring.parent")
def parent(ctx: WorkflowContext, input: dict[str, Any]) -> list[Any]:
    charged = ctx.do("charge", "wiring.flaky", input)
    return [charged, ctx.do("child", "wiring.child", {})]


@workflow(name="wiring.waits")
def waits(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.suspend("approval")


@pytest.fixture
def otel_setup() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader, TracerProvider]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    telemetry.install(tracer_provider, MeterProvider(metric_readers=[reader]), using="default")
    yield exporter, reader, tracer_provider
    telemetry.uninstall()


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    receivers = {}
    for name, signal in signals.ALL_SIGNALS.items():

        def receiver(sender: Any, *, _name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            seen.append((_name, kwargs))

        receivers[name] = receiver
        signal.connect(receiver, weak=False, dispatch_uid=("wiring-test", name))
    yield seen
    for name, signal in signals.ALL_SIGNALS.items():
        signal.disconnect(dispatch_uid=("wiring-test", name))


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


def total(points: list[Any], **attrs: str) -> float:
    return sum(p.value for p in points if all(p.attributes.get(k) == v for k, v in attrs.items()))


@pytest.mark.django_db(transaction=True)
def test_a_real_run_reports_its_span_tree_and_metrics(
    otel_setup: tuple[InMemorySpanExporter, InMemoryMetricReader, TracerProvider],
    received: list[tuple[str, dict[str, Any]]],
) -> None:
    exporter, reader, provider = otel_setup
    engine = WorkflowEngine()
    tracer = provider.get_tracer("shop")
    with tracer.start_as_current_span("POST /checkout") as caller:
        run = engine.start("wiring.parent", {"tag": "tree"})
    assert run.trace_context
    assert "traceparent" in run.trace_context
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    child_run = engine.runs().get(workflow="wiring.child")
    assert child_run.trace_context == run.trace_context  # inherited

    spans = exporter.get_finished_spans()
    trace_id = caller.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}  # all under the caller's trace
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    passes = by_name["pikku.run_pass wiring.parent"]
    assert len(passes) >= 3  # before the step, after its retry, after the child
    assert by_name["pikku.run_pass wiring.child"]
    for span in passes + by_name["pikku.step charge"]:
        assert span.parent.span_id == caller.get_span_context().span_id
    failed, succeeded = sorted(by_name["pikku.step charge"], key=lambda s: s.start_time)
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "KeyError"
    assert failed.attributes["pikku.will_retry"] is True
    assert failed.attributes["pikku.attempt"] == 1
    assert succeeded.status.status_code is StatusCode.UNSET
    assert succeeded.attributes["pikku.attempt"] == 2

    points = metric_points(reader)
    assert total(points["pikku.steps.started"], **{"pikku.step": "charge"}) == 2
    assert total(points["pikku.steps.failed"], **{"error.type": "KeyError"}) == 1
    assert total(points["pikku.steps.succeeded"], **{"pikku.step": "charge"}) == 1
    finished = points["pikku.runs.finished"]
    assert total(finished, **{"pikku.workflow": "wiring.parent"}) == 1
    assert total(finished, **{"pikku.workflow": "wiring.child"}) == 1
    assert sum(p.count for p in points["pikku.step.duration"]) == 2

    names = [name for name, _ in received]
    assert names.count("run_started") == 2
    started = {kw["workflow"]: kw for name, kw in received if name == "run_started"}
    assert started["wiring.child"]["parent_run_id"] == run.id
    assert started["wiring.parent"]["input"] == {"tag": "tree"}
    fail = next(kw for name, kw in received if name == "step_attempt_failed")
    assert fail["error_type"] == "KeyError"
    assert fail["will_retry"] is True
    assert fail["workflow"] == "wiring.parent"
    assert fail["queue"] == "default"
    first = next(kw for name, kw in received if name == "step_attempt_started")
    assert first["claim_latency"] is not None
    assert first["claim_latency"] >= 0
    done = [kw for name, kw in received if name == "run_finished"]
    assert {(kw["workflow"], kw["status"]) for kw in done} == {
        ("wiring.parent", "completed"),
        ("wiring.child", "completed"),
    }
    pass_done = [kw for name, kw in received if name == "run_pass_finished"]
    assert pass_done[-1]["status"] == "completed"


@pytest.mark.django_db(transaction=True)
def test_suspend_and_cancel_are_signalled(received: list[tuple[str, dict[str, Any]]]) -> None:
    engine = WorkflowEngine()
    run = engine.start("wiring.waits", {})
    engine.run_until_idle()
    assert (
        "run_suspended",
        {"run_id": run.id, "workflow": "wiring.waits", "reason": "approval"},
    ) in received
    engine.cancel(run.id)
    (finished,) = [kw for name, kw in received if name == "run_finished"]
    assert finished["status"] == "cancelled"
    assert finished["run_id"] == run.id
    assert run.trace_context is None
    assert current_trace_context() is None


@pytest.mark.django_db(transaction=True)
def test_nothing_is_sent_for_a_start_that_rolls_back(
    received: list[tuple[str, dict[str, Any]]],
) -> None:
    engine = WorkflowEngine()
    with pytest.raises(RuntimeError), transaction.atomic():
        engine.start("wiring.waits", {})
        assert received == []  # not before the commit
        raise RuntimeError("rolled back")
    assert received == []
    engine.start("wiring.waits", {})
    assert [name for name, _ in received] == ["run_started"]


def test_the_test_workflows_are_registered() -> None:
    assert registry.get_workflow("wiring.parent") is not None
