"""Standard Webhooks: the key type is the source's declaration, never the secret's text.

A public key taken as an HMAC secret would let anyone who knows it sign requests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.test import Client

from pikku_django.models import TriggerSource
from pikku_django.webhooks import (
    InvalidSecretError,
    WebhookSource,
    credential_name,
    register_source,
    set_credential,
    start_workflow_on,
)
from pikku_django.webhooks.lifecycle import sync
from pikku_django.webhooks.presets import StandardWebhooks
from pikku_django.webhooks.verify import SignatureMismatchError
from pikku_django.workflows import workflow
from pikku_django.workflows.api import reset_engine

PRIVATE = ed25519.Ed25519PrivateKey.from_private_bytes(b"\x05" * 32)
RAW_PUBLIC = PRIVATE.public_key().public_bytes_raw()
PUBLIC = "whpk_" + base64.b64encode(RAW_PUBLIC).decode()
BARE_PUBLIC = PUBLIC.removeprefix("whpk_")
HMAC_SECRET = "whsec_" + base64.b64encode(b"k" * 24).decode()
BODY = json.dumps({"type": "user.created", "data": {"id": "u_1"}}).encode()


@workflow(name="wh.keys.note")
def note(ctx: Any, event: dict[str, Any]) -> str:
    return str(event["id"])


def receive(request: Any, ctx: Any) -> Any:
    return [ctx.body_event("user.created", id=ctx.delivery_id)]


register_source(
    WebhookSource(
        name="wh-keys-public",
        verify=StandardWebhooks(key_type="asymmetric"),
        receive=receive,
        events={"user.created": None},
    )
)
register_source(
    WebhookSource(
        name="wh-keys-shared",
        verify=StandardWebhooks(),
        receive=receive,
        events={"user.created": None},
    )
)
start_workflow_on("wh-keys-public:user.created", note)
start_workflow_on("wh-keys-shared:user.created", note)


def headers(message_id: str, *, hmac_key: bytes | None = None) -> dict[str, str]:
    """Standard Webhooks headers signed with the Ed25519 key, or forged as a ``v1``
    HMAC with ``hmac_key``."""
    timestamp = str(int(time.time()))
    signed = f"{message_id}.{timestamp}.".encode() + BODY
    if hmac_key is None:
        signature = "v1a," + base64.b64encode(PRIVATE.sign(signed)).decode()
    else:
        mac = hmac.new(hmac_key, signed, hashlib.sha256).digest()
        signature = "v1," + base64.b64encode(mac).decode()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": signature,
    }


@pytest.mark.parametrize("public", [PUBLIC, BARE_PUBLIC], ids=["whpk_", "bare"])
def test_a_public_key_is_never_an_hmac_secret(public: str) -> None:
    asymmetric = StandardWebhooks(key_type="asymmetric")
    asymmetric.validate_secret(public)
    genuine = headers("msg_1")
    assert asymmetric.verify(genuine, BODY, [public]).delivery_id == "msg_1"
    forged = headers("msg_2", hmac_key=RAW_PUBLIC)  # what anyone who knows the key can make
    with pytest.raises(SignatureMismatchError):
        asymmetric.verify(forged, BODY, [public])
    with pytest.raises(SignatureMismatchError):  # its text said nothing: decoded as HMAC key
        asymmetric.verify(headers("msg_3", hmac_key=base64.b64decode(BARE_PUBLIC)), BODY, [public])


def test_a_symmetric_source_refuses_a_public_key() -> None:
    symmetric = StandardWebhooks()
    with pytest.raises(ValueError, match=r"public key \(whpk_\.\.\.\).*key_type='asymmetric'"):
        symmetric.validate_secret(PUBLIC)
    with pytest.raises(SignatureMismatchError, match="no usable secret"):
        symmetric.verify(headers("msg_1", hmac_key=RAW_PUBLIC), BODY, [PUBLIC])


def test_an_asymmetric_source_refuses_what_is_not_a_public_key() -> None:
    asymmetric = StandardWebhooks(key_type="asymmetric")
    with pytest.raises(ValueError, match=r"HMAC secret \(whsec_\.\.\.\)"):
        asymmetric.validate_secret(HMAC_SECRET)
    with pytest.raises(ValueError, match="32 bytes"):
        asymmetric.validate_secret(base64.b64encode(b"k" * 24).decode())
    with pytest.raises(ValueError, match="signing key"):
        asymmetric.validate_secret("whsk_" + base64.b64encode(b"\x05" * 32).decode())
    with pytest.raises(SignatureMismatchError, match="no usable secret"):
        asymmetric.verify(headers("msg_1", hmac_key=b"k" * 24), BODY, [HMAC_SECRET])
    with pytest.raises(ValueError, match="key_type must be"):
        StandardWebhooks(key_type="ed25519")  # type: ignore[arg-type]
    assert repr(asymmetric) == "StandardWebhooks(tolerance=300, key_type='asymmetric')"


@pytest.mark.django_db(transaction=True)
def test_each_key_type_is_checked_when_a_value_is_stored() -> None:
    with pytest.raises(InvalidSecretError, match=r"wh-keys-shared.*public key"):
        set_credential(credential_name("wh-keys-shared"), PUBLIC)
    with pytest.raises(InvalidSecretError, match=r"wh-keys-public.*HMAC secret"):
        set_credential(credential_name("wh-keys-public"), HMAC_SECRET)
    set_credential(credential_name("wh-keys-public"), BARE_PUBLIC)
    set_credential(credential_name("wh-keys-shared"), HMAC_SECRET)


@pytest.mark.django_db(transaction=True)
def test_a_forged_hmac_is_answered_401_whatever_the_stored_key(
    client: Client, settings: Any
) -> None:
    settings.PIKKU = {
        # Values in settings are not checked when stored: the request must refuse them.
        "CREDENTIALS": {
            credential_name("wh-keys-public"): BARE_PUBLIC,
            credential_name("wh-keys-shared"): PUBLIC,
        }
    }
    reset_engine()
    sync()
    TriggerSource.objects.filter(name__in=["wh-keys-public", "wh-keys-shared"]).update(enabled=True)

    def post(route: str, sent: dict[str, str]) -> Any:
        return client.post(
            f"/pikku/webhooks/{route}/", BODY, content_type="application/json", headers=sent
        )

    assert post("wh-keys-public", headers("msg_1", hmac_key=RAW_PUBLIC)).status_code == 401
    assert post("wh-keys-shared", headers("msg_2", hmac_key=RAW_PUBLIC)).status_code == 401
    assert post("wh-keys-public", headers("msg_3")).json() == {"received": 1}
    reset_engine()
