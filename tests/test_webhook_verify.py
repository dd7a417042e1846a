"""Webhook signature verification: providers' own signers accepted, everything else refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import nacl.encoding
import nacl.signing
import pytest
import standardwebhooks
import stripe
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID
from django.http.request import HttpHeaders
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_sdk.signature import SignatureVerifier

from pikku_django.webhooks import _public_keys as public_keys_module
from pikku_django.webhooks.presets import (
    Discord,
    GitHub,
    SendGrid,
    Shopify,
    Slack,
    StandardWebhooks,
    Stripe,
)
from pikku_django.webhooks.verify import (
    HMAC,
    MAX_HEADER_LENGTH,
    Function,
    MalformedSignatureError,
    PublicKey,
    SignatureMismatchError,
    StaleRequestError,
    Token,
    VerifiedRequest,
    Verifier,
    WebhookRequest,
    WebhookVerificationError,
    verify_request,
)

NOW = 1_700_000_000
BODY = '{"id": "evt_1", "name": "Žofie", "amount": 1999}'.encode()
OTHER = "another secret entirely"

# GitHub's published test vector.
GITHUB_SECRET = "It's a Secret to Everybody"
GITHUB_BODY = b"Hello, World!"
GITHUB_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

STRIPE_SECRET = "whsec_" + base64.b64encode(b"stripe secret bytes 0123456789").decode()
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SHOPIFY_SECRET = "shpss_0123456789abcdef"


# --- how each provider signs (its own library where one exists) -------------------------


def github_headers(body: bytes, secret: str, delivery: str = "72d3162e-cc78") -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={digest}", "X-GitHub-Delivery": delivery}


def stripe_headers(body: bytes, secret: str, timestamp: int = NOW) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(
        body.decode(), secret, timestamp=timestamp
    )
    return {"Stripe-Signature": header}


def slack_headers(body: bytes, secret: str, timestamp: int = NOW) -> dict[str, str]:
    signature = SignatureVerifier(secret).generate_signature(timestamp=str(timestamp), body=body)
    assert signature is not None
    return {"X-Slack-Signature": signature, "X-Slack-Request-Timestamp": str(timestamp)}


def sw_headers(
    body: bytes, secret: str, timestamp: int = NOW, msg_id: str = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
) -> dict[str, str]:
    signature = standardwebhooks.Webhook(secret).sign(
        msg_id, datetime.fromtimestamp(timestamp, tz=UTC), body.decode()
    )
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
    }


def shopify_headers(body: bytes, secret: str) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).digest()
    return {
        "X-Shopify-Hmac-Sha256": base64.b64encode(digest).decode(),
        "X-Shopify-Webhook-Id": "w1",
    }


DISCORD_KEY = nacl.signing.SigningKey(b"\x07" * 32)
DISCORD_PUBLIC = DISCORD_KEY.verify_key.encode(nacl.encoding.HexEncoder).decode()


def discord_headers(
    body: bytes, key: nacl.signing.SigningKey = DISCORD_KEY, timestamp: int = NOW
) -> dict[str, str]:
    signature = key.sign(str(timestamp).encode() + body).signature.hex()
    return {"X-Signature-Ed25519": signature, "X-Signature-Timestamp": str(timestamp)}


def check(
    verifier: Verifier[Any],
    headers: Mapping[str, str],
    body: bytes,
    secrets: list[str],
    now: float = NOW,
) -> VerifiedRequest:
    return verifier.verify(headers, body, secrets, now=now)


# --- GitHub --------------------------------------------------------------------------------


def test_github_published_vector() -> None:
    headers = {"X-Hub-Signature-256": GITHUB_SIGNATURE, "X-GitHub-Delivery": "d-1"}
    result = check(GitHub(), headers, GITHUB_BODY, [GITHUB_SECRET])
    # GitHub signs neither its delivery id nor a timestamp: the body is the replay key.
    digest = hashlib.sha256(GITHUB_BODY).hexdigest()
    assert result == VerifiedRequest(
        delivery_id="d-1", timestamp=None, secret_index=0, replay_digest=digest
    )


def test_github_with_django_request_headers() -> None:
    headers = HttpHeaders(
        {"HTTP_X_HUB_SIGNATURE_256": GITHUB_SIGNATURE, "HTTP_X_GITHUB_DELIVERY": "d-2"}
    )
    assert check(GitHub(), headers, GITHUB_BODY, [GITHUB_SECRET]).delivery_id == "d-2"


def test_header_names_are_case_insensitive() -> None:
    headers = {"x-hub-signature-256": GITHUB_SIGNATURE}
    assert check(GitHub(), headers, GITHUB_BODY, [GITHUB_SECRET]).delivery_id is None


def test_a_generic_hmac_takes_its_prefix_and_hex_in_any_case() -> None:
    headers = {"X-Sig": "SHA256=" + GITHUB_SIGNATURE[7:].upper()}
    verifier = HMAC("X-Sig", prefix="sha256=")
    assert check(verifier, headers, GITHUB_BODY, [GITHUB_SECRET]).secret_index == 0


def test_github_refusals() -> None:
    headers = {"X-Hub-Signature-256": GITHUB_SIGNATURE}
    with pytest.raises(SignatureMismatchError, match="does not match"):
        check(GitHub(), headers, b"Hello, World?", [GITHUB_SECRET])
    with pytest.raises(SignatureMismatchError, match="does not match"):
        check(GitHub(), headers, GITHUB_BODY, ["It's a secret to everybody"])
    with pytest.raises(SignatureMismatchError, match="missing"):
        check(GitHub(), {"X-GitHub-Delivery": "d"}, GITHUB_BODY, [GITHUB_SECRET])
    with pytest.raises(MalformedSignatureError):
        check(GitHub(), {"X-Hub-Signature-256": GITHUB_SIGNATURE[7:]}, GITHUB_BODY, [GITHUB_SECRET])
    with pytest.raises(MalformedSignatureError):  # a SHA-1 signature in the SHA-256 header
        check(GitHub(), {"X-Hub-Signature-256": "sha256=" + "ab" * 20}, GITHUB_BODY, ["x"])


def test_second_rotation_secret_matches() -> None:
    headers = {"X-Hub-Signature-256": GITHUB_SIGNATURE}
    result = check(GitHub(), headers, GITHUB_BODY, ["old-one", "", GITHUB_SECRET])
    assert result.secret_index == 2


@pytest.mark.parametrize("secrets", [[], [""], ["", "  "], None, [None]])
def test_no_secret_never_accepts(secrets: Any) -> None:
    headers = {"X-Hub-Signature-256": GITHUB_SIGNATURE}
    with pytest.raises(SignatureMismatchError, match="no secret is set"):
        GitHub().verify(headers, GITHUB_BODY, secrets, now=NOW)


def test_programming_errors_are_type_errors() -> None:
    headers = {"X-Hub-Signature-256": GITHUB_SIGNATURE}
    # A bare string would otherwise be tried one character at a time.
    with pytest.raises(TypeError, match="single string"):
        GitHub().verify(headers, GITHUB_BODY, GITHUB_SECRET)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="raw request bytes"):
        GitHub().verify(headers, GITHUB_BODY.decode(), [GITHUB_SECRET])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a str"):
        GitHub().verify(headers, GITHUB_BODY, [b"bytes"])  # type: ignore[list-item]
    assert check(GitHub(), headers, bytearray(GITHUB_BODY), [GITHUB_SECRET])  # type: ignore[arg-type]


@pytest.mark.parametrize("delivery", ["x" * 256, "line\nbreak", "nul\x00"])
def test_unusable_delivery_id_is_malformed(delivery: str) -> None:
    headers = {"X-Hub-Signature-256": GITHUB_SIGNATURE, "X-GitHub-Delivery": delivery}
    with pytest.raises(MalformedSignatureError, match="delivery id"):
        check(GitHub(), headers, GITHUB_BODY, [GITHUB_SECRET])


def test_verify_request_and_status_codes() -> None:
    headers = {"X-Hub-Signature-256": GITHUB_SIGNATURE}
    assert verify_request(GitHub(), headers, GITHUB_BODY, [GITHUB_SECRET], now=NOW)
    assert MalformedSignatureError("x").status_code == 400
    assert SignatureMismatchError("x").status_code == 401
    assert StaleRequestError("x").status_code == 401
    assert issubclass(StaleRequestError, SignatureMismatchError)
    for error in (MalformedSignatureError, SignatureMismatchError):
        assert issubclass(error, WebhookVerificationError)


# --- Stripe --------------------------------------------------------------------------------


def test_stripe_accepts_its_library_signature() -> None:
    result = check(Stripe(), stripe_headers(BODY, STRIPE_SECRET), BODY, [STRIPE_SECRET])
    assert result == VerifiedRequest(delivery_id=None, timestamp=NOW, secret_index=0)
    # Stripe's own check agrees on what was signed.
    header = stripe_headers(BODY, STRIPE_SECRET)["Stripe-Signature"]
    assert stripe.WebhookSignature.verify_header(BODY, header, STRIPE_SECRET, tolerance=None)


def test_stripe_secret_is_used_verbatim_not_base64_decoded() -> None:
    decoded = base64.b64decode(STRIPE_SECRET.removeprefix("whsec_"))
    mac = hmac.new(decoded, f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    with pytest.raises(SignatureMismatchError):
        check(Stripe(), {"Stripe-Signature": f"t={NOW},v1={mac}"}, BODY, [STRIPE_SECRET])


def test_stripe_any_v1_may_match() -> None:
    old = stripe_headers(BODY, "whsec_old")["Stripe-Signature"]
    new = stripe_headers(BODY, STRIPE_SECRET)["Stripe-Signature"]
    header = f"{old},v0=abc,{new.split(',')[1]}"
    assert check(Stripe(), {"Stripe-Signature": header}, BODY, [STRIPE_SECRET])
    assert check(Stripe(), {"Stripe-Signature": header}, BODY, ["whsec_old"])
    result = check(Stripe(), stripe_headers(BODY, STRIPE_SECRET), BODY, ["whsec_x", STRIPE_SECRET])
    assert result.secret_index == 1


def test_stripe_refusals() -> None:
    headers = stripe_headers(BODY, STRIPE_SECRET)
    with pytest.raises(SignatureMismatchError, match="does not match"):
        check(Stripe(), headers, BODY + b" ", [STRIPE_SECRET])
    with pytest.raises(SignatureMismatchError, match="does not match"):
        check(Stripe(), headers, BODY, ["whsec_wrong"])


@pytest.mark.parametrize(
    ("signed_at", "tolerance", "message"),
    [(NOW - 301, 300, "old"), (NOW + 301, 300, "future"), (NOW - 61, 60, "old")],
)
def test_stripe_window_is_two_sided(signed_at: int, tolerance: int, message: str) -> None:
    headers = stripe_headers(BODY, STRIPE_SECRET, timestamp=signed_at)
    with pytest.raises(StaleRequestError, match=message):
        check(Stripe(tolerance=tolerance), headers, BODY, [STRIPE_SECRET])


def test_stripe_window_edges_and_none() -> None:
    for signed_at in (NOW - 300, NOW + 300):
        headers = stripe_headers(BODY, STRIPE_SECRET, timestamp=signed_at)
        assert check(Stripe(), headers, BODY, [STRIPE_SECRET]).timestamp == signed_at
    headers = stripe_headers(BODY, STRIPE_SECRET, timestamp=NOW - 86_400)
    assert check(Stripe(tolerance=None), headers, BODY, [STRIPE_SECRET])


def test_stale_is_only_reported_for_a_matching_signature() -> None:
    headers = stripe_headers(BODY, "whsec_wrong", timestamp=NOW - 3_600)
    with pytest.raises(SignatureMismatchError) as caught:
        check(Stripe(), headers, BODY, [STRIPE_SECRET])
    assert not isinstance(caught.value, StaleRequestError)


HEX64 = "a" * 64


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (f"v1={HEX64}", MalformedSignatureError),  # no t=
        (f"t={NOW}", SignatureMismatchError),  # no v1 at all
        (f"t={NOW},v0={HEX64}", SignatureMismatchError),  # only a scheme we do not accept
        (f"t={NOW},v1=", MalformedSignatureError),
        (f"t={NOW},v1={'z' * 64}", MalformedSignatureError),
        (f"t={NOW},v1={'a' * 63}", MalformedSignatureError),
        (f"t={NOW},v1={'ab' * 20}", MalformedSignatureError),
        (f"t=abc,v1={HEX64}", MalformedSignatureError),
        (f"t=,v1={HEX64}", MalformedSignatureError),
        (f"t=-5,v1={HEX64}", MalformedSignatureError),
        (f"t=1_700_000_000,v1={HEX64}", MalformedSignatureError),
        (
            "t=\u0661\u0667" + "\u0660" * 8 + f",v1={HEX64}",
            MalformedSignatureError,
        ),  # Arabic digits
        (f"t={NOW},t={NOW},v1={HEX64}", MalformedSignatureError),
        (f"t={NOW},v1={HEX64}=", MalformedSignatureError),
        (f"t={NOW},=x,v1={HEX64}", SignatureMismatchError),  # the bad item is skipped
        ("garbage", MalformedSignatureError),
        (",,,", MalformedSignatureError),
        ("t=ü,v1=ö", MalformedSignatureError),
        (f"t={NOW}," + ",".join([f"v1={HEX64}"] * 17), MalformedSignatureError),
        (f"t={NOW},v1={HEX64}," + "x" * MAX_HEADER_LENGTH, MalformedSignatureError),
        ("", SignatureMismatchError),  # empty counts as absent
        ("   ", SignatureMismatchError),
    ],
)
def test_stripe_malformed_headers(header: str, error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        check(Stripe(), {"Stripe-Signature": header}, BODY, [STRIPE_SECRET])
    assert type(caught.value) is error


def test_stripe_stray_commas_and_spaces_are_tolerated() -> None:
    header = stripe_headers(BODY, STRIPE_SECRET)["Stripe-Signature"].replace(",", " , ") + ","
    assert check(Stripe(), {"Stripe-Signature": header}, BODY, [STRIPE_SECRET])


# --- Slack ---------------------------------------------------------------------------------


def test_slack_accepts_its_sdk_signature() -> None:
    headers = slack_headers(BODY, SLACK_SECRET)
    assert check(Slack(), headers, BODY, [SLACK_SECRET]).timestamp == NOW


def test_slack_refusals_and_rotation() -> None:
    headers = slack_headers(BODY, SLACK_SECRET)
    assert check(Slack(), headers, BODY, ["rotated-out", SLACK_SECRET]).secret_index == 1
    with pytest.raises(SignatureMismatchError):
        check(Slack(), headers, BODY.replace(b"1999", b"9999"), [SLACK_SECRET])
    with pytest.raises(SignatureMismatchError):
        check(Slack(), headers, BODY, ["not-the-secret"])
    with pytest.raises(StaleRequestError, match="old"):
        check(Slack(), slack_headers(BODY, SLACK_SECRET, NOW - 301), BODY, [SLACK_SECRET])
    with pytest.raises(StaleRequestError, match="future"):
        check(Slack(), slack_headers(BODY, SLACK_SECRET, NOW + 301), BODY, [SLACK_SECRET])
    # The timestamp is signed: moving it breaks the signature.
    moved = {**headers, "X-Slack-Request-Timestamp": str(NOW + 1)}
    with pytest.raises(SignatureMismatchError, match="does not match"):
        check(Slack(), moved, BODY, [SLACK_SECRET])


SLACK_CASES: list[tuple[str | None, str | None, type[Exception]]] = [
    (None, str(NOW), SignatureMismatchError),
    (f"v0={HEX64}", None, SignatureMismatchError),
    (HEX64, str(NOW), MalformedSignatureError),
    (f"v1={HEX64}", str(NOW), MalformedSignatureError),
    ("v0=", str(NOW), MalformedSignatureError),
    ("v0=xyz", str(NOW), MalformedSignatureError),
    (f"v0={'ab' * 20}", str(NOW), MalformedSignatureError),
    (f"v0={HEX64}", "soon", MalformedSignatureError),
    (f"v0={HEX64}", "\uff11\uff12\uff13", MalformedSignatureError),  # fullwidth digits
    (f"v0={HEX64}", "1e9", MalformedSignatureError),
    (f"v0={HEX64}", "9" * 40, MalformedSignatureError),
]


@pytest.mark.parametrize(("signature", "timestamp", "error"), SLACK_CASES)
def test_slack_malformed_headers(
    signature: str | None, timestamp: str | None, error: type[Exception]
) -> None:
    headers = {"X-Slack-Signature": signature, "X-Slack-Request-Timestamp": timestamp}
    headers = {name: value for name, value in headers.items() if value is not None}
    with pytest.raises(error) as caught:
        check(Slack(), headers, BODY, [SLACK_SECRET])
    assert type(caught.value) is error


# --- Standard Webhooks / Svix --------------------------------------------------------------


def test_standard_webhooks_accepts_its_library_signature() -> None:
    headers = sw_headers(BODY, SW_SECRET)
    result = check(StandardWebhooks(), headers, BODY, [SW_SECRET])
    assert result == VerifiedRequest(
        delivery_id="msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", timestamp=NOW, secret_index=0
    )
    # The prefix is optional, as in the library.
    assert check(StandardWebhooks(), headers, BODY, [SW_SECRET.removeprefix("whsec_")])


def test_standard_webhooks_svix_header_names() -> None:
    headers = {k.replace("webhook-", "svix-"): v for k, v in sw_headers(BODY, SW_SECRET).items()}
    assert check(StandardWebhooks(), headers, BODY, [SW_SECRET]).delivery_id


def test_standard_webhooks_several_signatures_and_rotation() -> None:
    other = "whsec_" + base64.b64encode(b"o" * 32).decode()
    mine = sw_headers(BODY, SW_SECRET)
    theirs = sw_headers(BODY, other)["webhook-signature"]
    headers = {**mine, "webhook-signature": f"{theirs} v2,whatever {mine['webhook-signature']}"}
    assert check(StandardWebhooks(), headers, BODY, [SW_SECRET]).secret_index == 0
    assert check(StandardWebhooks(), mine, BODY, [other, SW_SECRET]).secret_index == 1


def test_standard_webhooks_refusals() -> None:
    headers = sw_headers(BODY, SW_SECRET)
    with pytest.raises(SignatureMismatchError, match="does not match"):
        check(StandardWebhooks(), headers, BODY[:-1], [SW_SECRET])
    with pytest.raises(SignatureMismatchError, match="does not match"):
        check(StandardWebhooks(), headers, BODY, ["whsec_" + base64.b64encode(b"x" * 24).decode()])
    with pytest.raises(SignatureMismatchError, match="does not match"):  # the id is signed
        check(StandardWebhooks(), {**headers, "webhook-id": "msg_other"}, BODY, [SW_SECRET])
    with pytest.raises(StaleRequestError, match="old"):
        check(StandardWebhooks(), sw_headers(BODY, SW_SECRET, NOW - 301), BODY, [SW_SECRET])
    with pytest.raises(StaleRequestError, match="future"):
        check(StandardWebhooks(), sw_headers(BODY, SW_SECRET, NOW + 301), BODY, [SW_SECRET])


def test_standard_webhooks_v1a_ed25519() -> None:
    private = ed25519.Ed25519PrivateKey.from_private_bytes(b"\x01" * 32)
    raw_public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    public = "whpk_" + base64.b64encode(raw_public).decode()
    signed = f"msg_1.{NOW}.".encode() + BODY
    signature = base64.b64encode(private.sign(signed)).decode()
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(NOW), "webhook-signature": ""}
    headers["webhook-signature"] = f"v1a,{signature}"
    asymmetric = StandardWebhooks(key_type="asymmetric")
    other = "whpk_" + base64.b64encode(b"\x07" * 32).decode()
    assert check(asymmetric, headers, BODY, [other, public]).secret_index == 1
    with pytest.raises(SignatureMismatchError):
        check(asymmetric, headers, BODY + b"x", [public])
    with pytest.raises(SignatureMismatchError):  # an HMAC secret does not check v1a
        check(StandardWebhooks(), headers, BODY, [SW_SECRET])


def test_standard_webhooks_signing_key_is_refused_as_a_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "whsk_" + base64.b64encode(b"\x01" * 32).decode()
    with pytest.raises(SignatureMismatchError, match="no usable secret"):
        check(StandardWebhooks(), sw_headers(BODY, SW_SECRET), BODY, [secret])
    assert "public key" in caplog.text
    assert secret not in caplog.text


@pytest.mark.parametrize(
    ("signature", "extra", "error"),
    [
        ("v1", {}, MalformedSignatureError),
        ("v1,", {}, MalformedSignatureError),
        (",abc", {}, MalformedSignatureError),
        ("v1,!!!!", {}, MalformedSignatureError),
        ("v1,AAAA", {}, MalformedSignatureError),  # wrong length for HMAC-SHA256
        ("v1a,AAAA", {}, MalformedSignatureError),
        ("v2,AAAA", {}, SignatureMismatchError),
        ("v1,é", {}, MalformedSignatureError),
        (" ".join(["v2,x"] * 17), {}, MalformedSignatureError),
        ("v1," + "A" * 43 + "=", {"webhook-timestamp": "noon"}, MalformedSignatureError),
        ("v1," + "A" * 43 + "=", {"webhook-timestamp": ""}, SignatureMismatchError),
        ("v1," + "A" * 43 + "=", {"webhook-id": "a\tb"}, MalformedSignatureError),
    ],
)
def test_standard_webhooks_malformed_headers(
    signature: str, extra: dict[str, str], error: type[Exception]
) -> None:
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(NOW), "webhook-signature": signature}
    with pytest.raises(error) as caught:
        check(StandardWebhooks(), {**headers, **extra}, BODY, [SW_SECRET])
    assert type(caught.value) is error


# --- Shopify -------------------------------------------------------------------------------


def test_shopify() -> None:
    headers = shopify_headers(BODY, SHOPIFY_SECRET)
    assert check(Shopify(), headers, BODY, ["old", SHOPIFY_SECRET]).delivery_id == "w1"
    with pytest.raises(SignatureMismatchError):
        check(Shopify(), headers, BODY + b"\n", [SHOPIFY_SECRET])
    with pytest.raises(MalformedSignatureError):
        check(Shopify(), {"X-Shopify-Hmac-Sha256": "not base64!"}, BODY, [SHOPIFY_SECRET])
    hex_header = {"X-Shopify-Hmac-Sha256": hmac.new(b"k", BODY, "sha256").hexdigest()}
    with pytest.raises(MalformedSignatureError):  # hex where base64 is expected
        check(Shopify(), hex_header, BODY, [SHOPIFY_SECRET])


# --- Discord -------------------------------------------------------------------------------


def test_discord_accepts_pynacl_signature() -> None:
    headers = discord_headers(BODY)
    assert check(Discord(), headers, BODY, [DISCORD_PUBLIC]).timestamp == NOW


def test_discord_refusals_and_rotation() -> None:
    other = nacl.signing.SigningKey(b"\x09" * 32)
    other_public = other.verify_key.encode(nacl.encoding.HexEncoder).decode()
    headers = discord_headers(BODY)
    assert check(Discord(), headers, BODY, [other_public, DISCORD_PUBLIC]).secret_index == 1
    with pytest.raises(SignatureMismatchError):
        check(Discord(), headers, BODY, [other_public])
    with pytest.raises(SignatureMismatchError):
        check(Discord(), headers, BODY + b" ", [DISCORD_PUBLIC])
    with pytest.raises(StaleRequestError):
        check(Discord(), discord_headers(BODY, timestamp=NOW - 301), BODY, [DISCORD_PUBLIC])
    with pytest.raises(StaleRequestError):
        check(Discord(), discord_headers(BODY, timestamp=NOW + 301), BODY, [DISCORD_PUBLIC])
    with pytest.raises(MalformedSignatureError):
        check(Discord(), {**headers, "X-Signature-Ed25519": "ab" * 32}, BODY, [DISCORD_PUBLIC])
    with pytest.raises(MalformedSignatureError):
        check(Discord(), {**headers, "X-Signature-Timestamp": "x"}, BODY, [DISCORD_PUBLIC])
    with pytest.raises(SignatureMismatchError, match="missing"):
        check(Discord(), {"X-Signature-Ed25519": "ab" * 64}, BODY, [DISCORD_PUBLIC])


# --- PublicKey: Ed25519, RSA, ECDSA ---------------------------------------------------------


def _pem(public: Any) -> str:
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def _der_b64(public: Any) -> str:
    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(der).decode()


def test_ed25519_key_forms() -> None:
    private = ed25519.Ed25519PrivateKey.generate()
    public = private.public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    verifier = PublicKey("X-Sig", algorithm="ed25519", encoding="base64")
    headers = {"X-Sig": base64.b64encode(private.sign(BODY)).decode()}
    for key in (_pem(public), _der_b64(public), raw.hex(), base64.b64encode(raw).decode()):
        assert check(verifier, headers, BODY, [key])
    with pytest.raises(SignatureMismatchError):
        check(verifier, headers, BODY + b".", [raw.hex()])


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.mark.parametrize(
    "pad",
    [
        padding.PKCS1v15(),
        padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH),
        padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.DIGEST_LENGTH),
    ],
    ids=["pkcs1v15", "pss-max-salt", "pss-digest-salt"],
)
def test_rsa_round_trip(rsa_key: rsa.RSAPrivateKey, pad: padding.AsymmetricPadding) -> None:
    algorithm = "rsa-pkcs1v15-sha256" if isinstance(pad, padding.PKCS1v15) else "rsa-pss-sha256"
    verifier = PublicKey("X-Sig", algorithm=algorithm, encoding="base64", timestamp_header="X-Ts")
    signature = rsa_key.sign(str(NOW).encode() + BODY, pad, hashes.SHA256())
    headers = {"X-Sig": base64.b64encode(signature).decode(), "X-Ts": str(NOW)}
    public = rsa_key.public_key()
    assert check(verifier, headers, BODY, [_pem(public)]).timestamp == NOW
    assert check(verifier, headers, BODY, [_der_b64(public)])
    with pytest.raises(SignatureMismatchError):
        check(verifier, headers, BODY + b"!", [_pem(public)])
    with pytest.raises(SignatureMismatchError):
        check(verifier, {**headers, "X-Ts": str(NOW + 1)}, BODY, [_pem(public)])


def test_rsa_padding_is_not_interchangeable(rsa_key: rsa.RSAPrivateKey) -> None:
    signature = rsa_key.sign(BODY, padding.PKCS1v15(), hashes.SHA256())
    headers = {"X-Sig": signature.hex()}
    verifier = PublicKey("X-Sig", algorithm="rsa-pss-sha256")
    with pytest.raises(SignatureMismatchError):
        check(verifier, headers, BODY, [_pem(rsa_key.public_key())])


CURVES = [
    ("ecdsa-p256-sha256", ec.SECP256R1(), hashes.SHA256(), 32),
    ("ecdsa-p384-sha384", ec.SECP384R1(), hashes.SHA384(), 48),
    ("ecdsa-p521-sha512", ec.SECP521R1(), hashes.SHA512(), 66),
]


@pytest.mark.parametrize(
    ("algorithm", "curve", "digest", "size"), CURVES, ids=[curve[0] for curve in CURVES]
)
def test_ecdsa_round_trip(
    algorithm: Any, curve: ec.EllipticCurve, digest: hashes.HashAlgorithm, size: int
) -> None:
    private = ec.generate_private_key(curve)
    public = _pem(private.public_key())
    verifier = PublicKey("X-Sig", algorithm=algorithm, encoding="hex")
    der = private.sign(BODY, ec.ECDSA(digest))
    r, s = decode_dss_signature(der)
    raw = r.to_bytes(size, "big") + s.to_bytes(size, "big")
    for signature in (der, raw):
        assert check(verifier, {"X-Sig": signature.hex()}, BODY, [public])
        with pytest.raises(SignatureMismatchError):
            check(verifier, {"X-Sig": signature.hex()}, BODY[1:], [public])
    # A key on another curve is not usable for this algorithm.
    wrong = _pem(ec.generate_private_key(ec.SECP256K1()).public_key())
    with pytest.raises(SignatureMismatchError, match="no usable secret"):
        check(verifier, {"X-Sig": der.hex()}, BODY, [wrong])
    assert check(verifier, {"X-Sig": der.hex()}, BODY, [wrong, public]).secret_index == 1


def test_sendgrid_round_trip() -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    signature = private.sign(str(NOW).encode() + BODY, ec.ECDSA(hashes.SHA256()))
    headers = {
        "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
        "X-Twilio-Email-Event-Webhook-Timestamp": str(NOW),
    }
    key = _der_b64(private.public_key())  # the form SendGrid shows
    assert check(SendGrid(), headers, BODY, [key], now=NOW + 86_400).timestamp == NOW
    with pytest.raises(StaleRequestError):
        check(SendGrid(tolerance=300), headers, BODY, [key], now=NOW + 86_400)


@pytest.mark.parametrize(
    "secret",
    ["not a key", "-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----", "abcd", "é"],
)
def test_unusable_public_keys_refuse(secret: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="pikku_django.webhooks"):
        with pytest.raises(SignatureMismatchError, match="no usable secret"):
            check(Discord(), discord_headers(BODY), BODY, [secret])
        assert "secret #0 cannot be used" in caplog.text
        assert check(Discord(), discord_headers(BODY), BODY, [secret, DISCORD_PUBLIC])


def test_validate_secret() -> None:
    Discord().validate_secret(DISCORD_PUBLIC)
    StandardWebhooks().validate_secret(SW_SECRET)
    with pytest.raises(ValueError, match="Ed25519"):
        Discord().validate_secret(_pem(ec.generate_private_key(ec.SECP256R1()).public_key()))
    with pytest.raises(ValueError, match="empty"):
        GitHub().validate_secret("  ")
    with pytest.raises(ValueError, match="base64"):
        HMAC("X-Sig", secret_encoding="base64").validate_secret("*not base64*")


def test_public_key_needs_cryptography(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(public_keys_module, "HAS_CRYPTOGRAPHY", False)
    with pytest.raises(ImportError, match=r"pikku-django\[webhooks\]"):
        PublicKey("X-Sig")


# --- generic HMAC, Token, Function ---------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["sha1", "sha256", "sha512"])
@pytest.mark.parametrize("encoding", ["hex", "base64"])
@pytest.mark.parametrize("secret_encoding", ["utf8", "base64", "hex"])
def test_generic_hmac(algorithm: Any, encoding: Any, secret_encoding: Any) -> None:
    key = b"\x00raw key \xff bytes"
    secret = {
        "utf8": "plain text key",
        "base64": base64.b64encode(key).decode(),
        "hex": key.hex(),
    }[secret_encoding]
    key_bytes = secret.encode() if secret_encoding == "utf8" else key
    digest = hmac.new(key_bytes, BODY, algorithm).digest()
    value = digest.hex() if encoding == "hex" else base64.b64encode(digest).decode()
    verifier = HMAC(
        "X-Sig",
        prefix="mac=",
        algorithm=algorithm,
        encoding=encoding,
        secret_encoding=secret_encoding,
    )
    assert check(verifier, {"X-Sig": f"mac={value}"}, BODY, [secret])
    with pytest.raises(SignatureMismatchError):
        check(verifier, {"X-Sig": f"mac={value}"}, BODY + b"x", [secret])


def test_generic_hmac_url_safe_unpadded_base64() -> None:
    digest = hmac.new(b"k", b"\xfb\xff", "sha256").digest()
    value = base64.urlsafe_b64encode(digest).decode().rstrip("=")
    assert check(HMAC("X-Sig", encoding="base64"), {"X-Sig": value}, b"\xfb\xff", ["k"])


def test_bad_configuration_is_refused_at_declaration() -> None:
    with pytest.raises(ValueError, match="algorithm"):
        HMAC("X-Sig", algorithm="md5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="encoding"):
        HMAC("X-Sig", encoding="base32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="algorithm"):
        PublicKey("X-Sig", algorithm="dsa")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timestamp_header"):
        PublicKey("X-Sig", tolerance=300)
    with pytest.raises(ValueError, match="tolerance"):
        Stripe(tolerance=0)
    with pytest.raises(ValueError, match="tolerance"):
        Slack(tolerance=-1)
    with pytest.raises(TypeError):
        Function("not callable")  # type: ignore[arg-type]


def test_token() -> None:
    verifier = Token("Authorization", prefix="Bearer ")
    assert check(verifier, {"authorization": "bearer s3cret"}, b"", ["old", "s3cret"])
    for value in ("Bearer s3cre", "Bearer s3cret!", "Bearer ésecret", "Bearer \udcff"):
        with pytest.raises(SignatureMismatchError):
            check(verifier, {"Authorization": value}, b"", ["s3cret"])
    with pytest.raises(MalformedSignatureError):
        check(verifier, {"Authorization": "Basic s3cret"}, b"", ["s3cret"])
    with pytest.raises(MalformedSignatureError):
        check(verifier, {"Authorization": "Bearer "}, b"", ["s3cret"])


def test_function(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str | None, bytes, str]] = []

    def fn(request: WebhookRequest, secret: str) -> bool:
        seen.append((request.headers.get("x-client-state"), request.body, secret))
        return request.headers.get("X-Client-State") == secret

    verifier = Function(fn, delivery_id_header="X-Id")
    headers = {"X-CLIENT-STATE": "state-2", "x-id": "n-1"}
    result = check(verifier, headers, BODY, ["state-1", "state-2"])
    assert result == VerifiedRequest(delivery_id="n-1", secret_index=1)
    assert seen == [("state-2", BODY, "state-1"), ("state-2", BODY, "state-2")]
    with pytest.raises(SignatureMismatchError):
        check(verifier, {"X-Client-State": "nope"}, BODY, ["state-1"])

    def boom(request: WebhookRequest, secret: str) -> bool:
        raise RuntimeError("bug in the check")

    with pytest.raises(SignatureMismatchError):
        check(Function(boom), {}, BODY, ["s"])
    assert "raised" in caplog.text

    def truthy(request: WebhookRequest, secret: str) -> bool:
        return "yes"  # type: ignore[return-value]

    with pytest.raises(SignatureMismatchError):
        check(Function(truthy), {}, BODY, ["s"])
    assert "not a bool" in caplog.text


def test_repr_holds_no_secret() -> None:
    assert repr(Stripe()) == "Stripe(tolerance=300)"
    assert repr(GitHub()) == "GitHub()"
    assert repr(Discord(tolerance=None)) == "Discord(tolerance=None)"
    assert repr(HMAC("X-Sig", prefix="v=")) == (
        "HMAC(header='X-Sig', prefix='v=', algorithm='sha256', encoding='hex', "
        "secret_encoding='utf8', exact_case=False)"
    )


def test_verified_request_is_frozen() -> None:
    result = VerifiedRequest(delivery_id="d")
    with pytest.raises(AttributeError):
        result.delivery_id = "other"  # type: ignore[misc]


def test_public_key_from_certificate_and_type_checks(rsa_key: rsa.RSAPrivateKey) -> None:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhooks.example")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(rsa_key.public_key())
        .serial_number(1)
        .not_valid_before(datetime(2024, 1, 1, tzinfo=UTC))
        .not_valid_after(datetime(2034, 1, 1, tzinfo=UTC))
        .sign(rsa_key, hashes.SHA256())
    )
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode()
    verifier = PublicKey("X-Sig", algorithm="rsa-pkcs1v15-sha256", encoding="base64")
    signature = rsa_key.sign(BODY, padding.PKCS1v15(), hashes.SHA256())
    headers = {"X-Sig": base64.b64encode(signature).decode()}
    assert check(verifier, headers, BODY, [pem])
    with pytest.raises(ValueError, match="not an RSA public key"):
        verifier.validate_secret(P256_PUBLIC)
    with pytest.raises(MalformedSignatureError, match="too long"):
        check(verifier, {"X-Sig": base64.b64encode(b"x" * 1025).decode()}, BODY, [pem])


def test_standard_webhooks_unusable_secrets() -> None:
    verifier = StandardWebhooks()
    for secret in ("whsec_", "whsec_***"):
        with pytest.raises(ValueError, match=r"empty|base64"):
            verifier.validate_secret(secret)
    short = "whpk_" + base64.b64encode(b"short").decode()
    with pytest.raises(ValueError, match="32 bytes"):
        StandardWebhooks(key_type="asymmetric").validate_secret(short)


def test_function_sees_a_read_only_case_insensitive_mapping() -> None:
    seen: dict[str, str] = {}

    def fn(request: WebhookRequest, secret: str) -> bool:
        seen.update(request.headers)
        return len(request.headers) == 2 and request.headers.get(1) is None  # type: ignore[call-overload]

    assert check(Function(fn), {"X-A": "1", "x-b": "2", 3: "ignored"}, b"", ["s"])  # type: ignore[dict-item]
    assert seen == {"X-A": "1", "x-b": "2"}


# --- properties: any input either returns or raises a WebhookVerificationError -------------

ED_PRIVATE = ed25519.Ed25519PrivateKey.from_private_bytes(b"\x02" * 32)
ED_PUBLIC_HEX = (
    ED_PRIVATE.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
).hex()
P256_PUBLIC = _pem(ec.derive_private_key(12345, ec.SECP256R1()).public_key())


def _token_fn(request: WebhookRequest, secret: str) -> bool:
    return hmac.compare_digest(request.headers.get("X-Token", ""), secret)


#: Every verifier with valid secrets of its kind.
VERIFIERS: list[tuple[str, Verifier[Any], list[str]]] = [
    ("github", GitHub(), [GITHUB_SECRET, "second"]),
    ("stripe", Stripe(), [STRIPE_SECRET]),
    ("stripe-no-window", Stripe(tolerance=None), [STRIPE_SECRET]),
    ("slack", Slack(), [SLACK_SECRET]),
    (
        "standard",
        StandardWebhooks(),
        [SW_SECRET, "whpk_" + base64.b64encode(b"\x03" * 32).decode()],
    ),
    ("shopify", Shopify(), [SHOPIFY_SECRET]),
    ("discord", Discord(), [DISCORD_PUBLIC]),
    ("sendgrid", SendGrid(), [P256_PUBLIC]),
    ("hmac-sha1-b64", HMAC("X-Sig", algorithm="sha1", encoding="base64"), ["k"]),
    ("hmac-sha512-hexkey", HMAC("X-Sig", algorithm="sha512", secret_encoding="hex"), ["00ff"]),
    ("token", Token("X-Token"), ["a-token-nobody-guesses"]),
    ("ed25519", PublicKey("X-Sig", timestamp_header="X-Ts", tolerance=60), [ED_PUBLIC_HEX]),
    ("p256", PublicKey("X-Sig", algorithm="ecdsa-p256-sha256", encoding="base64"), [P256_PUBLIC]),
    ("function", Function(_token_fn), ["a-token-nobody-guesses"]),
]
HEADER_NAMES = sorted(
    {
        "X-Hub-Signature-256",
        "X-GitHub-Delivery",
        "Stripe-Signature",
        "X-Slack-Signature",
        "X-Slack-Request-Timestamp",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "svix-id",
        "svix-timestamp",
        "svix-signature",
        "X-Shopify-Hmac-Sha256",
        "X-Shopify-Webhook-Id",
        "X-Signature-Ed25519",
        "X-Signature-Timestamp",
        "X-Twilio-Email-Event-Webhook-Signature",
        "X-Twilio-Email-Event-Webhook-Timestamp",
        "X-Sig",
        "X-Ts",
        "X-Token",
    }
)
hex_text = st.text(alphabet="0123456789abcdefABCDEF", max_size=140)
b64_text = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_", max_size=100
)
timestamps = st.integers(min_value=NOW - 400, max_value=NOW + 400).map(str)
signature_values = st.one_of(
    st.text(max_size=80),
    hex_text,
    b64_text,
    timestamps,
    st.builds(lambda h: f"sha256={h}", hex_text),
    st.builds(lambda h: f"v0={h}", hex_text),
    st.builds(lambda t, h: f"t={t},v1={h}", timestamps, hex_text),
    st.builds(
        lambda t, hs: f"t={t}," + ",".join(f"v1={h}" for h in hs), timestamps, st.lists(hex_text)
    ),
    st.builds(lambda v, b: f"{v},{b}", st.sampled_from(["v1", "v1a", "v2"]), b64_text),
    st.builds(lambda b: " ".join(f"v1,{x}" for x in b), st.lists(b64_text, max_size=20)),
    st.just("x" * (MAX_HEADER_LENGTH + 1)),
    st.binary(max_size=8).map(lambda b: b.decode("latin-1")),
)
header_dicts = st.dictionaries(
    st.one_of(
        st.sampled_from(HEADER_NAMES),
        st.sampled_from(HEADER_NAMES).map(str.lower),
        st.sampled_from(HEADER_NAMES).map(str.upper),
        st.text(max_size=20),
    ),
    signature_values,
    max_size=8,
)


@pytest.mark.parametrize(("name", "verifier", "secrets"), VERIFIERS, ids=[v[0] for v in VERIFIERS])
@settings(max_examples=150, deadline=None)
@given(headers=header_dicts, body=st.binary(max_size=200))
def test_random_headers_are_never_accepted(
    name: str, verifier: Verifier[Any], secrets: list[str], headers: dict[str, str], body: bytes
) -> None:
    with pytest.raises(WebhookVerificationError):
        verifier.verify(headers, body, secrets, now=NOW)


@pytest.mark.parametrize("verifier", [v[1] for v in VERIFIERS], ids=[v[0] for v in VERIFIERS])
@settings(max_examples=30, deadline=None)
@given(
    headers=st.dictionaries(st.sampled_from(HEADER_NAMES), st.none() | st.integers() | st.binary()),
    secrets=st.lists(st.text(max_size=30), max_size=3),
)
def test_odd_values_and_random_secrets_are_never_accepted(
    verifier: Verifier[Any], secrets: list[str], headers: dict[str, Any]
) -> None:
    with pytest.raises(WebhookVerificationError):
        verifier.verify(headers, BODY, secrets, now=NOW)


def _hex(size: int) -> st.SearchStrategy[str]:
    return st.binary(min_size=size, max_size=size).map(bytes.hex)


def _b64(size: int) -> st.SearchStrategy[str]:
    return st.binary(min_size=size, max_size=size).map(lambda b: base64.b64encode(b).decode())


def _headers(**values: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, str]]:
    return st.fixed_dictionaries({name.replace("_", "-"): value for name, value in values.items()})


in_window = st.integers(min_value=NOW - 60, max_value=NOW + 60).map(str)
stripe_values = st.builds(
    lambda t, sigs: f"t={t}," + ",".join(f"v1={sig}" for sig in sigs),
    in_window,
    st.lists(_hex(32), min_size=1, max_size=4),
)
sw_values = st.lists(
    st.one_of(_b64(32).map("v1,".__add__), _b64(64).map("v1a,".__add__)), min_size=1, max_size=4
).map(" ".join)
ecdsa_values = st.one_of(_b64(64), st.integers(min_value=68, max_value=72).flatmap(_b64))
printable = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=40)

#: Headers shaped exactly as each verifier expects, with random signatures.
WELL_FORMED: dict[str, st.SearchStrategy[dict[str, str]]] = {
    "github": _headers(
        X_Hub_Signature_256=_hex(32).map("sha256=".__add__), X_GitHub_Delivery=printable
    ),
    "stripe": _headers(Stripe_Signature=stripe_values),
    "stripe-no-window": _headers(Stripe_Signature=stripe_values),
    "slack": _headers(
        X_Slack_Signature=_hex(32).map("v0=".__add__), X_Slack_Request_Timestamp=in_window
    ),
    "standard": st.one_of(
        _headers(
            webhook_id=printable.filter(bool),
            webhook_timestamp=in_window,
            webhook_signature=sw_values,
        ),
        _headers(
            svix_id=printable.filter(bool), svix_timestamp=in_window, svix_signature=sw_values
        ),
    ),
    "shopify": _headers(X_Shopify_Hmac_Sha256=_b64(32), X_Shopify_Webhook_Id=printable),
    "discord": _headers(X_Signature_Ed25519=_hex(64), X_Signature_Timestamp=in_window),
    "sendgrid": _headers(
        X_Twilio_Email_Event_Webhook_Signature=ecdsa_values,
        X_Twilio_Email_Event_Webhook_Timestamp=in_window,
    ),
    "hmac-sha1-b64": _headers(X_Sig=_b64(20)),
    "hmac-sha512-hexkey": _headers(X_Sig=_hex(64)),
    "token": _headers(X_Token=st.text(min_size=1).filter(str.strip)),
    "ed25519": _headers(X_Sig=_hex(64), X_Ts=in_window),
    "p256": _headers(X_Sig=ecdsa_values),
    "function": _headers(X_Token=st.text()),
}


def test_every_verifier_has_a_well_formed_strategy() -> None:
    assert sorted(WELL_FORMED) == sorted(name for name, _, _ in VERIFIERS)


@pytest.mark.parametrize(("name", "verifier", "secrets"), VERIFIERS, ids=[v[0] for v in VERIFIERS])
@settings(max_examples=100, deadline=None)
@given(data=st.data(), body=st.binary(max_size=200))
def test_well_formed_forgeries_are_mismatches(
    name: str, verifier: Verifier[Any], secrets: list[str], data: st.DataObject, body: bytes
) -> None:
    headers = data.draw(WELL_FORMED[name])
    with pytest.raises(SignatureMismatchError) as caught:
        verifier.verify(headers, body, secrets, now=NOW)
    assert type(caught.value) is SignatureMismatchError  # parsed, checked, refused


texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200)
secret_texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1).filter(
    str.strip
)

SIGNERS: dict[str, tuple[Verifier[Any], Callable[[bytes, str], dict[str, str]]]] = {
    "github": (GitHub(), github_headers),
    "stripe": (Stripe(), lambda body, secret: stripe_headers(body, "whsec_" + secret)),
    "slack": (Slack(), slack_headers),
    "shopify": (Shopify(), shopify_headers),
}


@pytest.mark.parametrize("provider", sorted(SIGNERS))
@settings(max_examples=60, deadline=None)
@given(text=texts, secret=secret_texts, flip=st.integers(min_value=0))
def test_signed_bodies_round_trip_and_any_changed_byte_is_refused(
    provider: str, text: str, secret: str, flip: int
) -> None:
    verifier, sign = SIGNERS[provider]
    secrets = ["whsec_" + secret] if provider == "stripe" else [secret]
    body = text.encode()
    headers = sign(body, secret)
    assert check(verifier, headers, body, secrets)
    tampered = bytearray(body + b"\x00")
    tampered[flip % len(tampered)] ^= 0x01
    with pytest.raises(SignatureMismatchError):
        check(verifier, headers, bytes(tampered), secrets)


@settings(max_examples=60, deadline=None)
@given(
    text=texts,
    key=st.binary(min_size=24, max_size=64),
    msg_id=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=40),
    offset=st.integers(min_value=-300, max_value=300),
)
def test_standard_webhooks_library_round_trip(
    text: str, key: bytes, msg_id: str, offset: int
) -> None:
    secret = "whsec_" + base64.b64encode(key).decode()
    body = text.encode()
    headers = sw_headers(body, secret, timestamp=NOW + offset, msg_id=msg_id)
    result = check(StandardWebhooks(), headers, body, [secret])
    assert (result.delivery_id, result.timestamp) == (msg_id, NOW + offset)
    with pytest.raises(SignatureMismatchError):
        check(StandardWebhooks(), headers, body + b" ", [secret])
