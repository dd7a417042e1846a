"""Step failures reported to Sentry, read back from the SDK's own transport in memory: a
final failure once, with its tags, the run's admin link and a breadcrumb per attempt; a
step retried to success not at all (each attempt with SENTRY_EACH_ATTEMPT); a superseded
attempt never."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import reverse

from pikku_django import signals
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, StepStatus
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.errors import WorkflowStepSupersededError
from tests.conftest import database_alias, on_databases

sentry_sdk = pytest.importorskip("sentry_sdk", reason="pip install 'pikku-django[sentry]'")

from sentry_sdk.envelope import Envelope  # noqa: E402
from sentry_sdk.transport import Transport  # noqa: E402

from pikku_django.integrations import sentry  # noqa: E402

CALLS: dict[str, int] = {}


class PaymentDeclinedError(Exception):
    """What the test steps raise."""


def _hit(data: dict[str, Any]) -> int:
    CALLS[data["tag"]] = CALLS.get(data["tag"], 0) + 1
    return CALLS[data["tag"]]


@step(name="obs.declines", retries=1, retry_delay=0)
def declines(data: dict[str, Any]) -> str:
    _hit(data)
    raise PaymentDeclinedError(f"card of {data['tag']} declined")


@step(name="obs.declines_once", retries=2, retry_delay=0)
def declines_once(data: dict[str, Any]) -> str:
    if _hit(data) == 1:
        raise PaymentDeclinedError("declined once")
    return "charged"


@step(name="obs.stale_declines")
def stale_declines(data: dict[str, Any]) -> str:
    if _hit(data) == 1:
        raise PaymentDeclinedError("the stale attempt failed")
    return "charged"


@workflow(name="obs.charge")
def charge(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.do("charge", input["function"], input, queue=input.get("queue"))


class MemoryTransport(Transport):
    """Keeps every envelope the SDK would send."""

    def __init__(self) -> None:
        super().__init__()
        self.envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)

    def events(self) -> list[dict[str, Any]]:
        found = (envelope.get_event() for envelope in self.envelopes)
        return [event for event in found if event is not None]


@pytest.fixture
def reported(settings: Any) -> Iterator[MemoryTransport]:
    transport = MemoryTransport()
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=transport,
        default_integrations=False,
        auto_enabling_integrations=False,
    )
    settings.PIKKU = {**settings.PIKKU, "SENTRY": True}
    sentry.install()
    try:
        yield transport
    finally:
        sentry.uninstall()
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)


def engine_on(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())


@on_databases("sqlite", "postgres", "mariadb")
def test_a_final_failure_is_reported_once_with_its_tags_link_and_attempts(
    vendor: str, reported: MemoryTransport, settings: Any
) -> None:
    settings.PIKKU = {**settings.PIKKU, "ADMIN_BASE_URL": "https://ops.example.com/"}
    engine = engine_on(database_alias(vendor))
    tag = uuid.uuid4().hex
    run = engine.start("obs.charge", {"tag": tag, "function": "obs.declines", "queue": "payments"})
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert CALLS[tag] == 2

    (event,) = reported.events()
    assert event["level"] == "error"
    assert {k: v for k, v in event["tags"].items() if k.startswith("pikku.")} == {
        "pikku.workflow": "obs.charge",
        "pikku.run_id": str(run.id),
        "pikku.step": "charge",
        "pikku.attempt": "2",
        "pikku.queue": "payments",
    }
    (raised,) = event["exception"]["values"]
    assert raised["type"] == "PaymentDeclinedError"
    assert raised["value"] == f"card of {tag} declined"
    assert raised["stacktrace"]["frames"][-1]["function"] == "declines"
    context = event["contexts"]["pikku_run"]
    path = reverse("admin:pikku_django_workflowrun_change", args=[run.id])
    assert context["admin_url"] == f"https://ops.example.com{path}"
    assert context["will_retry"] is False
    crumbs = [c["message"] for c in event["breadcrumbs"]["values"]]
    stored = f"{__name__}.PaymentDeclinedError: card of {tag} declined"
    assert crumbs == [f"attempt 1 failed: {stored}", f"attempt 2 failed: {stored}"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("each_attempt", [False, True])
def test_a_step_retried_to_success_is_reported_only_per_attempt(
    each_attempt: bool, reported: MemoryTransport, settings: Any
) -> None:
    settings.PIKKU = {**settings.PIKKU, "SENTRY_EACH_ATTEMPT": each_attempt}
    engine = engine_on("default")
    tag = uuid.uuid4().hex
    run = engine.start("obs.charge", {"tag": tag, "function": "obs.declines_once"})
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    events = reported.events()
    if not each_attempt:
        assert events == []
        return
    (event,) = events
    assert event["level"] == "warning"
    assert event["tags"]["pikku.attempt"] == "1"
    assert event["contexts"]["pikku_run"]["will_retry"] is True
    assert event["contexts"]["pikku_run"]["admin_url"] == reverse(
        "admin:pikku_django_workflowrun_change", args=[run.id]
    )


@pytest.mark.django_db(transaction=True)
def test_a_superseded_attempt_sends_no_failure_and_is_never_reported(
    reported: MemoryTransport, settings: Any
) -> None:
    settings.PIKKU = {**settings.PIKKU, "SENTRY_EACH_ATTEMPT": True}
    sent: list[tuple[str, dict[str, Any]]] = []

    def receiver(sender: Any, *, signal: Any, **kwargs: Any) -> None:
        name = next(n for n, s in signals.ALL_SIGNALS.items() if s is signal)
        sent.append((name, kwargs))

    for name in ("step_attempt_failed", "step_attempt_superseded"):
        signals.ALL_SIGNALS[name].connect(receiver, weak=False, dispatch_uid=("obs", name))
    try:
        engine = engine_on("default")
        tag = uuid.uuid4().hex
        run = engine.start("obs.charge", {"tag": tag, "function": "obs.stale_declines"})
        [run_id] = engine.claim_due_runs(1)
        engine.orchestrate(run_id)
        work = engine.steps().get(run_id=run.id, name="charge")
        stale = engine.claim_step(work.id)
        assert stale is not None
        engine.steps().filter(id=work.id).update(lease_expires_at=1)  # its lease lapses
        fresh = engine.claim_step(work.id)
        assert fresh is not None
        assert (stale.attempt, fresh.attempt) == (1, 2)
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_error(work.id, RuntimeError("stale"), stale.attempt)

        engine.execute_step(stale)  # raises PaymentDeclinedError, under a lost lease
        assert CALLS[tag] == 1
        assert [name for name, _ in sent] == ["step_attempt_superseded"]
        assert sent[0][1]["attempt"] == 1
        assert reported.events() == []
        assert engine.steps().get(id=work.id).status == StepStatus.RUNNING

        engine.execute_step(fresh)
        engine.run_until_idle()
    finally:
        for name in ("step_attempt_failed", "step_attempt_superseded"):
            signals.ALL_SIGNALS[name].disconnect(dispatch_uid=("obs", name))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert reported.events() == []
