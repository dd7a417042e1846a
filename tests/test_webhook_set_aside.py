"""A stored event whose run cannot be started is set aside with its reason, and the
events after it start all the same: visible and deletable in the admin, pruned."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from pikku_django.models import WebhookReceipt, WorkflowRun
from pikku_django.webhooks.dispatch import start_waiting_runs, waiting_receipts
from pikku_django.webhooks.sql import NewEvent, store_event
from pikku_django.workflows import get_engine, workflow
from pikku_django.workflows.api import reset_engine
from tests import webhook_defs  # noqa: F401  (declares wh-github and wh.deploy)
from tests.conftest import database_alias, on_databases

VENDORS = ("sqlite", "postgres", "mariadb")
#: An integer valid to every database that Python refuses to read (4,300 digits at most).
BIG = "9" * 4400
CHANGELIST = reverse("admin:pikku_django_webhookreceipt_changelist")


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    reset_engine()
    yield
    reset_engine()


def on_vendor(vendor: str, settings: Any) -> str:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    return alias


def event(provider_id: str, data_json: str, workflow: str = "wh.deploy") -> NewEvent:
    return NewEvent(
        source="wh-github",
        event="push",
        provider_id=provider_id,
        data_json=data_json,
        workflow=workflow,
    )


@workflow(name="wh.keyed", concurrency_key=lambda event: str(event["data"]["customer"]))
def keyed(ctx: Any, event: dict[str, Any]) -> None:
    return None


def change_page(receipt: WebhookReceipt) -> str:
    return reverse("admin:pikku_django_webhookreceipt_change", args=[receipt.pk])


@on_databases(*VENDORS)
def test_an_event_python_cannot_read_is_set_aside_and_the_next_one_starts(
    vendor: str, settings: Any, admin_client: Client
) -> None:
    alias = on_vendor(vendor, settings)
    # Stored as an older release stored a body it did not read: the database takes it.
    assert store_event(alias, event("big", f'{{"ref": "main", "n": {BIG}}}'), notify=False)
    assert store_event(alias, event("good", '{"ref": "main"}'), notify=False)
    engine = get_engine()
    assert start_waiting_runs(engine) == 2
    run = WorkflowRun.objects.using(alias).get()
    assert run.idempotency_key == "webhook:wh-github:push:good"
    bad = WebhookReceipt.objects.using(alias).get(provider_id="big")
    assert bad.run_id is None
    assert not bad.waiting
    assert bad.set_aside.startswith("its input cannot be read back: ")
    assert "4300 digits" in bad.set_aside
    assert BIG in bad.input.text  # an UnreadableJSON: the event is kept as it was stored
    assert not waiting_receipts(engine).exists()
    assert start_waiting_runs(engine) == 0

    listing = admin_client.get(CHANGELIST)
    assert listing.status_code == 200
    assert "set aside: its input cannot be read back" in listing.content.decode()
    assert admin_client.get(CHANGELIST, {"state": "set_aside"}).status_code == 200
    page = admin_client.get(change_page(bad))
    assert page.status_code == 200
    body = page.content.decode()
    assert "Python cannot read this input back" in body
    assert "9" * 200 in body  # its stored text, shown as it is
    good = WebhookReceipt.objects.using(alias).get(provider_id="good")
    kept = reverse("admin:pikku_django_webhookreceipt_delete", args=[good.pk])
    assert admin_client.post(kept, {"post": "yes"}).status_code == 403
    delete = reverse("admin:pikku_django_webhookreceipt_delete", args=[bad.pk])
    assert admin_client.get(delete).status_code == 200
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert list(WebhookReceipt.objects.using(alias).values_list("provider_id", flat=True)) == [
        "good"
    ]


@on_databases(*VENDORS)
def test_an_event_whose_run_cannot_be_created_is_set_aside(vendor: str, settings: Any) -> None:
    alias = on_vendor(vendor, settings)
    assert store_event(alias, event("k-1", '{"customer": 1}', "wh.keyed"), notify=False)
    assert store_event(alias, event("k-2", '{"no": "customer"}', "wh.keyed"), notify=False)
    assert store_event(alias, event("k-3", '{"customer": 3}', "wh.keyed"), notify=False)
    assert start_waiting_runs(get_engine()) == 3
    started = WorkflowRun.objects.using(alias).values_list("idempotency_key", flat=True)
    assert sorted(started) == ["webhook:wh-github:push:k-1", "webhook:wh-github:push:k-3"]
    aside = WebhookReceipt.objects.using(alias).get(provider_id="k-2")
    assert aside.set_aside.startswith("its run could not be created: ")
    assert "customer" in aside.set_aside
    assert aside.input["data"] == {"no": "customer"}  # kept, for a look and a fix


@on_databases(*VENDORS)
def test_the_admin_action_deletes_only_receipts_set_aside(
    vendor: str, settings: Any, admin_client: Client
) -> None:
    alias = on_vendor(vendor, settings)
    assert store_event(alias, event("big", f"[{BIG}]"), notify=False)
    assert store_event(alias, event("waits", '{"ref": "main"}'), notify=False)
    WebhookReceipt.objects.using(alias).filter(provider_id="big").update(set_aside="why")
    ids = [str(pk) for pk in WebhookReceipt.objects.using(alias).values_list("pk", flat=True)]
    answer = admin_client.post(
        CHANGELIST, {"action": "delete_set_aside", "index": "0", "_selected_action": ids}
    )
    assert answer.status_code == 302
    left = WebhookReceipt.objects.using(alias).values_list("provider_id", flat=True)
    assert list(left) == ["waits"]


@on_databases(*VENDORS)
def test_pruning_removes_a_receipt_set_aside_and_keeps_one_waiting(
    vendor: str, settings: Any
) -> None:
    alias = on_vendor(vendor, settings)
    assert store_event(alias, event("big", f"[{BIG}]"), notify=False)
    assert start_waiting_runs(get_engine()) == 1
    assert store_event(alias, event("waits", json.dumps({"ref": "main"})), notify=False)
    old = timezone.now() - timedelta(days=3)
    WebhookReceipt.objects.using(alias).update(received_at=old)
    call_command("pikku_prune", "--older-than", "1d", "--database", alias, stdout=io.StringIO())
    left = WebhookReceipt.objects.using(alias).values_list("provider_id", flat=True)
    assert list(left) == ["waits"]
