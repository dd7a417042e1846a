"""Secrets checked by their sources' verifiers: refused when stored from the command or
the admin, and reported by the system check when already stored."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import nacl.encoding
import nacl.signing
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from pikku_django.checks import check_webhook_secrets
from pikku_django.models import CredentialValue
from pikku_django.webhooks import WebhookSource, credential_name, register_source, set_credential
from pikku_django.webhooks.credentials import unusable_secrets
from pikku_django.webhooks.presets import Discord, StandardWebhooks
from pikku_django.webhooks.secret_checks import InvalidSecretError
from pikku_django.webhooks.sources import unregister_source

pytestmark = pytest.mark.django_db(transaction=True)

DISCORD = credential_name("wh-key-discord")
STANDARD = credential_name("wh-key-standard")
DISCORD_PUBLIC = (
    nacl.signing.SigningKey(b"\x05" * 32).verify_key.encode(nacl.encoding.HexEncoder).decode()
)
SW_SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
ADD_CREDENTIAL = reverse("admin:pikku_django_credentialvalue_add")


@pytest.fixture(autouse=True)
def keyed_sources() -> Iterator[None]:
    declared = [
        WebhookSource(name="wh-key-discord", verify=Discord(), receive=lambda r, c: None),
        WebhookSource(name="wh-key-standard", verify=StandardWebhooks(), receive=lambda r, c: None),
    ]
    for source in declared:
        register_source(source)
    yield
    for source in declared:
        unregister_source(source.name)


def credentials_set(name: str, value: str) -> str:
    out = io.StringIO()
    call_command("pikku_credentials", "set", name, stdin=io.StringIO(value), stdout=out)
    return out.getvalue()


def test_the_command_refuses_a_discord_key_that_is_not_an_ed25519_public_key() -> None:
    with pytest.raises(CommandError) as caught:
        credentials_set(DISCORD, "my-discord-bot-token")
    message = str(caught.value)
    assert "webhook source 'wh-key-discord' (Discord(tolerance=300))" in message
    assert "not a public key" in message
    assert message.endswith("Nothing was stored.")
    assert "my-discord-bot-token" not in message

    p256 = ec.generate_private_key(ec.SECP256R1()).public_key()
    der = p256.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(CommandError, match="not an Ed25519 public key"):
        credentials_set(DISCORD, base64.b64encode(der).decode())  # a public key, of another kind
    assert not CredentialValue.objects.filter(credential=DISCORD).exists()

    assert "Stored value" in credentials_set(DISCORD, DISCORD_PUBLIC)
    assert CredentialValue.objects.filter(credential=DISCORD, active=True).count() == 1


def test_the_command_refuses_a_standard_webhooks_signing_key_and_bad_base64() -> None:
    with pytest.raises(CommandError, match=r"set its public key \(whpk_\.\.\.\) instead"):
        credentials_set(STANDARD, "whsk_" + base64.b64encode(b"\x01" * 32).decode())
    with pytest.raises(CommandError, match="not whsec_ followed by base64"):
        credentials_set(STANDARD, "whsec_not*base64")
    assert not CredentialValue.objects.exists()
    credentials_set(STANDARD, SW_SECRET)
    assert CredentialValue.objects.filter(credential=STANDARD).count() == 1


def test_a_credential_no_source_uses_is_not_checked_and_set_credential_raises() -> None:
    assert "Stored value" in credentials_set("somethingElse", "any text at all")
    with pytest.raises(InvalidSecretError, match="'wh-key-discord'"):
        set_credential(DISCORD, "zz")
    assert isinstance(InvalidSecretError("x"), ValueError)
    assert not CredentialValue.objects.filter(credential=DISCORD).exists()


def test_the_admin_form_refuses_an_unusable_value_and_stores_nothing(
    admin_client: Client,
) -> None:
    response = admin_client.post(ADD_CREDENTIAL, {"credential": DISCORD, "value": "abc123"})
    assert response.status_code == 200  # the form again, with the error
    page = response.content.decode()
    assert "wh-key-discord" in page
    assert "not a public key" in page
    assert 'value="abc123"' not in page
    assert not CredentialValue.objects.filter(credential=DISCORD).exists()

    response = admin_client.post(ADD_CREDENTIAL, {"credential": DISCORD, "value": DISCORD_PUBLIC})
    assert response.status_code == 302
    assert CredentialValue.objects.filter(credential=DISCORD).count() == 1


def test_the_check_reports_stored_and_configured_values_a_verifier_cannot_load(
    settings: Any,
) -> None:
    assert check_webhook_secrets(databases=["default"]) == []
    good = set_credential(DISCORD, DISCORD_PUBLIC)
    bad = set_credential(DISCORD, "not-a-key-at-all-0000", validate=False)
    settings.PIKKU = {"CREDENTIALS": {STANDARD: [SW_SECRET, "whsec_***"]}}

    found = {(u.source, u.where.split(" (")[0]) for u in unusable_secrets()}
    assert found == {
        ("wh-key-discord", f"stored value {bad.pk}"),
        ("wh-key-standard", "PIKKU['CREDENTIALS'] value 2"),
    }
    messages = check_webhook_secrets(databases=["default"])
    assert {m.id for m in messages} == {"pikku_django.W008"}
    by_source = {m.msg.split("'")[1]: m for m in messages}
    discord = by_source["wh-key-discord"]
    assert f"stored value {bad.pk} (…0000)" in discord.msg
    assert "not a public key" in discord.msg
    assert f"pikku_credentials retire {bad.pk}" in discord.hint
    assert "PIKKU['CREDENTIALS']" in by_source["wh-key-standard"].hint
    assert f"stored value {good.pk} " not in discord.msg
    assert check_webhook_secrets(databases=None) == []  # only with --database

    out = io.StringIO()
    call_command("check", "--database", "default", stdout=out, stderr=out)
    assert "pikku_django.W008" in out.getvalue()
