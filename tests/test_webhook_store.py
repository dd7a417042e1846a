"""Storing accepted webhook events as receipts, and starting their runs, on every database."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from pikku_django.models import RunStatus, TriggerSource, WebhookReceipt, WorkflowRun
from pikku_django.wakeups import RECEIPTS_WAITING
from pikku_django.wakeups import WORK_CHANNEL as CHANNEL
from pikku_django.webhooks import (
    ReceiveContext,
    WebhookEvent,
    credential_name,
    set_credential,
)
from pikku_django.webhooks.dispatch import (
    DISPATCH_WORKFLOW,
    accept_events,
    new_events,
    store_new_event,
    waiting_receipts,
)
from pikku_django.webhooks.lifecycle import sync
from pikku_django.webhooks.sql import NewEvent, store_event
from pikku_django.workflows import get_engine, start_waiting_runs
from pikku_django.workflows.api import reset_engine
from tests import webhook_defs
from tests.conftest import database_alias, on_databases

VENDORS = ("sqlite", "postgres", "mariadb")
SECRET = "It's a Secret to Everybody"
URL = "/pikku/webhooks/wh-github/"
DATA = {"ref": "main", "n": [1, 2.5, None, "ü"]}


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    reset_engine()
    yield
    reset_engine()


def workflow_database(vendor: str, settings: Any, **pikku: Any) -> str:
    """Put the workflow tables (runs and receipts) on ``vendor``'s database."""
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, **pikku}
    reset_engine()
    return alias


def new_event(
    provider_id: str = "e-1", *, data: Any = DATA, handler: str | None = None
) -> NewEvent:
    """An event for wh-github:push; ``data=None`` is an event without data."""
    return NewEvent(
        source="wh-github",
        event="push",
        provider_id=provider_id,
        data_json=None if data is None else json.dumps(data),
        workflow=DISPATCH_WORKFLOW if handler else "wh.deploy",
        handler=handler,
    )


def sign(body: bytes) -> str:
    return "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


def post(client: Client, body: bytes, *, event: str = "push", delivery: str) -> Any:
    return client.post(
        URL,
        body,
        content_type="application/json",
        HTTP_X_GITHUB_EVENT=event,
        HTTP_X_GITHUB_DELIVERY=delivery,
        HTTP_X_HUB_SIGNATURE_256=sign(body),
    )


@pytest.fixture
def enabled() -> None:
    sync()
    TriggerSource.objects.filter(name="wh-github").update(enabled=True)
    set_credential(credential_name("wh-github"), SECRET)


def test_the_run_input_is_what_json_dumps_writes() -> None:
    event = new_event('id "quoted" \\ ü\n', data={"a": [1, {"b": None}], "é": "\u2028"})
    expected = {
        "source": "wh-github",
        "event": "push",
        "id": 'id "quoted" \\ ü\n',
        "data": {"a": [1, {"b": None}], "é": "\u2028"},
    }
    assert event.input_json() == json.dumps(expected)
    wrapped = new_event("x", data=[1], handler="webhook:wh-github:push:fn")
    assert json.loads(wrapped.input_json()) == {
        "handler": "webhook:wh-github:push:fn",
        "event": {"source": "wh-github", "event": "push", "id": "x", "data": [1]},
    }
    assert json.loads(new_event("x", data=None).input_json())["data"] is None


def stored(alias: str) -> bool:
    """Store the default event (wh-github:push e-1) on ``alias``; whether it was new."""
    return store_event(alias, new_event(), notify=True)


@on_databases(*VENDORS)
def test_a_new_event_is_stored_as_a_receipt_waiting_for_its_run(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    before = timezone.now()
    assert stored(alias) is True
    receipt = WebhookReceipt.objects.using(alias).get()
    assert (receipt.source, receipt.event, receipt.provider_id) == ("wh-github", "push", "e-1")
    assert before <= receipt.received_at <= timezone.now()
    assert receipt.waiting
    assert receipt.run_id is None
    assert receipt.workflow == "wh.deploy"
    assert receipt.input == {"source": "wh-github", "event": "push", "id": "e-1", "data": DATA}
    assert not WorkflowRun.objects.using(alias).exists()  # a worker starts it


@on_databases(*VENDORS)
def test_a_worker_starts_the_run_and_moves_the_input_to_it(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    assert stored(alias)
    before = timezone.now()
    assert start_waiting_runs(get_engine()) == 1
    receipt = WebhookReceipt.objects.using(alias).get()
    run = WorkflowRun.objects.using(alias).get()
    assert receipt.run_id == run.id
    assert receipt.input is None  # the data is kept once, in the run's input
    assert not receipt.waiting
    assert run.workflow == "wh.deploy"
    assert run.status == RunStatus.RUNNING
    assert before <= run.wake_at <= timezone.now()  # due at once
    assert run.idempotency_key == "webhook:wh-github:push:e-1"
    assert run.input == {"source": "wh-github", "event": "push", "id": "e-1", "data": DATA}
    assert (run.output, run.error, run.suspend_reason, run.inline, run.wakes) == (
        None,
        None,
        "",
        False,
        0,
    )
    assert start_waiting_runs(get_engine()) == 0


@on_databases(*VENDORS)
def test_the_run_is_the_one_the_engine_would_create(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    engine = get_engine()
    event = new_event("same")
    with transaction.atomic(using=alias):
        made = engine.create_run(
            "wh.deploy", json.loads(event.input_json()), idempotency_key="engine-made"
        )
    assert store_event(alias, event, notify=True)
    assert start_waiting_runs(engine) == 1
    started = WorkflowRun.objects.using(alias).exclude(id=made.id).get()
    made.refresh_from_db()
    skip = {"id", "idempotency_key", "wake_at", "created_at", "updated_at"}
    for field in WorkflowRun._meta.concrete_fields:
        if field.attname not in skip:
            assert getattr(started, field.attname) == getattr(made, field.attname), field.name


@on_databases(*VENDORS)
def test_runs_start_oldest_first_in_batches(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    for n in range(5):
        assert store_event(alias, new_event(f"b-{n}"), notify=True)
    engine = get_engine()
    assert start_waiting_runs(engine, limit=2) == 2
    started = WebhookReceipt.objects.using(alias).filter(run__isnull=False)
    assert sorted(started.values_list("provider_id", flat=True)) == ["b-0", "b-1"]
    assert start_waiting_runs(engine, limit=10) == 3
    assert WorkflowRun.objects.using(alias).count() == 5
    assert not waiting_receipts(engine).exists()


@on_databases(*VENDORS)
def test_event_without_data_stores_json_null(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    assert store_event(alias, new_event(data=None), notify=True)
    assert WebhookReceipt.objects.using(alias).get().input["data"] is None
    assert start_waiting_runs(get_engine()) == 1
    assert WorkflowRun.objects.using(alias).get().input["data"] is None


@on_databases(*VENDORS)
def test_a_redelivery_stores_nothing_and_starts_no_run(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    assert store_event(alias, new_event("d"), notify=True)
    again = new_event("d", data={"ref": "other"})
    assert store_event(alias, again, notify=True) is False
    assert WebhookReceipt.objects.using(alias).get().input["data"]["ref"] == "main"
    assert start_waiting_runs(get_engine()) == 1
    assert store_event(alias, again, notify=True) is False  # once its run started, too
    assert start_waiting_runs(get_engine()) == 0
    assert WebhookReceipt.objects.using(alias).get().run.input["data"]["ref"] == "main"
    assert WorkflowRun.objects.using(alias).count() == 1


@on_databases(*VENDORS)
def test_a_redelivery_after_its_run_was_pruned_starts_no_run(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    assert store_event(alias, new_event("p"), notify=True)
    start_waiting_runs(get_engine())
    handled_by = WorkflowRun.objects.using(alias).get().id
    WorkflowRun.objects.using(alias).all().delete()
    # The receipt outlives its run and keeps its id (no constraint ties them).
    assert WebhookReceipt.objects.using(alias).get().run_id == handled_by
    assert store_event(alias, new_event("p"), notify=True) is False
    assert start_waiting_runs(get_engine()) == 0
    assert not WorkflowRun.objects.using(alias).exists()
    assert WebhookReceipt.objects.using(alias).get().run_id == handled_by


@on_databases(*VENDORS)
def test_a_run_that_holds_the_event_key_is_linked_not_started_again(
    vendor: str, settings: Any
) -> None:
    alias = workflow_database(vendor, settings)
    existing = WorkflowRun.objects.using(alias).create(
        workflow="wh.deploy", idempotency_key="webhook:wh-github:push:k"
    )
    assert store_event(alias, new_event("k"), notify=True)
    assert start_waiting_runs(get_engine()) == 1  # linked, not started
    assert WebhookReceipt.objects.using(alias).get().run_id == existing.id
    assert WebhookReceipt.objects.using(alias).get().input is None
    assert WorkflowRun.objects.using(alias).count() == 1


@on_databases(*VENDORS)
def test_in_a_transaction_a_refused_event_leaves_it_usable(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    with transaction.atomic(using=alias):
        assert store_event(alias, new_event("a"), notify=True)
        assert store_event(alias, new_event("a"), notify=True) is False
        assert store_event(alias, new_event("b"), notify=True)
        assert WebhookReceipt.objects.using(alias).count() == 2
    assert sorted(WebhookReceipt.objects.using(alias).values_list("provider_id", flat=True)) == [
        "a",
        "b",
    ]


@on_databases(*VENDORS)
def test_a_rolled_back_transaction_takes_the_receipt_back(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        assert store_event(alias, new_event("r"), notify=True)
        raise RuntimeError("the caller failed")
    assert not WebhookReceipt.objects.using(alias).exists()


def at_once(alias: str, threads: int, work: Any) -> list[Any]:
    """``work()`` in ``threads`` threads started together: what each returned (or raised)."""
    start = threading.Barrier(threads)
    results: list[Any] = []

    def run() -> None:
        try:
            start.wait()
            results.append(work())
        except Exception as exc:  # handed back to the test
            results.append(exc)
        finally:
            connections[alias].close()

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return results


@on_databases(*VENDORS)
def test_the_same_event_delivered_twice_at_once_is_stored_once(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    results = at_once(alias, 4, lambda: store_event(alias, new_event("race"), notify=True))
    assert sorted(results) == [False, False, False, True]
    assert WebhookReceipt.objects.using(alias).count() == 1


@on_databases(*VENDORS)
def test_workers_starting_runs_at_once_start_each_run_once(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    for n in range(40):
        assert store_event(alias, new_event(f"w-{n}"), notify=True)

    def promote() -> int:
        engine, linked = get_engine(), 0
        while done := start_waiting_runs(engine, limit=5):
            linked += done
        return linked

    results = at_once(alias, 3, promote)
    assert all(isinstance(linked, int) for linked in results), results  # no thread raised
    assert sum(results) == 40
    runs = WorkflowRun.objects.using(alias)
    assert runs.count() == 40
    receipts = WebhookReceipt.objects.using(alias)
    assert receipts.filter(run__isnull=True).count() == 0
    assert sorted(receipts.values_list("run_id", flat=True)) == sorted(
        runs.values_list("id", flat=True)
    )


@on_databases("postgres")
def test_postgres_stores_an_event_with_one_statement(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    connections[alias].ensure_connection()
    with CaptureQueriesContext(connections[alias]) as captured:
        assert stored(alias)
        assert stored(alias) is False
    assert [q["sql"][:4] for q in captured.captured_queries] == ["WITH", "WITH"]


@on_databases("sqlite", "mariadb")
def test_other_databases_store_an_event_with_one_insert(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    connections[alias].ensure_connection()
    with CaptureQueriesContext(connections[alias]) as captured:
        assert stored(alias)
    assert [q["sql"].split()[0] for q in captured.captured_queries] == ["INSERT"]


def listener(alias: str) -> Any:
    """A psycopg connection to ``alias``'s database, listening on the work channel."""
    template = connections[alias]
    conn = type(template)(template.settings_dict, alias)
    conn.ensure_connection()
    raw = conn.connection
    raw.autocommit = True
    raw.execute(f"LISTEN {CHANNEL}")
    return conn


def heard(conn: Any, timeout: float = 0.5) -> int:
    """How many notifications arrive within ``timeout``; each says receipts wait."""
    notices = list(conn.connection.notifies(timeout=timeout, stop_after=1))
    assert all(n.payload == RECEIPTS_WAITING for n in notices)
    return len(notices)


@on_databases("postgres")
def test_postgres_wakes_workers_when_the_receipt_is_committed(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    conn = listener(alias)
    try:
        assert store_event(alias, new_event("n-1"), notify=True)
        assert heard(conn, timeout=60) == 1
        assert store_event(alias, new_event("n-1"), notify=True) is False
        assert heard(conn) == 0
        with transaction.atomic(using=alias):
            assert store_event(alias, new_event("n-2"), notify=True)
            assert heard(conn) == 0
        assert heard(conn, timeout=60) == 1
        assert store_event(alias, new_event("n-3"), notify=False)
        assert heard(conn) == 0
    finally:
        conn.close()


@on_databases("postgres")
def test_postgres_worker_notify_off_sends_no_notification(
    vendor: str, settings: Any, client: Client, enabled: None
) -> None:
    alias = workflow_database(vendor, settings, WORKER_NOTIFY=False)
    conn = listener(alias)
    try:
        assert post(client, b'{"ref": "quiet"}', delivery="quiet").json() == {"received": 1}
        assert heard(conn) == 0
        settings.PIKKU = {"WORKFLOW_DATABASE": alias}
        assert post(client, b'{"ref": "loud"}', delivery="loud").json() == {"received": 1}
        assert heard(conn, timeout=60) == 1
    finally:
        conn.close()


@on_databases(*VENDORS)
def test_the_view_stores_runs_workers_pick_up(
    vendor: str, settings: Any, client: Client, enabled: None
) -> None:
    alias = workflow_database(vendor, settings)
    webhook_defs.handled.clear()
    first = post(client, b'{"ref": "main"}', delivery="v-1")
    assert first.status_code == 200
    assert first.content == b'{"received": 1}'
    assert first["Content-Type"] == "application/json"
    again = post(client, b'{"ref": "main"}', delivery="v-1")
    assert (again.status_code, again.content) == (200, b'{"received": 0}')
    assert post(client, b'{"number": 3}', event="issues", delivery="v-2").json() == {"received": 1}
    assert WebhookReceipt.objects.using(alias).count() == 2
    assert not WorkflowRun.objects.using(alias).exists()  # nothing runs in the request
    assert start_waiting_runs(get_engine()) == 2
    dispatched = WorkflowRun.objects.using(alias).get(workflow=DISPATCH_WORKFLOW)
    assert dispatched.input["handler"].startswith("webhook:wh-github:issues:")
    assert dispatched.input["event"] == {
        "source": "wh-github",
        "event": "issues",
        "id": "v-2",
        "data": {"number": 3},
    }
    get_engine().run_until_idle()
    runs = {r.workflow: r for r in WorkflowRun.objects.using(alias)}
    assert runs["wh.deploy"].status == RunStatus.COMPLETED
    assert runs["wh.deploy"].output == {"deployed": "main", "delivery": "v-1"}
    assert runs[DISPATCH_WORKFLOW].status == RunStatus.COMPLETED
    assert [e["data"] for e in webhook_defs.handled] == [{"number": 3}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("data", [{"ref": float("nan")}, {"ref": {"a", "set"}}, object()])
def test_event_data_that_is_not_json_is_dropped(data: Any) -> None:
    event = WebhookEvent("push", id="bad", data=data)
    assert accept_events(webhook_defs.github, [event], delivery_id=None, body=b"{}") == 0
    assert not WebhookReceipt.objects.exists()
    assert not WorkflowRun.objects.exists()


def _context(body: bytes) -> ReceiveContext:
    return ReceiveContext(source=webhook_defs.github, body=body, verified=True, delivery_id="b-1")


def test_a_body_event_keeps_the_body_text_and_parses_it_when_read() -> None:
    body = b'{"ref":  "main", "n": [1, 2.5e0, null, "\\u00fc"]}'
    event = _context(body).body_event("push", id="b-1")
    assert (event.name, event.id) == ("push", "b-1")
    assert "unread" in repr(event)
    (row,) = new_events(webhook_defs.github, [event], delivery_id="b-1", body=body)
    assert row.data_json == body.decode()  # stored as it came, not encoded again
    assert row.data_checked is False  # so the database checks it is JSON
    assert event.data == {"ref": "main", "n": [1, 2.5, None, "ü"]}
    assert event == WebhookEvent("push", id="b-1", data=event.data)
    (row,) = new_events(webhook_defs.github, [event], delivery_id="b-1", body=body)
    assert (row.data_json, row.data_checked) == (body.decode(), True)  # parsed since


NOT_JSON = [
    b'{"ref": NaN}',
    b"[Infinity]",
    b"-Infinity",
    b"{'ref': 1}",
    b"",
    b'{"ref": 1} {"ref": 2}',
    b'{}, "source": "forged", "x": {}',  # would make the run's input say another source
]


@pytest.mark.parametrize("body", NOT_JSON)
def test_a_body_event_that_is_not_json_raises_when_its_data_is_read(body: bytes) -> None:
    event = _context(body).body_event("push")
    with pytest.raises(ValueError, match=r"is not JSON|Expecting|Extra data"):
        _ = event.data


def test_a_body_that_is_not_utf8_is_refused_at_once() -> None:
    with pytest.raises(
        ValueError, match=r"the body is not UTF-8 text \(invalid start byte at byte 0\)"
    ):
        _context(b"\xff{}").body_event("push")


@on_databases(*VENDORS)
def test_a_body_event_is_stored_as_its_data(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    body = b'{ "ref" : "main", "n": [1, 2.5, null, "\\u00fc"] }'
    event = _context(body).body_event("push", id="b-2")
    (row,) = new_events(webhook_defs.github, [event], delivery_id="b-2", body=body)
    assert store_new_event(row) == "stored"
    assert store_new_event(row) == "redelivery"
    assert WebhookReceipt.objects.using(alias).get().input["data"] == DATA
    handled = NewEvent(**{**row.__dict__, "provider_id": "b-3", "handler": "h"})
    assert store_new_event(handled) == "stored"
    assert WebhookReceipt.objects.using(alias).get(provider_id="b-3").input["event"]["data"] == DATA
    assert start_waiting_runs(get_engine()) == 2
    run = WorkflowRun.objects.using(alias).get(idempotency_key="webhook:wh-github:push:b-3")
    assert run.input["event"]["data"] == DATA


@on_databases(*VENDORS)
def test_the_database_refuses_a_body_event_that_is_not_json(vendor: str, settings: Any) -> None:
    alias = workflow_database(vendor, settings)
    for n, body in enumerate(NOT_JSON):
        event = _context(body).body_event("push", id=f"bad-{n}")
        (row,) = new_events(webhook_defs.github, [event], delivery_id=None, body=body)
        assert store_new_event(row) == "refused", body
        assert not WebhookReceipt.objects.using(alias).exists(), body
    assert store_event(alias, new_event("after"), notify=True)


@on_databases("postgres")
def test_data_the_database_refuses_is_dropped_not_raised(vendor: str, settings: Any) -> None:
    """PostgreSQL's jsonb takes no \\u0000; the event is dropped as data that is not JSON is."""
    alias = workflow_database(vendor, settings)
    event = _context(b'{"ref": "\\u0000"}').body_event("push", id="nul")
    (row,) = new_events(webhook_defs.github, [event], delivery_id="nul", body=b"")
    assert store_new_event(row) == "refused"
    assert not WebhookReceipt.objects.using(alias).exists()
    encoded = new_events(
        webhook_defs.github,
        [WebhookEvent("push", id="nul2", data={"ref": "\0"})],
        delivery_id=None,
        body=b"",
    )
    assert store_new_event(encoded[0]) == "refused"
    assert store_event(alias, new_event("after"), notify=True)


@on_databases("postgres")
def test_a_body_event_is_checked_without_prepared_statements(vendor: str, settings: Any) -> None:
    """Behind a pooler (PREPARED_STATEMENTS off) the store binds client-side, same checks."""
    alias = workflow_database(vendor, settings, PREPARED_STATEMENTS=False)
    body = b'{ "ref" : "main", "n": [1, 2.5, null, "\\u00fc"] }'
    (row,) = new_events(
        webhook_defs.github, [_context(body).body_event("push", id="u")], delivery_id="u", body=body
    )
    assert store_new_event(row) == "stored"
    assert WebhookReceipt.objects.using(alias).get().input["data"] == DATA
    forged = _context(b'{}, "source": "forged", "x": {}').body_event("push", id="v")
    (row,) = new_events(webhook_defs.github, [forged], delivery_id="v", body=b"")
    assert store_new_event(row) == "refused"
    assert WebhookReceipt.objects.using(alias).count() == 1
