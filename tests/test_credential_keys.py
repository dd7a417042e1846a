"""The keys stored credentials are encrypted with: SECRET_KEY rotated as Django documents
(the old one in SECRET_KEY_FALLBACKS) keeps webhooks verified, and a value no key
decrypts is answered 503 with the reason logged, never a 500."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from pikku_django.checks import check_database_state
from pikku_django.models import CredentialValue, TriggerSource, WebhookReceipt
from pikku_django.webhooks import credential_name, credential_values, set_credential
from pikku_django.webhooks.lifecycle import sync
from tests import webhook_defs  # noqa: F401  (declares wh-github)

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "rotate-the-signing-key-1234"
CREDENTIAL = credential_name("wh-github")
URL = "/pikku/webhooks/wh-github/"


def post(client: Client, delivery: str) -> Any:
    body = json.dumps({"ref": "main", "after": delivery}).encode()  # a new push each time
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return client.post(
        URL,
        body,
        content_type="application/json",
        HTTP_X_GITHUB_EVENT="push",
        HTTP_X_GITHUB_DELIVERY=delivery,
        HTTP_X_HUB_SIGNATURE_256=signature,
    )


def credentials_cmd(*args: str) -> str:
    out = io.StringIO()
    call_command("pikku_credentials", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def enabled() -> None:
    sync()
    TriggerSource.objects.filter(name="wh-github").update(enabled=True)


def test_a_rotated_secret_key_with_the_old_one_in_fallbacks_still_decrypts(
    client: Client, enabled: None, settings: Any
) -> None:
    settings.SECRET_KEY = "the-old-secret-key"
    settings.SECRET_KEY_FALLBACKS = []
    stored = set_credential(CREDENTIAL, SECRET)
    settings.SECRET_KEY = "the-new-secret-key"
    settings.SECRET_KEY_FALLBACKS = ["the-old-secret-key"]
    assert post(client, "d-fallback").status_code == 200
    assert credential_values(CREDENTIAL) == [SECRET]
    newer = set_credential(CREDENTIAL, SECRET + "-2")  # encrypted with the current key

    output = credentials_cmd("rotate")
    assert "Re-encrypted 2 value(s) with the key derived from SECRET_KEY" in output
    settings.SECRET_KEY_FALLBACKS = []  # the old key can go now
    assert sorted(credential_values(CREDENTIAL)) == sorted([SECRET, SECRET + "-2"])
    assert post(client, "d-rotated").status_code == 200
    assert {stored.pk, newer.pk} == set(CredentialValue.objects.values_list("pk", flat=True))
    assert WebhookReceipt.objects.count() == 2


@pytest.mark.parametrize("keys", ["secret-key", "credential-keys"])
def test_a_secret_no_key_decrypts_is_answered_503_with_the_reason_logged(
    client: Client, enabled: None, settings: Any, caplog: pytest.LogCaptureFixture, keys: str
) -> None:
    if keys == "secret-key":
        settings.SECRET_KEY = "the-lost-secret-key"
        stored = set_credential(CREDENTIAL, SECRET)
        settings.SECRET_KEY = "the-new-secret-key"  # and no SECRET_KEY_FALLBACKS
        settings.SECRET_KEY_FALLBACKS = []
        fix = "back in SECRET_KEY_FALLBACKS"
    else:
        settings.PIKKU = {"CREDENTIAL_KEYS": [Fernet.generate_key().decode()]}
        stored = set_credential(CREDENTIAL, SECRET)
        settings.PIKKU = {"CREDENTIAL_KEYS": [Fernet.generate_key().decode()]}
        fix = "back in PIKKU['CREDENTIAL_KEYS']"

    with caplog.at_level(logging.ERROR, logger="pikku_django.webhooks.views"):
        response = post(client, "d-lost")
    assert response.status_code == 503
    assert "cannot be decrypted" in response.json()["error"]
    assert not WebhookReceipt.objects.exists()
    [record] = [r for r in caplog.records if r.name == "pikku_django.webhooks.views"]
    message = record.getMessage()
    assert record.levelno == logging.ERROR
    assert "Webhook wh-github refused (503)" in message
    assert f"credential {CREDENTIAL!r} cannot be decrypted" in message
    assert fix in message
    assert "pikku_credentials rotate" in message

    listed = credentials_cmd("list")
    assert f"Value {stored.pk} of {CREDENTIAL} cannot be decrypted" in listed
    assert "answer 503" in listed
    assert fix in listed
    with pytest.raises(CommandError, match=f"Stored value\\(s\\) {stored.pk} cannot be decrypted"):
        credentials_cmd("rotate")
    [error] = [m for m in check_database_state(databases=["default"]) if m.id.endswith("E016")]
    assert fix in error.msg
