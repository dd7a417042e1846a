"""Replays of signed webhook requests, on every database.

GitHub, Shopify and SendGrid without a window sign neither their delivery id nor a
timestamp checked against one: a captured request can be sent again with any
delivery id. Each signed body is accepted once per source, by its digest, which
outlives the receipts pikku_prune deletes. Schemes with a window keep to it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from pikku_django.models import TriggerSource, WebhookDigest, WebhookReceipt, WorkflowRun
from pikku_django.testing.webhooks import (
    GitHubSigner,
    SendGridSigner,
    ShopifySigner,
    StripeSigner,
)
from pikku_django.webhooks import (
    WebhookEvent,
    WebhookSource,
    credential_name,
    register_source,
    set_credential,
    start_workflow_on,
)
from pikku_django.webhooks.digests import accepted_once
from pikku_django.webhooks.dispatch import new_events, store_new_event
from pikku_django.webhooks.lifecycle import sync
from pikku_django.webhooks.presets import (
    Discord,
    GitHub,
    SendGrid,
    Shopify,
    Slack,
    StandardWebhooks,
    Stripe,
)
from pikku_django.webhooks.verify import HMAC, Function, PublicKey, ReplayGuard, Token
from pikku_django.workflows import get_engine, start_waiting_runs, workflow
from pikku_django.workflows.api import reset_engine
from tests import webhook_defs
from tests.conftest import database_alias, on_databases
from tests.test_webhook_store import at_once

VENDORS = ("sqlite", "postgres", "mariadb")
GITHUB = GitHubSigner("It's a Secret to Everybody", event="push")
GITHUB_URL = "/pikku/webhooks/wh-github/"
SHOPIFY = ShopifySigner("shpss_replays", topic="orders/create")
SHOPIFY_URL = "/pikku/webhooks/wh-replay-shopify/"
STRIPE = StripeSigner("whsec_replays")
STRIPE_URL = "/pikku/webhooks/wh-replay-stripe/"
PUSH = json.dumps({"ref": "main", "after": "5e1f"}).encode()


@workflow(name="wh.replay.note")
def note(ctx: Any, event: dict[str, Any]) -> str:
    return str(event["id"])


def receive_shopify(request: Any, ctx: Any) -> Any:
    return [ctx.body_event(request.headers["X-Shopify-Topic"], id=ctx.delivery_id)]


def receive_stripe(request: Any, ctx: Any) -> Any:
    event = ctx.json()
    return [WebhookEvent(event["type"], id=event["id"], data=event["data"])]


register_source(
    WebhookSource(
        name="wh-replay-shopify",
        verify=Shopify(),
        receive=receive_shopify,
        events={"orders/create": None},
    )
)


def receive_batch(request: Any, ctx: Any) -> Any:
    """Two events from one body, their ids from the (unsigned) delivery id."""
    return [
        WebhookEvent("orders/create", id=f"{ctx.delivery_id}-{n}", data=item)
        for n, item in enumerate(ctx.json())
    ]


register_source(
    WebhookSource(
        name="wh-replay-batch",
        verify=Shopify(),
        receive=receive_batch,
        events={"orders/create": None},
    )
)
register_source(
    WebhookSource(
        name="wh-replay-stripe",
        verify=Stripe(),
        receive=receive_stripe,
        events={"invoice.paid": None},
    )
)
start_workflow_on("wh-replay-shopify:orders/create", note)
start_workflow_on("wh-replay-stripe:invoice.paid", note)
start_workflow_on("wh-replay-batch:orders/create", note)
assert webhook_defs.github.name == "wh-github"  # the GitHub source these tests post to


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    reset_engine()
    yield
    reset_engine()


def on(vendor: str, settings: Any, **pikku: Any) -> str:
    """Runs, receipts and digests on ``vendor``'s database; the sources switched on."""
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, **pikku}
    reset_engine()
    sync()
    TriggerSource.objects.filter(
        name__in=["wh-github", "wh-replay-shopify", "wh-replay-stripe", "wh-replay-batch"]
    ).update(enabled=True)
    set_credential(credential_name("wh-github"), GITHUB.secret)
    set_credential(credential_name("wh-replay-shopify"), SHOPIFY.secret)
    set_credential(credential_name("wh-replay-batch"), SHOPIFY.secret)
    set_credential(credential_name("wh-replay-stripe"), STRIPE.secret)
    return alias


def test_each_preset_declares_what_refuses_its_replays() -> None:
    digest, window, none = ReplayGuard.DIGEST, ReplayGuard.WINDOW, ReplayGuard.NONE
    guards = {
        "GitHub": (GitHub(), digest),
        "Shopify": (Shopify(), digest),
        "SendGrid": (SendGrid(), digest),
        "SendGrid(tolerance=300)": (SendGrid(tolerance=300), window),
        "Stripe": (Stripe(), window),
        "Stripe(tolerance=None)": (Stripe(tolerance=None), digest),
        "Slack": (Slack(), window),
        "Discord": (Discord(), window),
        "StandardWebhooks": (StandardWebhooks(), window),
        "StandardWebhooks(tolerance=None)": (StandardWebhooks(tolerance=None), digest),
        "HMAC": (HMAC("X-Sig", delivery_id_header="X-Id"), digest),
        "PublicKey": (PublicKey("X-Sig", timestamp_header="X-Ts"), digest),
        "PublicKey(tolerance=60)": (
            PublicKey("X-Sig", timestamp_header="X-Ts", tolerance=60),
            window,
        ),
        "Token": (Token("X-Token"), none),
        "Function": (Function(lambda request, secret: True), none),
    }
    assert {name: v.replay_guard for name, (v, _) in guards.items()} == {
        name: guard for name, (_, guard) in guards.items()
    }


def test_sendgrid_without_a_window_gives_the_digest_of_its_signed_timestamp_and_body() -> None:
    signer = SendGridSigner()
    now = int(time.time())
    headers = signer.headers(PUSH, timestamp=now)
    verified = SendGrid().verify(headers, PUSH, [signer.secret])
    later = SendGrid().verify(signer.headers(PUSH, timestamp=now + 1), PUSH, [signer.secret])
    assert verified.replay_digest is not None
    assert later.replay_digest not in (None, verified.replay_digest)
    assert SendGrid(tolerance=300).verify(headers, PUSH, [signer.secret]).replay_digest is None


@on_databases(*VENDORS)
def test_a_replayed_github_push_with_fresh_delivery_ids_starts_one_run(
    vendor: str, settings: Any, client: Client
) -> None:
    alias = on(vendor, settings)
    answers = [
        GITHUB.post(client, GITHUB_URL, PUSH, delivery_id=f"replay-{n}").json() for n in range(8)
    ]
    assert answers == [{"received": 1}] + [{"received": 0}] * 7
    assert start_waiting_runs(get_engine()) == 1
    assert WorkflowRun.objects.using(alias).count() == 1
    # The delivery id is still the receipt's, for display.
    assert WebhookReceipt.objects.using(alias).get().provider_id == "replay-0"
    other = json.dumps({"ref": "main", "after": "77aa"}).encode()
    assert GITHUB.post(client, GITHUB_URL, other).json() == {"received": 1}


@on_databases(*VENDORS)
def test_a_replayed_shopify_order_with_fresh_webhook_ids_starts_one_run(
    vendor: str, settings: Any, client: Client
) -> None:
    alias = on(vendor, settings)
    order = json.dumps({"id": 820982911946154508, "total_price": "9.00"}).encode()
    answers = [
        SHOPIFY.post(client, SHOPIFY_URL, order, delivery_id=f"wh-{n}").json() for n in range(4)
    ]
    assert answers == [{"received": 1}, {"received": 0}, {"received": 0}, {"received": 0}]
    assert start_waiting_runs(get_engine()) == 1
    assert WorkflowRun.objects.using(alias).get().input["id"] == "wh-0"


@on_databases(*VENDORS)
def test_a_replayed_body_of_several_events_stores_none_of_them_again(
    vendor: str, settings: Any, client: Client
) -> None:
    alias = on(vendor, settings)
    orders = json.dumps([{"id": 1}, {"id": 2}]).encode()
    url = "/pikku/webhooks/wh-replay-batch/"
    assert SHOPIFY.post(client, url, orders, delivery_id="b-1").json() == {"received": 2}
    assert SHOPIFY.post(client, url, orders, delivery_id="b-2").json() == {"received": 0}
    assert SHOPIFY.post(client, url, orders, delivery_id="b-1").json() == {"received": 0}
    ids = WebhookReceipt.objects.using(alias).values_list("provider_id", flat=True)
    assert sorted(ids) == ["b-1-0", "b-1-1"]
    assert WebhookDigest.objects.using(alias).get().source == "wh-replay-batch"


@on_databases(*VENDORS)
def test_replays_stored_at_once_store_one_event(vendor: str, settings: Any) -> None:
    alias = on(vendor, settings)
    digest = hashlib.sha256(PUSH).hexdigest()

    def replay(delivery: str) -> str:
        [event] = new_events(
            webhook_defs.github,
            [WebhookEvent("push", data={"ref": "main"})],
            delivery_id=delivery,
            body=PUSH,
        )
        return store_new_event(event, digest=digest)

    count = itertools.count()
    results = at_once(alias, 4, lambda: replay(f"race-{next(count)}"))
    assert sorted(results) == ["redelivery", "redelivery", "redelivery", "stored"]
    assert WebhookReceipt.objects.using(alias).count() == 1
    assert WebhookDigest.objects.using(alias).count() == 1


@on_databases(*VENDORS)
def test_an_exact_replay_after_pruning_starts_no_run(
    vendor: str, settings: Any, client: Client
) -> None:
    alias = on(vendor, settings)
    headers = GITHUB.headers(PUSH, delivery_id="pruned-1")

    def deliver() -> Any:
        return client.post(GITHUB_URL, PUSH, content_type="application/json", headers=headers)

    assert deliver().json() == {"received": 1}
    get_engine().run_until_idle()
    old = timezone.now() - timedelta(days=40)
    WorkflowRun.objects.using(alias).update(updated_at=old)
    WebhookReceipt.objects.using(alias).update(received_at=old)
    prune = ["pikku_prune", "--older-than", "30d", "--database", alias]
    call_command(*prune, stdout=StringIO())
    assert not WebhookReceipt.objects.using(alias).exists()
    assert not WorkflowRun.objects.using(alias).exists()

    assert deliver().json() == {"received": 0}
    assert not WebhookReceipt.objects.using(alias).exists()
    assert start_waiting_runs(get_engine()) == 0
    assert not WorkflowRun.objects.using(alias).exists()

    # The digest goes once older than its own retention; then the bytes are new again.
    WebhookDigest.objects.using(alias).update(received_at=old)
    out = StringIO()
    call_command(*prune, "--dry-run", stdout=out)
    assert "Would delete 0 webhook digests" in out.getvalue()
    settings.PIKKU = {**settings.PIKKU, "WEBHOOK_DIGEST_RETENTION": "35d"}
    out = StringIO()
    call_command(*prune, stdout=out)
    assert "Deleted 1 webhook digests past WEBHOOK_DIGEST_RETENTION" in out.getvalue()
    assert deliver().json() == {"received": 1}


@on_databases(*VENDORS)
def test_a_stripe_delivery_keeps_to_its_window_and_its_event_id(
    vendor: str, settings: Any, client: Client
) -> None:
    alias = on(vendor, settings)
    invoice = {"id": "evt_r1", "type": "invoice.paid", "data": {"customer": "cus_1"}}
    now = int(time.time())
    assert STRIPE.post(client, STRIPE_URL, invoice, timestamp=now).json() == {"received": 1}
    # Stripe signs a timestamp: its window refuses replays, and nothing else is kept.
    assert not WebhookDigest.objects.using(alias).exists()
    redelivered = STRIPE.post(client, STRIPE_URL, invoice, timestamp=now - 60)
    assert redelivered.json() == {"received": 0}  # the same event id
    stale = STRIPE.post(client, STRIPE_URL, invoice, timestamp=now - 3600)
    assert stale.status_code == 401
    second = {**invoice, "id": "evt_r2"}
    assert STRIPE.post(client, STRIPE_URL, second, timestamp=now).json() == {"received": 1}
    assert start_waiting_runs(get_engine()) == 2
    assert not WebhookDigest.objects.using(alias).exists()


@on_databases(*VENDORS)
def test_a_claim_is_taken_back_with_a_store_that_failed(vendor: str, settings: Any) -> None:
    alias = on(vendor, settings)
    digest = "ab" * 32
    with pytest.raises(RuntimeError), accepted_once("wh-github", digest) as new:
        assert new is True
        raise RuntimeError("the store failed")
    assert not WebhookDigest.objects.using(alias).exists()
    with accepted_once("wh-github", digest) as new:
        assert new is True
    with accepted_once("wh-github", digest) as new:
        assert new is False
    with accepted_once("wh-replay-shopify", digest) as new:
        assert new is True  # per source
    assert WebhookDigest.objects.using(alias).count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", ["soon", -5, 0])
def test_a_retention_that_is_not_a_duration_is_refused(value: Any, settings: Any) -> None:
    settings.PIKKU = {"WEBHOOK_DIGEST_RETENTION": value}
    with pytest.raises(CommandError, match="WEBHOOK_DIGEST_RETENTION"):
        call_command("pikku_prune", "--older-than", "30d", stdout=StringIO())
    from pikku_django.checks import check_workflow_settings

    assert [m.id for m in check_workflow_settings()] == ["pikku_django.E020"]
