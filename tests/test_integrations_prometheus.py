"""The Prometheus metrics: counted from the engine's signals, read from the database at
scrape time, added up across pikku_worker processes through prometheus-client's
multiprocess mode, and served only to a scraper with the token or to staff allowed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.utils import timezone

from pikku_django.heartbeats import record_heartbeat
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, StepAttempt, StepStatus, TriggerSource
from pikku_django.webhooks import WebhookSource, register_source
from pikku_django.webhooks.lifecycle import sync
from pikku_django.webhooks.sources import ReceiveContext, unregister_source
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.api import reset_engine
from tests.conftest import database_alias, on_databases
from tests.factories import WorkflowStepFactory
from tests.test_worker import finish, worker_process

pytest.importorskip("prometheus_client", reason="pip install 'pikku-django[prometheus]'")

from prometheus_client.parser import text_string_to_metric_families

from pikku_django.integrations import prometheus

URL = "/pikku/metrics"
TOKEN = "scrape-token"
CALLS: dict[str, int] = {}


@step(name="obs.prom_flaky", retries=2, retry_delay=0)
def prom_flaky(data: dict[str, Any]) -> str:
    CALLS[data["tag"]] = CALLS.get(data["tag"], 0) + 1
    if CALLS[data["tag"]] == 1:
        raise KeyError("amount")
    return "charged"


@workflow(name="obs.prom_charge")
def prom_charge(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    # The second "charge" is stored as charge#1: both count under the step label "charge".
    first = ctx.do("charge", "obs.prom_flaky", input, queue="payments")
    return [first, ctx.do("charge", "obs.prom_flaky", input, queue="payments")]


def metrics_settings(**more: Any) -> dict[str, Any]:
    return {"PROMETHEUS_METRICS": True, "PROMETHEUS_TOKEN": TOKEN, **more}


@pytest.fixture
def counting(settings: Any) -> Iterator[None]:
    settings.PIKKU = metrics_settings()
    prometheus.install()
    reset_engine()
    try:
        yield
    finally:
        prometheus.uninstall()
        reset_engine()


def scrape(client: Client | None = None, token: str = TOKEN) -> str:
    response = (client or Client()).get(URL, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return response.content.decode()


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels``."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


# -- who may scrape --------------------------------------------------------------------------


def user(django_user_model: Any, *, staff: bool, allowed: bool) -> Client:
    someone = django_user_model.objects.create_user(
        f"u-{uuid.uuid4().hex[:8]}", password="pw", is_staff=staff
    )
    if allowed:
        someone.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    client = Client()
    client.force_login(someone)
    return client


@pytest.mark.django_db
def test_the_view_answers_only_the_token_or_allowed_staff(
    settings: Any, django_user_model: Any
) -> None:
    assert Client().get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 404  # off

    settings.PIKKU = metrics_settings(PROMETHEUS_TOKEN=["old-token", TOKEN])
    anonymous = Client().get(URL)
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    for wrong in ("scrape-token2", "scrape", "", "Old-token"):
        assert Client().get(URL, HTTP_AUTHORIZATION=f"Bearer {wrong}").status_code == 401
    assert Client().get(URL, HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401
    assert "pikku_queue_depth" in scrape()
    assert "pikku_queue_depth" in scrape(token="old-token")
    assert Client().post(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405

    assert user(django_user_model, staff=False, allowed=True).get(URL).status_code == 403
    assert user(django_user_model, staff=True, allowed=False).get(URL).status_code == 403
    allowed = user(django_user_model, staff=True, allowed=True)
    assert allowed.get(URL).status_code == 200
    # A staff session with a wrong token is refused: the token is what was offered.
    assert allowed.get(URL, HTTP_AUTHORIZATION="Bearer nope").status_code == 401

    settings.PIKKU = metrics_settings(PROMETHEUS_TOKEN=None)
    assert Client().get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 401


# -- what is counted -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_runs_attempts_and_lease_losses_are_counted(counting: None) -> None:
    before = scrape()
    engine = WorkflowEngine("default", leases=InMemoryLeaseService(), clock=FakeClock())
    tag = uuid.uuid4().hex
    run = engine.start("obs.prom_charge", {"tag": tag})
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error

    # An attempt superseded after its lease lapsed: a lease loss, not a failure.
    lost = engine.start("obs.prom_charge", {"tag": uuid.uuid4().hex})
    [run_id] = engine.claim_due_runs(1)
    engine.orchestrate(run_id)
    work = engine.steps().get(run_id=lost.id, name="charge")
    stale = engine.claim_step(work.id)
    assert stale is not None
    engine.steps().filter(id=work.id).update(lease_expires_at=1)
    assert engine.claim_step(work.id) is not None
    engine.execute_step(stale)  # fails (KeyError), but the step is no longer its own
    assert engine.steps().get(id=work.id).status == StepStatus.RUNNING

    after = scrape()

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    charge = {"workflow": "obs.prom_charge", "step": "charge", "queue": "payments"}
    assert grew("pikku_runs_started_total", workflow="obs.prom_charge") == 2
    assert grew("pikku_runs_finished_total", workflow="obs.prom_charge", status="completed") == 1
    assert grew("pikku_step_claims_total", **charge) == 4  # three attempts, and the stale one
    assert grew("pikku_step_attempts_total", **charge, outcome="retried") == 1
    assert grew("pikku_step_attempts_total", **charge, outcome="succeeded") == 2
    assert grew("pikku_step_attempts_total", **charge, outcome="failed") == 0
    assert grew("pikku_step_lease_losses_total", **charge) == 1
    durations = {"workflow": "obs.prom_charge", "step": "charge"}
    assert grew("pikku_step_duration_seconds_count", **durations) == 3
    assert grew("pikku_step_duration_seconds_bucket", **durations, le="+Inf") == 3


def receive(request: HttpRequest, ctx: ReceiveContext) -> Any:
    if ctx.body == b"unreadable":
        raise ValueError("not a body this source reads")
    return HttpResponse(b"ok")


@pytest.mark.django_db(transaction=True)
def test_webhook_requests_are_counted_by_source_and_outcome(counting: None) -> None:
    source = register_source(WebhookSource(name="obs-prom-hook", receive=receive))
    try:
        sync()
        TriggerSource.objects.filter(name="obs-prom-hook").update(enabled=True)
        before = scrape()
        client = Client()
        route = "/pikku/webhooks/obs-prom-hook/"
        assert client.post(route, b"{}", content_type="application/json").status_code == 200
        assert client.post(route, b"{}", content_type="application/json").status_code == 200
        assert client.post(route, b"unreadable", content_type="text/plain").status_code == 400
        assert (
            client.post(
                "/pikku/webhooks/obs-nobody/", b"{}", content_type="application/json"
            ).status_code
            == 404
        )
        after = scrape()
    finally:
        unregister_source(source.name)

    def grew(**labels: str) -> float:
        name = "pikku_webhook_requests_total"
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew(source="obs-prom-hook", outcome="accepted", code="200") == 2
    assert grew(source="obs-prom-hook", outcome="refused", code="400") == 1
    assert grew() == 3  # a route no source declares is not counted


# -- read at scrape time ---------------------------------------------------------------------


@on_databases("sqlite", "postgres", "mariadb")
def test_the_scrape_reads_queue_depths_and_heartbeats(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = metrics_settings(WORKFLOW_DATABASE=alias)
    now = timezone.now()
    for seconds in (30, 5, 1):
        WorkflowStepFactory(
            database=alias, queue="obs-reports", available_at=now - timedelta(seconds=seconds)
        )
    WorkflowStepFactory(database=alias, queue="obs-later", available_at=now + timedelta(hours=1))
    WorkflowStepFactory(database=alias, queue="obs-done", status=StepStatus.SUCCEEDED)
    record_heartbeat(
        "obs-w1", queues=["default"], concurrency=4, running=3, using=alias, hostname="h1"
    )
    record_heartbeat("obs-w2", queues=["default"], concurrency=2, using=alias, hostname="h2")
    record_heartbeat("obs-w2", queues=["default"], concurrency=2, using=alias, stopping=True)

    text = scrape()
    assert total(text, "pikku_queue_depth", queue="obs-reports") == 3
    assert total(text, "pikku_queue_oldest_wait_seconds", queue="obs-reports") >= 30
    assert not [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("queue") in ("obs-later", "obs-done")
    ]
    age = total(text, "pikku_worker_heartbeat_age_seconds", worker="obs-w1", hostname="h1")
    assert 0 <= age < 60
    assert total(text, "pikku_worker_running_steps", worker="obs-w1") == 3
    assert total(text, "pikku_worker_concurrency", worker="obs-w1") == 4
    assert "obs-w2" not in text  # stopped


# -- across worker processes -----------------------------------------------------------------


@on_databases("postgres")
def test_two_worker_processes_counts_add_up_in_the_web_scrape(
    vendor: str, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    shared = tmp_path / "prometheus"
    shared.mkdir()
    engine = WorkflowEngine(alias)
    n = 24
    for i in range(n):  # enough that a worker starting a second later still finds some
        engine.start("testapp.slow_one", {"started": str(tmp_path / f"s{i}"), "seconds": 0.5})
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.metrics_worker_settings",
        "PROMETHEUS_MULTIPROC_DIR": str(shared),
    }
    workers = [worker_process(alias, "--until-idle", "--concurrency", "2", **env) for _ in (1, 2)]
    for code, out in [finish(w, timeout=180) for w in workers]:
        assert code == 0, out

    done = StepAttempt.objects.using(alias).filter(status=StepStatus.SUCCEEDED)
    by_pid: dict[str, int] = {}
    for worker in done.values_list("worker", flat=True):
        pid = worker.split(":")[1]
        by_pid[pid] = by_pid.get(pid, 0) + 1
    assert sorted(by_pid) == sorted(str(w.pid) for w in workers), by_pid  # both worked
    assert sum(by_pid.values()) == n
    assert {f"counter_{w.pid}.db" for w in workers} <= {p.name for p in shared.iterdir()}

    # The web process reads every process's counts from the shared directory.
    settings.PIKKU = metrics_settings(WORKFLOW_DATABASE=alias)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(shared))
    text = scrape()
    slow = {"workflow": "testapp.slow_one", "step": "slow"}
    assert total(text, "pikku_step_attempts_total", **slow, outcome="succeeded") == n
    assert total(text, "pikku_step_claims_total", **slow) == n
    assert total(text, "pikku_step_duration_seconds_count", **slow) == n
    finished = total(
        text, "pikku_runs_finished_total", workflow="testapp.slow_one", status="completed"
    )
    assert finished == n
    assert total(text, "pikku_queue_depth") == 0  # read from the database as well
