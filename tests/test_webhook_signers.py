"""pikku_django.testing.webhooks: each signer's requests pass its preset's verifier."""

from __future__ import annotations

import functools
import time

import pytest
from django.test import Client

from pikku_django.testing import webhooks as signers
from pikku_django.webhooks import presets
from pikku_django.webhooks.verify import SignatureMismatchError, StaleRequestError

BODY = b'{"id":"evt_1","type":"invoice.paid","data":{"object":{"customer":"cus_1"}}}'

#: Each preset, and a signer for it (a factory: key pairs are made per test).
CASES = {
    "github": (presets.GitHub, lambda: signers.GitHubSigner(event="push")),
    "stripe": (presets.Stripe, lambda: signers.StripeSigner()),
    "slack": (presets.Slack, lambda: signers.SlackSigner()),
    "shopify": (presets.Shopify, lambda: signers.ShopifySigner(topic="orders/create")),
    "standard-hmac": (presets.StandardWebhooks, lambda: signers.StandardWebhooksSigner()),
    "standard-svix": (presets.StandardWebhooks, lambda: signers.StandardWebhooksSigner(svix=True)),
    "standard-ed25519": (
        functools.partial(presets.StandardWebhooks, key_type="asymmetric"),
        signers.StandardWebhooksSigner.ed25519,
    ),
    "discord": (presets.Discord, lambda: signers.DiscordSigner()),
    "sendgrid": (presets.SendGrid, lambda: signers.SendGridSigner()),
}


@pytest.mark.parametrize("name", CASES)
def test_a_signed_body_passes_the_presets_verifier(name: str) -> None:
    preset, make = CASES[name]
    signer = make()
    verifier = preset()
    verifier.validate_secret(signer.secret)
    headers = signer.headers(BODY, delivery_id="d-1")
    verified = verifier.verify(headers, BODY, [signer.secret])
    if verifier.delivery_id_header or name.startswith("standard"):
        assert verified.delivery_id == "d-1"


@pytest.mark.parametrize("name", CASES)
def test_another_body_or_secret_is_refused(name: str) -> None:
    preset, make = CASES[name]
    signer, other = make(), make()
    headers = signer.headers(BODY)
    with pytest.raises(SignatureMismatchError):
        preset().verify(headers, BODY + b" ", [signer.secret])
    with pytest.raises(SignatureMismatchError):
        preset().verify(headers, BODY, [other.secret])


@pytest.mark.parametrize("name", ["stripe", "slack", "standard-hmac", "discord"])
def test_an_old_timestamp_is_outside_the_replay_window(name: str) -> None:
    preset, make = CASES[name]
    signer = make()
    headers = signer.headers(BODY, timestamp=int(time.time()) - 3600)
    with pytest.raises(StaleRequestError):
        preset().verify(headers, BODY, [signer.secret])


def test_bodies_are_encoded_as_sent() -> None:
    assert signers.encode_body(b"\x00raw") == b"\x00raw"
    assert signers.encode_body("é") == "é".encode()
    assert signers.encode_body({"a": [1, 2]}) == b'{"a":[1,2]}'


def test_extra_headers_are_added() -> None:
    headers = signers.StripeSigner("whsec_x").headers(BODY, extra={"User-Agent": "Stripe/1.0"})
    assert headers["User-Agent"] == "Stripe/1.0"
    assert headers["Stripe-Signature"].startswith("t=")


def test_a_given_secret_is_the_one_signed_with() -> None:
    signer = signers.GitHubSigner("it's a secret")
    assert signer.secret == "it's a secret"
    presets.GitHub().verify(signer.headers(BODY), BODY, ["it's a secret"])


def test_a_standard_webhooks_secret_must_be_whsec() -> None:
    with pytest.raises(ValueError, match="whsec_"):
        signers.StandardWebhooksSigner("not-a-secret")


@pytest.mark.django_db(transaction=True)
def test_post_sends_a_signed_event_through_the_view() -> None:
    from pikku_django.models import TriggerSource
    from pikku_django.webhooks import (
        WebhookEvent,
        WebhookSource,
        register_source,
        set_credential,
        sources,
    )

    saved = dict(sources._sources)
    try:
        register_source(
            WebhookSource(
                name="signer-test",
                verify=presets.Stripe(),
                receive=lambda request, ctx: [WebhookEvent("invoice.paid", id=ctx.json()["id"])],
                events={"invoice.paid": None},
            )
        )
        TriggerSource.objects.update_or_create(name="signer-test", defaults={"enabled": True})
        signer = signers.StripeSigner()
        set_credential("signerTestWebhookSecret", signer.secret)
        client = Client()
        url = "/pikku/webhooks/signer-test/"
        assert signer.post(client, url, {"id": "evt_9"}).status_code == 200
        assert signers.StripeSigner().post(client, url, {"id": "evt_9"}).status_code == 401
    finally:
        sources._sources.clear()
        sources._sources.update(saved)
