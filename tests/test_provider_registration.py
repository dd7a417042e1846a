"""The GitHub and Stripe presets register their sources through the providers' APIs
(local fakes on 127.0.0.1), when enabled with a base URL, and remove them when disabled."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client

from pikku_django.models import CredentialValue, TriggerSource
from pikku_django.testing.webhooks import StripeSigner
from pikku_django.webhooks import (
    ProviderContext,
    WebhookEvent,
    WebhookSource,
    credential_values,
    on_webhook,
    register_source,
    set_credential,
)
from pikku_django.webhooks.lifecycle import disable, enable, reconcile
from pikku_django.webhooks.presets import GitHub, Stripe
from pikku_django.webhooks.providers import GitHubRegistration, ProviderError
from pikku_django.webhooks.sources import unregister_source
from tests import provider_api_fake
from tests.provider_api_fake import GITHUB_TOKEN, STRIPE_KEY, ProviderAPI

pytestmark = pytest.mark.django_db

BASE = "https://app.example/pikku/"


def receive(request, ctx):  # type: ignore[no-untyped-def]
    data = ctx.json()
    return [WebhookEvent(data.get("type", "push"), id=data.get("id"), data=data)]


def paid(event: dict[str, object]) -> None:
    """The handler of stripe-reg:invoice.paid (events nobody handles are dropped)."""


@pytest.fixture(autouse=True)
def not_in_development(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIKKU_DEV_WEBHOOK_URL", raising=False)


@pytest.fixture
def api() -> Iterator[ProviderAPI]:
    yield from provider_api_fake.serve()


@pytest.fixture
def declared(api: ProviderAPI) -> Iterator[dict[str, WebhookSource]]:
    """Sources registering with the fakes: a repository's and an organisation's GitHub
    hook, and a Stripe endpoint; with the token and the secret key stored."""
    found = {
        "gh-repo": WebhookSource(
            name="gh-repo",
            verify=GitHub(repository="acme/shop", token_credential="githubToken", api_url=api.url),
            receive=receive,
            events={"push": None, "pull_request": None},
        ),
        "gh-org": WebhookSource(
            name="gh-org",
            verify=GitHub(organization="acme", token_credential="githubToken", api_url=api.url),
            receive=receive,
            events={"push": None},
        ),
        "stripe-reg": WebhookSource(
            name="stripe-reg",
            verify=Stripe(secret_key_credential="stripeSecretKey", api_url=api.url),
            receive=receive,
            events={"invoice.paid": None, "customer.created": None},
        ),
    }
    try:
        for source in found.values():
            register_source(source)
        set_credential("githubToken", GITHUB_TOKEN)
        set_credential("stripeSecretKey", STRIPE_KEY)
        yield found
    finally:
        for name in found:
            unregister_source(name)


def row(name: str) -> TriggerSource:
    return TriggerSource.objects.get(name=name)


def github_signed(client: Client, url: str, secret: str, body: bytes) -> int:
    mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return client.post(
        url,
        body,
        content_type="application/json",
        headers={"X-Hub-Signature-256": f"sha256={mac}", "X-GitHub-Delivery": "d-1"},
    ).status_code


# -- GitHub ---------------------------------------------------------------------------


def test_enabling_registers_a_repository_hook_signed_with_the_sources_secret(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    outcome = enable("gh-repo", base_url=BASE)
    assert (outcome.status, outcome.detail) == ("ok", "registered (missing)")
    post = next(r for r in api.requests if r.method == "POST")
    assert post.path == "/repos/acme/shop/hooks"
    assert post.headers["authorization"] == f"Bearer {GITHUB_TOKEN}"
    assert post.headers["accept"] == "application/vnd.github+json"
    sent = post.json()
    assert sent["name"] == "web"
    assert sent["events"] == ["push", "pull_request"]
    assert sent["config"]["url"] == BASE + "webhooks/gh-repo/"
    assert sent["config"]["content_type"] == "json"
    # The secret GitHub signs with is the source's credential, stored encrypted.
    [secret] = credential_values("ghRepoWebhookSecret")
    assert sent["config"]["secret"] == secret
    assert len(secret) == 64
    [hook] = api.github_hooks["repos/acme/shop"].values()
    assert row("gh-repo").state == {"id": hook["id"], "hooks": "/repos/acme/shop/hooks"}
    assert github_signed(Client(), "/pikku/webhooks/gh-repo/", secret, b'{"a": 1}') == 200
    assert github_signed(Client(), "/pikku/webhooks/gh-repo/", "other", b'{"a": 2}') == 401


def test_an_organisation_hook_keeps_a_secret_already_set(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    set_credential("ghOrgWebhookSecret", "an-org-secret-set-by-hand")
    assert enable("gh-org", base_url=BASE).status == "ok"
    [post] = [r for r in api.requests if r.method == "POST"]
    assert post.path == "/orgs/acme/hooks"
    assert post.json()["config"]["secret"] == "an-org-secret-set-by-hand"
    assert post.json()["events"] == ["push"]
    assert credential_values("ghOrgWebhookSecret") == ["an-org-secret-set-by-hand"]


def test_check_finds_the_hook_or_reports_it_missing(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    enable("gh-repo", base_url=BASE)
    [hook_id] = api.github_hooks["repos/acme/shop"]
    assert [o.detail for o in reconcile()] == ["already registered"]
    assert api.calls()[-1] == ("GET", f"/repos/acme/shop/hooks/{hook_id}")
    # Removed at GitHub by hand: the check finds it missing, and setup registers it again.
    api.github_hooks["repos/acme/shop"].clear()
    assert [o.detail for o in reconcile()] == ["registered (missing)"]
    assert len(api.github_hooks["repos/acme/shop"]) == 1


def test_a_hook_already_at_the_url_is_updated_not_duplicated(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    api.github_hooks["repos/acme/shop"] = {
        7: {
            "id": 7,
            "name": "web",
            "active": True,
            "events": ["push"],
            "config": {"url": BASE + "webhooks/gh-repo/", "content_type": "form"},
            "secret": "old",
        }
    }
    assert enable("gh-repo", base_url=BASE).detail == "registered (drifted)"
    assert ("PATCH", "/repos/acme/shop/hooks/7") in api.calls()
    [hook] = api.github_hooks["repos/acme/shop"].values()
    assert hook["config"]["content_type"] == "json"
    assert hook["events"] == ["push", "pull_request"]
    assert hook["secret"] == credential_values("ghRepoWebhookSecret")[0]
    assert row("gh-repo").state["id"] == 7


def test_disabling_deletes_the_hook(api: ProviderAPI, declared: dict[str, WebhookSource]) -> None:
    enable("gh-repo", base_url=BASE)
    [hook_id] = api.github_hooks["repos/acme/shop"]
    outcome = disable("gh-repo")
    assert (outcome.status, outcome.detail) == ("disabled", "removed from the provider")
    assert api.calls()[-1] == ("DELETE", f"/repos/acme/shop/hooks/{hook_id}")
    assert api.github_hooks["repos/acme/shop"] == {}
    assert row("gh-repo").state is None


def test_the_command_registers_and_tears_down(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    out = StringIO()
    call_command("pikku_sources", "enable", "gh-org", "--base-url", BASE, stdout=out)
    assert out.getvalue() == "gh-org: enabled; provider step: ok\n  registered (missing)\n"
    [hook] = api.github_hooks["orgs/acme"].values()
    assert hook["config"]["url"] == BASE + "webhooks/gh-org/"
    call_command("pikku_sources", "disable", "gh-org", stdout=StringIO())
    assert api.github_hooks["orgs/acme"] == {}


def test_a_refused_request_is_an_error_without_the_token(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    set_credential("githubToken", "ghp_wrong-token-000000000000", replace=True)
    outcome = enable("gh-repo", base_url=BASE)
    assert outcome.status == "error"
    assert "GitHub answered 401 to GET /repos/acme/shop/hooks: Bad credentials" in outcome.detail
    assert "ghp_wrong" not in row("gh-repo").detail
    api.fail_with["GET"] = 502
    set_credential("githubToken", GITHUB_TOKEN, replace=True)
    assert "GitHub answered 502" in enable("gh-repo", base_url=BASE).detail


def test_a_token_credential_without_a_value_is_named(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    CredentialValue.objects.filter(credential="githubToken").delete()
    detail = enable("gh-repo", base_url=BASE).detail
    assert "the credential 'githubToken' (the GitHub token) has no value" in detail
    assert api.requests == []


def test_declarations_are_checked(api: ProviderAPI) -> None:
    with pytest.raises(ValueError, match="needs token_credential"):
        GitHub(repository="acme/shop")
    with pytest.raises(ValueError, match="owner/repo"):
        GitHub(repository="acme", token_credential="t")
    with pytest.raises(ValueError, match="repository='owner/repo' or organization="):
        GitHub(repository="a/b", organization="a", token_credential="t")
    with pytest.raises(ImproperlyConfigured, match="declare no check, setup or teardown"):
        WebhookSource(
            name="both",
            verify=GitHub(repository="a/b", token_credential="t"),
            receive=receive,
            check=lambda ctx: "ok",
        )
    assert GitHub().registration is None  # as before: the source registers by hand
    assert Stripe().registration is None
    plain = WebhookSource(name="plain", verify=GitHub(), receive=receive)
    assert (plain.check, plain.setup, plain.teardown) == (None, None, None)
    manual = register_source(
        WebhookSource(name="stripe-manual", verify=Stripe(), receive=receive, events={"x": None})
    )
    try:
        assert enable("stripe-manual", base_url=BASE).status == "manual"
    finally:
        unregister_source(manual.name)
    assert api.requests == []


def test_github_enterprise_takes_its_api_url() -> None:
    registration = GitHubRegistration(
        organization="acme", token_credential="t", api_url="https://ghe.example/api/v3/"
    )
    assert (registration.api_url, registration.hooks_path) == (
        "https://ghe.example/api/v3",
        "/orgs/acme/hooks",
    )


# -- Stripe ---------------------------------------------------------------------------


def test_stripe_registration_stores_the_signing_secret_it_returns(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    outcome = enable("stripe-reg", base_url=BASE, label_prefix="prod")
    assert (outcome.status, outcome.detail) == ("ok", "registered (missing)")
    [post] = [r for r in api.requests if r.method == "POST"]
    assert post.path == "/v1/webhook_endpoints"
    assert post.headers["authorization"] == f"Bearer {STRIPE_KEY}"
    assert post.headers["content-type"] == "application/x-www-form-urlencoded"
    form = post.form()
    assert form["url"] == [BASE + "webhooks/stripe-reg/"]
    assert form["enabled_events[]"] == ["invoice.paid", "customer.created"]
    assert form["description"] == ["prod:stripe-reg"]
    [endpoint] = api.stripe_endpoints.values()
    assert credential_values("stripeRegWebhookSecret") == [endpoint["secret"]]
    stored = CredentialValue.objects.get(credential="stripeRegWebhookSecret")
    assert endpoint["secret"] not in stored.ciphertext
    assert row("stripe-reg").state == {"id": endpoint["id"]}

    # A delivery Stripe signs with that secret verifies; another secret does not.
    on_webhook("stripe-reg:invoice.paid")(paid)
    event = {"id": "evt_1", "type": "invoice.paid", "data": {}}
    client = Client()
    url = "/pikku/webhooks/stripe-reg/"
    assert StripeSigner(endpoint["secret"]).post(client, url, event).json() == {"received": 1}
    assert StripeSigner().post(client, url, event).status_code == 401


def test_stripe_check_and_teardown(api: ProviderAPI, declared: dict[str, WebhookSource]) -> None:
    enable("stripe-reg", base_url=BASE)
    [endpoint_id] = api.stripe_endpoints
    assert [o.detail for o in reconcile()] == ["already registered"]
    assert api.calls()[-1] == ("GET", f"/v1/webhook_endpoints/{endpoint_id}")
    outcome = disable("stripe-reg")
    assert (outcome.status, outcome.detail) == ("disabled", "removed from the provider")
    assert api.calls()[-1] == ("DELETE", f"/v1/webhook_endpoints/{endpoint_id}")
    assert api.stripe_endpoints == {}


def test_a_drifted_stripe_endpoint_is_replaced_new_first(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    enable("stripe-reg", base_url=BASE)
    [old] = api.stripe_endpoints
    old_secret = api.stripe_endpoints[old]["secret"]
    api.stripe_endpoints[old]["enabled_events"] = ["invoice.paid"]
    assert [o.detail for o in reconcile()] == ["registered (drifted)"]
    [new] = api.stripe_endpoints
    assert new != old
    methods = [m for m, _ in api.calls()]
    assert methods[-2:] == ["POST", "DELETE"]  # deliveries never stop in between
    assert set(credential_values("stripeRegWebhookSecret")) == {
        old_secret,
        api.stripe_endpoints[new]["secret"],
    }


def test_a_refused_stripe_key_never_shows_in_the_error(
    api: ProviderAPI, declared: dict[str, WebhookSource]
) -> None:
    wrong = "sk_test_wrong_key_1234567890"
    set_credential("stripeSecretKey", wrong, replace=True)
    outcome = enable("stripe-reg", base_url=BASE)
    assert outcome.status == "error"
    assert "Stripe answered 401 to POST /v1/webhook_endpoints" in outcome.detail
    assert "Invalid API Key provided: ***" in outcome.detail
    assert wrong not in row("stripe-reg").detail
    assert credential_values("stripeRegWebhookSecret") == []


def test_an_unreachable_provider_is_a_clear_error(declared: dict[str, WebhookSource]) -> None:
    registration = declared["stripe-reg"].verify.registration
    registration.api_url = "http://127.0.0.1:9"  # nothing listens on the discard port
    ctx = ProviderContext(declared["stripe-reg"], BASE, "x", ["invoice.paid"], {"id": "we_1"})
    with pytest.raises(ProviderError, match="Stripe could not be reached for GET") as caught:
        registration.check(ctx)
    assert STRIPE_KEY not in str(caught.value)
    assert caught.value.status is None
