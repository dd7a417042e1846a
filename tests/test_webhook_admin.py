"""The trigger source, credential value and webhook receipt admins."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client, RequestFactory
from django.urls import reverse

from pikku_django.admin.webhooks import suggested_base_url
from pikku_django.models import CredentialValue, TriggerSource, WebhookReceipt
from pikku_django.webhooks import credential_values, set_credential
from pikku_django.webhooks.credentials import decrypt
from pikku_django.webhooks.lifecycle import enable, sync
from tests import webhook_provider_defs as defs
from tests.factories import WorkflowRunFactory
from tests.webhook_provider_defs import FakeProvider

pytestmark = pytest.mark.django_db(transaction=True)

SOURCES = reverse("admin:pikku_django_triggersource_changelist")
CREDENTIALS = reverse("admin:pikku_django_credentialvalue_changelist")
ADD_CREDENTIAL = reverse("admin:pikku_django_credentialvalue_add")
HOOK_PATH = "/pikku/webhooks/prov-hooks/"
SITE = "http://testserver/pikku/"
CREDENTIAL = "provHooksWebhookSecret"


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    yield from defs.running_provider()


@pytest.fixture(autouse=True)
def not_in_development(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIKKU_DEV_WEBHOOK_URL", raising=False)


@pytest.fixture(autouse=True)
def declared() -> None:
    sync()


def staff(django_user_model: Any, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(
        f"staff-{uuid.uuid4().hex[:8]}", password="pw", is_staff=True
    )
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, action: str, *names: str, **extra: str) -> Any:
    response = client.post(
        SOURCES, {"action": action, "index": "0", "_selected_action": list(names), **extra}
    )
    client.get(SOURCES)  # shows (and so clears) the messages, as a browser would
    return response


def confirm_base_url(client: Client, base_url: str, *names: str) -> Any:
    """What the "which base URL" page posts (no ``index``, like Django's confirmations)."""
    response = client.post(
        SOURCES,
        {"action": "enable_sources", "_selected_action": list(names), "pikku_base_url": base_url},
    )
    client.get(SOURCES)
    return response


def said(response: Any) -> list[tuple[str, str]]:
    """The messages the request behind ``response`` queued: (level tag, text)."""
    return [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]


def signed_post(client: Client, secret: str, body: dict[str, Any]) -> Any:
    raw = json.dumps(body).encode()
    signature = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    return client.post(
        HOOK_PATH,
        raw,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=signature,
        HTTP_X_GITHUB_DELIVERY=f"d-{uuid.uuid4().hex[:6]}",
    )


def source(name: str) -> TriggerSource:
    return TriggerSource.objects.get(name=name)


# -- enable and disable ---------------------------------------------------------------


def test_enable_and_disable_in_the_admin_take_effect_on_the_next_request(
    admin_client: Client, provider: FakeProvider
) -> None:
    client = Client()  # the provider's side
    paid = {"type": "order.paid", "id": "o-1", "amount": 5}
    assert signed_post(client, "unknown-yet", paid).status_code == 404

    # No address is recorded: the admin says so and offers this site's own.
    offered = act(admin_client, "enable_sources", "prov-hooks")
    assert offered.status_code == 200
    assert said(offered) == [
        (
            "error",
            "prov-hooks: Source 'prov-hooks' has no address to register: pass a base URL "
            "(the address this app is served at) or set PIKKU_DEV_WEBHOOK_URL in development",
        )
    ]
    page = offered.content.decode()
    assert f'value="{SITE}"' in page
    assert 'name="pikku_base_url"' in page
    assert source("prov-hooks").enabled is False
    assert provider.requests == []

    enabled = confirm_base_url(admin_client, SITE, "prov-hooks")
    assert enabled.status_code == 302
    assert said(enabled) == [
        ("success", "prov-hooks: enabled; provider step: ok (registered (missing))")
    ]
    [hook] = provider.registrations.values()
    assert hook["url"] == "http://testserver/pikku/webhooks/prov-hooks/"
    assert source("prov-hooks").enabled is True

    response = signed_post(client, hook["secret"], paid)
    assert response.status_code == 200, response.content
    assert response.json() == {"received": 1}

    disabled = act(admin_client, "disable_sources", "prov-hooks")
    assert disabled.status_code == 302
    assert said(disabled) == [
        ("success", "prov-hooks: disabled; provider step: disabled (removed from the provider)")
    ]
    assert provider.registrations == {}
    assert signed_post(client, hook["secret"], paid).status_code == 404


def test_the_view_reads_the_switch_on_every_request(provider: FakeProvider) -> None:
    client = Client()
    enable("prov-hooks", base_url=SITE)
    [hook] = provider.registrations.values()
    refunded = {"type": "order.refunded", "id": "r-1"}
    assert signed_post(client, hook["secret"], refunded).status_code == 200
    TriggerSource.objects.filter(name="prov-hooks").update(enabled=False)
    assert signed_post(client, hook["secret"], refunded).status_code == 404
    TriggerSource.objects.filter(name="prov-hooks").update(enabled=True)
    assert signed_post(client, hook["secret"], refunded).status_code == 200


def test_enable_at_the_recorded_address_needs_no_question(
    admin_client: Client, provider: FakeProvider
) -> None:
    TriggerSource.objects.filter(name="prov-hooks").update(base_url="https://app.example/")
    response = act(admin_client, "enable_sources", "prov-hooks")
    assert response.status_code == 302
    assert said(response) == [
        ("success", "prov-hooks: enabled; provider step: ok (registered (missing))")
    ]
    [hook] = provider.registrations.values()
    assert hook["url"] == "https://app.example/webhooks/prov-hooks/"
    assert credential_values(CREDENTIAL) == [hook["secret"]]


@pytest.mark.parametrize("base_url", ["javascript:alert(1)", "ftp://files.example/", "http://"])
def test_a_base_url_that_is_not_a_url_is_refused_and_asked_again(
    admin_client: Client, provider: FakeProvider, base_url: str
) -> None:
    response = confirm_base_url(admin_client, base_url, "prov-hooks")
    assert response.status_code == 200
    assert said(response) == [
        ("error", f"{base_url!r} is not an http(s) URL: nothing was enabled.")
    ]
    assert 'name="pikku_base_url"' in response.content.decode()
    assert source("prov-hooks").enabled is False
    assert provider.requests == []


def test_each_sources_provider_step_is_reported_at_its_level(
    admin_client: Client, provider: FakeProvider
) -> None:
    TriggerSource.objects.filter(name__in=["prov-manual", "prov-broken"]).update(
        base_url="https://app.example/"
    )
    TriggerSource.objects.create(name="prov-gone", declared=False)
    response = act(admin_client, "enable_sources", "prov-manual", "prov-broken", "prov-gone")
    assert response.status_code == 302  # no question: the undeclared one cannot be enabled
    messages = said(response)
    assert [level for level, _ in messages] == ["error", "error", "warning"]
    broken, gone, manual = messages
    assert broken[1].startswith("prov-broken: enabled; provider step: error (check failed: ")
    assert gone[1] == "prov-gone: No webhook source 'prov-gone' is declared"
    assert manual[1].startswith(
        "prov-manual: enabled; provider step: manual (register "
        "https://app.example/webhooks/prov-manual/ with the provider by hand"
    )
    assert source("prov-broken").status == "error"
    assert source("prov-gone").enabled is False


def test_a_failed_teardown_is_reported_as_an_error(
    admin_client: Client, provider: FakeProvider
) -> None:
    enable("prov-hooks", base_url=SITE)
    provider.fail_with["DELETE"] = 500
    response = act(admin_client, "disable_sources", "prov-hooks")
    [(level, text)] = said(response)
    assert level == "error"
    assert text.startswith("prov-hooks: disabled; provider step: error (teardown failed: ")
    assert source("prov-hooks").enabled is False
    assert source("prov-hooks").state is not None


def test_the_offered_base_url_is_where_pikku_urls_are_mounted(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["shop.example"]
    request = RequestFactory().get("/admin/", HTTP_HOST="shop.example")
    assert suggested_base_url(request, defs.hooks) == "http://shop.example/pikku/"
    assert suggested_base_url(request, None) == "http://shop.example/"


# -- who may switch -------------------------------------------------------------------


def test_without_the_change_permission_the_actions_are_hidden_and_refused(
    django_user_model: Any, provider: FakeProvider
) -> None:
    TriggerSource.objects.filter(name="prov-hooks").update(base_url="https://app.example/")
    viewer = staff(django_user_model, "view_triggersource")
    page = viewer.get(SOURCES)
    assert page.status_code == 200
    assert page.context["action_form"] is None  # no action is offered at all
    assert "Enable selected sources" not in page.content.decode()
    assert "prov-hooks" in page.content.decode()

    refused = act(viewer, "enable_sources", "prov-hooks")
    assert refused.status_code == 200  # the list again; no action ran
    assert source("prov-hooks").enabled is False
    assert provider.requests == []

    switcher = staff(django_user_model, "view_triggersource", "change_triggersource")
    choices = [
        name for name, _ in switcher.get(SOURCES).context["action_form"].fields["action"].choices
    ]
    assert {"enable_sources", "disable_sources"} <= set(choices)
    assert act(switcher, "enable_sources", "prov-hooks").status_code == 302
    assert source("prov-hooks").enabled is True


def test_a_source_cannot_be_added_edited_or_deleted_by_hand(admin_client: Client) -> None:
    TriggerSource.objects.filter(name="prov-hooks").update(state={"id": "hook-9"})
    change = reverse("admin:pikku_django_triggersource_change", args=["prov-hooks"])
    page = admin_client.get(change)
    assert page.status_code == 200
    body = page.content.decode()
    assert 'name="enabled"' not in body
    assert "hook-9" in body
    assert "order.paid, order.refunded" in body
    assert CREDENTIAL in body
    assert admin_client.post(change, {"enabled": "on"}).status_code == 403
    assert source("prov-hooks").enabled is False
    add = reverse("admin:pikku_django_triggersource_add")
    assert admin_client.get(add).status_code == 403
    delete = reverse("admin:pikku_django_triggersource_delete", args=["prov-hooks"])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403


def test_the_list_shows_name_switch_status_and_detail(
    admin_client: Client, provider: FakeProvider
) -> None:
    enable("prov-manual", base_url="https://app.example/")
    body = admin_client.get(SOURCES).content.decode()
    for text in ("prov-manual", "prov-hooks", "manual", "with the provider by hand"):
        assert text in body


# -- credential values ----------------------------------------------------------------


def test_the_add_form_stores_the_value_encrypted_and_never_shows_it_again(
    admin_client: Client,
) -> None:
    form = admin_client.get(ADD_CREDENTIAL).content.decode()
    assert 'type="password"' in form
    assert CREDENTIAL in form  # the declared credential names are offered

    value = "whsec-the-very-secret-value-1234"
    response = admin_client.post(ADD_CREDENTIAL, {"credential": CREDENTIAL, "value": value})
    assert response.status_code == 302, response.content
    stored = CredentialValue.objects.get(credential=CREDENTIAL)
    assert stored.ciphertext != value
    assert value not in stored.ciphertext
    assert decrypt(stored.ciphertext) == value
    assert (stored.hint, stored.active) == ("1234", True)
    assert credential_values(CREDENTIAL) == [value]

    change = reverse("admin:pikku_django_credentialvalue_change", args=[stored.pk])
    page = admin_client.get(change).content.decode()
    assert value not in page
    assert stored.ciphertext not in page
    assert "…1234" in page
    listing = admin_client.get(CREDENTIALS).content.decode()
    assert value not in listing
    assert "…1234" in listing
    history = admin_client.get(change + "history/").content.decode()
    assert value not in history


def test_a_refused_add_form_does_not_echo_the_value(admin_client: Client) -> None:
    value = "whsec-must-not-come-back-9876"
    response = admin_client.post(ADD_CREDENTIAL, {"credential": "", "value": value})
    assert response.status_code == 200
    assert value not in response.content.decode()
    assert not CredentialValue.objects.exists()


def test_adding_with_replace_retires_the_other_values(admin_client: Client) -> None:
    set_credential(CREDENTIAL, "old-value-0000-aaaa")
    response = admin_client.post(
        ADD_CREDENTIAL, {"credential": CREDENTIAL, "value": "new-value-1111-bbbb", "replace": "on"}
    )
    assert response.status_code == 302
    assert credential_values(CREDENTIAL) == ["new-value-1111-bbbb"]


def test_the_change_form_only_toggles_active(admin_client: Client) -> None:
    stored = set_credential(CREDENTIAL, "keep-this-value-5678")
    change = reverse("admin:pikku_django_credentialvalue_change", args=[stored.pk])
    response = admin_client.post(
        change, {"credential": "somethingElse", "ciphertext": "forged", "hint": "zzzz"}
    )  # "active" left out: unticked
    assert response.status_code == 302, response.content
    stored.refresh_from_db()
    assert (stored.credential, stored.hint, stored.active) == (CREDENTIAL, "5678", False)
    assert decrypt(stored.ciphertext) == "keep-this-value-5678"
    assert credential_values(CREDENTIAL) == []
    admin_client.post(change, {"active": "on"})
    assert credential_values(CREDENTIAL) == ["keep-this-value-5678"]


def test_the_retire_action(admin_client: Client) -> None:
    first = set_credential(CREDENTIAL, "first-value-aaaa")
    set_credential(CREDENTIAL, "second-value-bbbb")
    response = admin_client.post(
        CREDENTIALS,
        {"action": "retire_values", "index": "0", "_selected_action": [str(first.pk)]},
    )
    assert said(response) == [("success", "Retired 1 value.")]
    assert credential_values(CREDENTIAL) == ["second-value-bbbb"]


# -- webhook receipts -----------------------------------------------------------------


def test_receipts_are_a_read_only_list_linking_their_run(admin_client: Client) -> None:
    run = WorkflowRunFactory(
        input={"source": "prov-hooks", "event": "order.paid", "id": "o-77", "data": {"n": 1}}
    )
    receipt = WebhookReceipt.objects.create(
        source="prov-hooks", event="order.paid", provider_id="o-77", run=run
    )
    listing = admin_client.get(reverse("admin:pikku_django_webhookreceipt_changelist"))
    body = listing.content.decode()
    for text in ("prov-hooks", "order.paid", "o-77"):
        assert text in body
    assert reverse("admin:pikku_django_workflowrun_change", args=[run.pk]) in body
    change = reverse("admin:pikku_django_webhookreceipt_change", args=[receipt.pk])
    page = admin_client.get(change)
    assert page.status_code == 200
    assert "&quot;n&quot;: 1" in page.content.decode()  # the event's data, from its run
    assert admin_client.post(change, {"source": "forged"}).status_code == 403
    assert admin_client.get(reverse("admin:pikku_django_webhookreceipt_add")).status_code == 403
    delete = reverse("admin:pikku_django_webhookreceipt_delete", args=[receipt.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403


def test_a_receipt_whose_run_was_pruned_shows_the_run_id_unlinked(admin_client: Client) -> None:
    run = WorkflowRunFactory()
    receipt = WebhookReceipt.objects.create(
        source="prov-hooks", event="order.paid", provider_id="o-78", run=run
    )
    run_id = run.pk
    run.delete()
    listing = admin_client.get(reverse("admin:pikku_django_webhookreceipt_changelist"))
    assert listing.status_code == 200
    assert f"{run_id} (pruned)" in listing.content.decode()
    page = admin_client.get(reverse("admin:pikku_django_webhookreceipt_change", args=[receipt.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    assert f"{run_id} (pruned)" in body
    assert reverse("admin:pikku_django_workflowrun_change", args=[run_id]) not in body


def test_a_receipt_waiting_for_its_run_says_so_and_shows_its_data(admin_client: Client) -> None:
    receipt = WebhookReceipt.objects.create(
        source="prov-hooks",
        event="order.paid",
        provider_id="o-79",
        workflow="prov.paid",
        input={"source": "prov-hooks", "event": "order.paid", "id": "o-79", "data": {"n": 2}},
    )
    listing = admin_client.get(reverse("admin:pikku_django_webhookreceipt_changelist"))
    assert "waiting for a worker" in listing.content.decode()
    page = admin_client.get(reverse("admin:pikku_django_webhookreceipt_change", args=[receipt.pk]))
    body = page.content.decode()
    assert "waiting for a worker" in body
    assert "&quot;n&quot;: 2" in body  # the event's data, from the receipt itself
