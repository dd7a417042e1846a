"""Headers with several signatures, and hex case, judged against the providers' own
libraries: whatever a provider's library accepts is accepted, whatever it refuses is
refused; where a library cannot read a malformed entry at all, that entry is skipped.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import nacl.encoding
import nacl.exceptions
import nacl.signing
import pytest
import standardwebhooks
import stripe
from django.test import Client
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_sdk.signature import SignatureVerifier

from pikku_django.models import TriggerSource, WebhookReceipt
from pikku_django.webhooks import (
    WebhookSource,
    credential_name,
    register_source,
    set_credential,
    start_workflow_on,
)
from pikku_django.webhooks.lifecycle import sync
from pikku_django.webhooks.presets import Discord, GitHub, Slack, StandardWebhooks, Stripe
from pikku_django.webhooks.sources import unregister_source
from pikku_django.webhooks.verify import (
    MalformedSignatureError,
    SignatureMismatchError,
    Verifier,
    WebhookVerificationError,
)

BODY = b'{"id": "evt_1", "type": "charge.succeeded", "amount": 1999}'
SW_SECRET = "whsec_" + base64.b64encode(b"standard webhooks key 0123456789").decode()
SW_OTHER = "whsec_" + base64.b64encode(b"o" * 32).decode()
STRIPE_SECRET = "whsec_stripe_test_secret_0123456789"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
GITHUB_SECRET = "It's a Secret to Everybody"


def verdict(verifier: Verifier[Any], headers: dict[str, str], body: bytes, secret: str) -> int:
    """200, or the status the view answers for the verifier's refusal."""
    try:
        verifier.verify(headers, body, [secret], now=time.time())
    except WebhookVerificationError as exc:
        return exc.status_code
    return 200


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# --- Standard Webhooks ---------------------------------------------------------------------

#: Kinds of entry in a webhook-signature header: (kind, well formed, can match).
SW_KINDS = {
    "good": (True, True),
    "other-secret": (True, False),
    "random-v1": (True, False),
    "v1a": (True, False),
    "other-version": (True, False),
    "short": (False, False),
    "long": (False, False),
    "bad-base64": (False, False),
    "no-comma": (False, False),
    "empty": (False, False),
    "extra-comma": (False, False),
}


def sw_entry(kind: str, msg_id: str, signed_at: datetime, body: bytes, salt: bytes) -> str:
    if kind == "good":
        return standardwebhooks.Webhook(SW_SECRET).sign(msg_id, signed_at, body.decode())
    if kind == "other-secret":
        return standardwebhooks.Webhook(SW_OTHER).sign(msg_id, signed_at, body.decode())
    return {
        "random-v1": "v1," + b64(hashlib.sha256(salt).digest()),
        "v1a": "v1a," + b64(hashlib.sha512(salt).digest()),
        "other-version": "v2," + b64(hashlib.sha256(salt).digest()),
        "short": "v1," + b64(hashlib.sha256(salt).digest()[:31]),
        "long": "v1," + b64(hashlib.sha256(salt).digest() + b"\x00"),
        "bad-base64": "v1,!!" + b64(salt)[2:],
        "no-comma": "v1",
        "empty": "v1,",
        "extra-comma": "v1," + b64(hashlib.sha256(salt).digest()) + ",x",
    }[kind]


def sw_library(headers: dict[str, str], body: bytes) -> bool | None:
    """Whether the standardwebhooks library accepts; None when it cannot read the header."""
    try:
        standardwebhooks.Webhook(SW_SECRET).verify(body, headers)
    except standardwebhooks.WebhookVerificationError:
        return False
    except ValueError:  # an entry it cannot split (binascii.Error is a ValueError)
        return None
    return True


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(sorted(SW_KINDS)), min_size=1, max_size=6),
    salt=st.binary(min_size=1, max_size=8),
)
def test_standard_webhooks_entries_are_judged_as_the_library_judges_them(
    kinds: list[str], salt: bytes
) -> None:
    msg_id = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
    signed_at = datetime.fromtimestamp(int(time.time()), tz=UTC)
    entries = [
        sw_entry(kind, msg_id, signed_at, BODY, salt + bytes([i])) for i, kind in enumerate(kinds)
    ]
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(signed_at.timestamp())),
        "webhook-signature": " ".join(entries),
    }
    ours = verdict(StandardWebhooks(), headers, BODY, SW_SECRET)
    library = sw_library(headers, BODY)
    can_match = any(SW_KINDS[k][1] for k in kinds)
    if library is not None:
        assert (ours == 200) == library
    assert (ours == 200) == can_match  # any matching entry is enough, wherever it is
    if not can_match:  # 400 only when no entry is well formed
        assert ours == (401 if any(SW_KINDS[k][0] for k in kinds) else 400)


def test_standard_webhooks_a_bad_entry_before_a_good_one_is_skipped() -> None:
    """The case from the issue: a v1 entry that is not 32 bytes, then a valid one."""
    signed_at = datetime.fromtimestamp(int(time.time()), tz=UTC)
    good = standardwebhooks.Webhook(SW_SECRET).sign("msg_1", signed_at, BODY.decode())
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(signed_at.timestamp())),
        "webhook-signature": f"v1,{b64(b'x' * 16)} {good}",
    }
    assert sw_library(headers, BODY) is True
    assert verdict(StandardWebhooks(), headers, BODY, SW_SECRET) == 200


# --- Stripe --------------------------------------------------------------------------------

STRIPE_KINDS = {
    "good": (True, True),
    "good-upper": (True, False),  # Stripe compares the hex text: upper case never matches
    "other-secret": (True, False),
    "random": (True, False),
    "v0": (True, False),
    "short": (False, False),
    "bad-hex": (False, False),
    "empty": (False, False),
    "garbage": (False, False),
}


def stripe_entry(kind: str, timestamp: int, body: bytes, salt: bytes) -> str:
    def v1(secret: str) -> str:
        header = stripe.WebhookSignature.generate_signature_header(
            body.decode(), secret, timestamp=timestamp
        )
        return header.split(",")[1]

    return {
        "good": lambda: v1(STRIPE_SECRET),
        "good-upper": lambda: "v1=" + v1(STRIPE_SECRET)[3:].upper(),
        "other-secret": lambda: v1("whsec_another"),
        "random": lambda: "v1=" + hashlib.sha256(salt).hexdigest(),
        "v0": lambda: "v0=" + hashlib.sha256(salt).hexdigest(),
        "short": lambda: "v1=" + hashlib.sha256(salt).hexdigest()[:62],
        "bad-hex": lambda: "v1=" + "zz" * 32,
        "empty": lambda: "v1=",
        "garbage": lambda: "garbage",
    }[kind]()


def stripe_library(header: str, body: bytes) -> bool:
    try:
        stripe.WebhookSignature.verify_header(body.decode(), header, STRIPE_SECRET, tolerance=300)
    except stripe.SignatureVerificationError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(sorted(STRIPE_KINDS)), min_size=1, max_size=6),
    salt=st.binary(min_size=1, max_size=8),
)
def test_stripe_items_are_judged_as_the_library_judges_them(kinds: list[str], salt: bytes) -> None:
    timestamp = int(time.time())
    items = [stripe_entry(kind, timestamp, BODY, salt + bytes([i])) for i, kind in enumerate(kinds)]
    header = f"t={timestamp}," + ",".join(items)
    ours = verdict(Stripe(), {"Stripe-Signature": header}, BODY, STRIPE_SECRET)
    assert (ours == 200) == stripe_library(header, BODY)
    if ours != 200:
        well_formed = any(STRIPE_KINDS[k][0] for k in kinds)
        assert ours == (401 if well_formed else 400)


def test_stripe_a_bad_v1_before_a_good_one_is_skipped() -> None:
    timestamp = int(time.time())
    good = stripe_entry("good", timestamp, BODY, b"")
    header = f"t={timestamp},v1={'ab' * 20},{good}"
    assert stripe_library(header, BODY)
    assert verdict(Stripe(), {"Stripe-Signature": header}, BODY, STRIPE_SECRET) == 200


# --- hex case: GitHub and Slack compare the text, Discord the bytes ------------------------


def github_documented_check(header: str, body: bytes, secret: str) -> bool:
    """GitHub's documented check: the header equals ``sha256=`` + the lower-case hex HMAC."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header)


masks = st.integers(min_value=0, max_value=2**60 - 1)


def mixed_case(text: str, mask: int) -> str:
    return "".join(c.upper() if mask >> (i % 60) & 1 else c for i, c in enumerate(text))


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=100), mask=masks)
def test_github_hex_case_as_github_checks_it(body: bytes, mask: int) -> None:
    good = "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    header = mixed_case(good, mask)
    ours = verdict(GitHub(), {"X-Hub-Signature-256": header}, body, GITHUB_SECRET)
    assert (ours == 200) == github_documented_check(header, body, GITHUB_SECRET)
    assert ours in (200, 401)  # well formed, so never 400


@settings(max_examples=100, deadline=None)
@given(
    body=st.text(max_size=100).map(str.encode), mask=st.integers(min_value=0, max_value=2**60 - 1)
)
def test_slack_hex_case_as_the_sdk_checks_it(body: bytes, mask: int) -> None:
    timestamp = str(int(time.time()))
    sdk = SignatureVerifier(SLACK_SECRET)
    good = sdk.generate_signature(timestamp=timestamp, body=body)
    assert good is not None
    signature = "v0=" + mixed_case(good[3:], mask)
    headers = {"X-Slack-Signature": signature, "X-Slack-Request-Timestamp": timestamp}
    ours = verdict(Slack(), headers, body, SLACK_SECRET)
    assert (ours == 200) == sdk.is_valid(body=body, timestamp=timestamp, signature=signature)


def test_upper_case_hex_is_refused_for_github_and_slack_with_401() -> None:
    good = "sha256=" + hmac.new(GITHUB_SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    with pytest.raises(SignatureMismatchError, match="upper-case"):
        GitHub().verify({"X-Hub-Signature-256": good[:7] + good[7:].upper()}, BODY, [GITHUB_SECRET])
    with pytest.raises(SignatureMismatchError, match="exactly"):
        GitHub().verify({"X-Hub-Signature-256": "SHA256=" + good[7:]}, BODY, [GITHUB_SECRET])
    with pytest.raises(MalformedSignatureError):
        GitHub().verify({"X-Hub-Signature-256": "sha256=" + "g" * 64}, BODY, [GITHUB_SECRET])


DISCORD_KEY = nacl.signing.SigningKey(b"\x09" * 32)
DISCORD_PUBLIC = DISCORD_KEY.verify_key.encode(nacl.encoding.HexEncoder).decode()


@settings(max_examples=50, deadline=None)
@given(body=st.binary(max_size=100), mask=masks)
def test_discord_hex_case_as_pynacl_checks_it(body: bytes, mask: int) -> None:
    timestamp = str(int(time.time()))
    signed = DISCORD_KEY.sign(timestamp.encode() + body)
    signature = mixed_case(signed.signature.hex(), mask)
    headers = {"X-Signature-Ed25519": signature, "X-Signature-Timestamp": timestamp}
    try:
        DISCORD_KEY.verify_key.verify(timestamp.encode() + body, bytes.fromhex(signature))
        library = True
    except nacl.exceptions.BadSignatureError:
        library = False
    assert library  # PyNaCl reads hex in either case
    assert verdict(Discord(), headers, body, DISCORD_PUBLIC) == 200


# --- through the view ----------------------------------------------------------------------


def body_event(request: Any, ctx: Any) -> Any:
    return [ctx.body_event("charge", id=None)]


@pytest.fixture
def providers() -> Iterator[Client]:
    declared = [
        WebhookSource(
            name="wh-sig-stripe", verify=Stripe(), receive=body_event, events={"charge": None}
        ),
        WebhookSource(
            name="wh-sig-standard",
            verify=StandardWebhooks(),
            receive=body_event,
            events={"charge": None},
        ),
    ]
    for source in declared:
        register_source(source)
        start_workflow_on(f"{source.name}:charge", "wh.deploy")
    try:
        sync()
        TriggerSource.objects.filter(name__startswith="wh-sig-").update(enabled=True)
        set_credential(credential_name("wh-sig-stripe"), STRIPE_SECRET)
        set_credential(credential_name("wh-sig-standard"), SW_SECRET)
        yield Client()
    finally:
        for source in declared:
            unregister_source(source.name)


@pytest.mark.django_db(transaction=True)
def test_the_view_accepts_a_good_entry_after_bad_ones_and_400s_only_all_malformed(
    providers: Client,
) -> None:
    timestamp = int(time.time())
    good = stripe_entry("good", timestamp, BODY, b"")
    stripe_url = "/pikku/webhooks/wh-sig-stripe/"
    answer = providers.post(
        stripe_url,
        BODY,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=f"t={timestamp},v1={'ab' * 20},v1=zz,{good}",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"received": 1}
    answer = providers.post(
        stripe_url,
        BODY,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=f"t={timestamp},v1={'ab' * 20},v1=zz",
    )
    assert answer.status_code == 400
    assert "well-formed" in answer.json()["error"]

    signed_at = datetime.fromtimestamp(timestamp, tz=UTC)
    good_sw = standardwebhooks.Webhook(SW_SECRET).sign("msg_view", signed_at, BODY.decode())
    sw = {"HTTP_WEBHOOK_ID": "msg_view", "HTTP_WEBHOOK_TIMESTAMP": str(timestamp)}
    sw_url = "/pikku/webhooks/wh-sig-standard/"
    answer = providers.post(
        sw_url,
        BODY,
        content_type="application/json",
        HTTP_WEBHOOK_SIGNATURE=f"v1,{b64(b'x' * 16)} v1 {good_sw}",
        **sw,
    )
    assert answer.status_code == 200, answer.content
    answer = providers.post(
        sw_url,
        BODY,
        content_type="application/json",
        HTTP_WEBHOOK_SIGNATURE=f"v1,{b64(b'x' * 16)} v1",
        **sw,
    )
    assert answer.status_code == 400
    assert WebhookReceipt.objects.filter(source__startswith="wh-sig-").count() == 2
