"""Verifiers for well-known webhook providers.

Each is a :class:`~pikku_django.webhooks.verify.Verifier`; the secret passed to
``verify`` is the one the provider shows (signing secret, app secret or public key).
What each signs decides how its replays are refused
(:attr:`~pikku_django.webhooks.verify.Verifier.replay_guard`): GitHub, Shopify and
SendGrid without a window sign no timestamp checked against one, so each signed body
is accepted once per source; the others refuse a replay outside their window.

``GitHub`` and ``Stripe`` can also register their source with the provider, when told
where (see :mod:`~pikku_django.webhooks.providers`): the source then takes its
``check``, ``setup`` and ``teardown`` from the preset's ``registration``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pikku_django.webhooks._public_keys import (
    HAS_CRYPTOGRAPHY,
    load_public_key,
    verify_public_key_signature,
)
from pikku_django.webhooks.providers import DEFAULT_TIMEOUT as PROVIDER_TIMEOUT
from pikku_django.webhooks.providers import GitHubRegistration, StripeRegistration
from pikku_django.webhooks.signatures import (
    Headers,
    MalformedSignatureError,
    SignatureFormat,
    SignedMessage,
    check_delivery_id,
    check_tolerance,
    collect_signatures,
    decode_base64,
    decode_signature,
    parse_timestamp,
)
from pikku_django.webhooks.verify import HMAC, PublicKey, Verifier, hmac_matches

__all__ = [
    "Discord",
    "GitHub",
    "SendGrid",
    "Shopify",
    "Slack",
    "StandardWebhooks",
    "Stripe",
]

DEFAULT_TOLERANCE = 300

#: The key types a Standard Webhooks source may declare.
StandardKeyType = Literal["symmetric", "asymmetric"]
STANDARD_KEY_TYPES: tuple[str, ...] = ("symmetric", "asymmetric")


class GitHub(HMAC):
    """GitHub: ``X-Hub-Signature-256: sha256=<hex>`` over the body.

    Only lower-case hex after a lower-case ``sha256=`` matches, as GitHub's own
    check compares the text. The delivery id (``X-GitHub-Delivery``) is not
    covered by the signature and nothing dates it, so each signed body is accepted
    once per source.

    With ``repository="owner/repo"`` (or ``organization="org"``) and
    ``token_credential=`` (the credential holding a token allowed to manage its
    webhooks), enabling the source registers its webhook through GitHub's API
    (``api_url`` for GitHub Enterprise: ``https://HOST/api/v3``) for ``events``
    (default: the source's events; ``["*"]`` when it declares none).
    """

    def __init__(
        self,
        *,
        repository: str | None = None,
        organization: str | None = None,
        token_credential: str | None = None,
        events: Sequence[str] | None = None,
        api_url: str = "https://api.github.com",
        timeout: float = PROVIDER_TIMEOUT,
    ) -> None:
        super().__init__(
            "X-Hub-Signature-256",
            prefix="sha256=",
            algorithm="sha256",
            encoding="hex",
            exact_case=True,
            delivery_id_header="X-GitHub-Delivery",
        )
        #: How the source registers itself (``repository=``/``organization=``), or None.
        self.registration: GitHubRegistration | None = None
        if repository is not None or organization is not None or token_credential is not None:
            if token_credential is None:
                raise ValueError("GitHub(repository=/organization=) needs token_credential=")
            self.registration = GitHubRegistration(
                repository=repository,
                organization=organization,
                token_credential=token_credential,
                events=events,
                api_url=api_url,
                timeout=timeout,
            )
        elif events is not None:
            raise ValueError("GitHub(events=) is for registration: give repository= too")

    def __repr__(self) -> str:
        if self.registration is None:
            return "GitHub()"
        return f"GitHub(registration={self.registration!r})"


class Shopify(HMAC):
    """Shopify: ``X-Shopify-Hmac-Sha256: <base64>`` over the body, keyed by the app secret.

    The delivery id (``X-Shopify-Webhook-Id``) is not covered by the signature and
    nothing dates it, so each signed body is accepted once per source.
    """

    def __init__(self) -> None:
        super().__init__(
            "X-Shopify-Hmac-Sha256",
            algorithm="sha256",
            encoding="base64",
            delivery_id_header="X-Shopify-Webhook-Id",
        )

    def __repr__(self) -> str:
        return "Shopify()"


class Discord(PublicKey):
    """Discord interactions: Ed25519 over timestamp + body; the secret is the hex public key."""

    def __init__(self, tolerance: int | None = DEFAULT_TOLERANCE) -> None:
        super().__init__(
            "X-Signature-Ed25519",
            algorithm="ed25519",
            encoding="hex",
            timestamp_header="X-Signature-Timestamp",
            tolerance=tolerance,
        )

    def __repr__(self) -> str:
        return f"Discord(tolerance={self.tolerance!r})"


class SendGrid(PublicKey):
    """SendGrid (Twilio) event webhook: ECDSA P-256 over timestamp + body, base64.

    The secret is the verification key SendGrid shows (base64 DER, or PEM).
    No replay window unless ``tolerance`` is given; without one, each signed
    timestamp and body is accepted once per source.
    """

    def __init__(self, tolerance: int | None = None) -> None:
        super().__init__(
            "X-Twilio-Email-Event-Webhook-Signature",
            algorithm="ecdsa-p256-sha256",
            encoding="base64",
            timestamp_header="X-Twilio-Email-Event-Webhook-Timestamp",
            tolerance=tolerance,
        )

    def __repr__(self) -> str:
        return f"SendGrid(tolerance={self.tolerance!r})"


class Stripe(Verifier[bytes]):
    """Stripe: ``Stripe-Signature: t=<ts>,v1=<hex>[,v1=<hex>...]`` over ``{t}.{body}``.

    As Stripe's library does, items of other schemes and malformed items are
    skipped, any ``v1`` may match, and only lower-case hex matches. The
    ``whsec_...`` secret is the HMAC key as it is (UTF-8), not decoded. Stripe
    puts the event id in the body, so there is no delivery id here.

    With ``secret_key_credential=`` (the credential holding the account's secret key),
    enabling the source makes its webhook endpoint through Stripe's API for ``events``
    (default: the source's events) and stores the signing secret Stripe returns.
    """

    header = "Stripe-Signature"
    signs_timestamp = True
    formats: ClassVar[dict[str, SignatureFormat]] = {
        "v1": SignatureFormat("hex", 32, lower_hex=True)
    }

    def __init__(
        self,
        tolerance: int | None = DEFAULT_TOLERANCE,
        *,
        secret_key_credential: str | None = None,
        events: Sequence[str] | None = None,
        api_url: str = "https://api.stripe.com",
        api_version: str | None = None,
        timeout: float = PROVIDER_TIMEOUT,
    ) -> None:
        self.tolerance = check_tolerance(tolerance)
        #: How the source registers itself (``secret_key_credential=``), or None.
        self.registration: StripeRegistration | None = None
        if secret_key_credential is not None:
            self.registration = StripeRegistration(
                secret_key_credential=secret_key_credential,
                events=events,
                api_url=api_url,
                api_version=api_version,
                timeout=timeout,
            )
        elif events is not None:
            raise ValueError("Stripe(events=) is for registration: give secret_key_credential=")

    def _parse(self, headers: Headers, body: bytes) -> SignedMessage:
        raw_timestamp: str | None = None
        entries: list[tuple[str, str]] = []
        for item in headers.require(self.header).split(","):
            name, sep, field = (part.strip() for part in item.partition("="))
            if name != "t":
                if name or sep or field:  # not a stray comma
                    entries.append((name if sep else "", field))
            elif raw_timestamp is not None:
                raise MalformedSignatureError(f"the {self.header} header has two t=")
            else:
                raw_timestamp = field
        if raw_timestamp is None:
            raise MalformedSignatureError(f"the {self.header} header has no t=")
        timestamp = parse_timestamp(raw_timestamp, f"t= in the {self.header} header")
        signatures = collect_signatures(entries, self.formats, f"the {self.header} header")
        return SignedMessage(
            message=raw_timestamp.encode("ascii") + b"." + body,
            signatures=signatures,
            timestamp=timestamp,
        )

    def _load_key(self, secret: str) -> bytes:
        return secret.encode("utf-8")

    def _matches(self, signed: SignedMessage, key: bytes) -> bool:
        return hmac_matches(key, signed)


class Slack(Verifier[bytes]):
    """Slack: ``X-Slack-Signature: v0=<hex>`` over ``v0:{ts}:{body}``.

    Only lower-case hex matches, as the Slack SDK compares the text. The timestamp
    is ``X-Slack-Request-Timestamp``; the secret is the app's signing secret.
    """

    header = "X-Slack-Signature"
    timestamp_header = "X-Slack-Request-Timestamp"
    signs_timestamp = True

    def __init__(self, tolerance: int | None = DEFAULT_TOLERANCE) -> None:
        self.tolerance = check_tolerance(tolerance)

    def _parse(self, headers: Headers, body: bytes) -> SignedMessage:
        value = headers.require(self.header)
        raw_timestamp = headers.require(self.timestamp_header)
        what = f"the {self.header} header"
        version, sep, hex_signature = value.partition("=")
        if not sep or version != "v0":
            raise MalformedSignatureError(f"{what} is not a v0= signature")
        signature = decode_signature(hex_signature, "hex", what, lower_hex=True)
        if len(signature) != 32:
            raise MalformedSignatureError(f"{what} is not a SHA-256 HMAC")
        timestamp = parse_timestamp(raw_timestamp, f"the {self.timestamp_header} header")
        return SignedMessage(
            message=b"v0:" + raw_timestamp.encode("ascii") + b":" + body,
            signatures=(("v0", signature),),
            timestamp=timestamp,
        )

    def _load_key(self, secret: str) -> bytes:
        return secret.encode("utf-8")

    def _matches(self, signed: SignedMessage, key: bytes) -> bool:
        return hmac_matches(key, signed)


class StandardWebhooks(Verifier[Any]):
    """Standard Webhooks (and Svix): ``{id}.{timestamp}.{body}`` signed as ``v1,<b64>``.

    Headers ``webhook-id``/``-timestamp``/``-signature``, or Svix's ``svix-*`` ones.
    The source declares its key type, never read from the secret's text:
    ``key_type="symmetric"`` (the default) checks ``v1`` HMAC-SHA256 signatures with
    a ``whsec_<base64>`` secret (prefix optional); ``key_type="asymmetric"`` checks
    ``v1a`` Ed25519 ones with a ``whpk_<base64>`` public key (prefix optional). Each
    refuses the other's values. Entries of other versions and malformed entries are
    skipped, as the library skips them. The delivery id is ``webhook-id``, which the
    signature covers.
    """

    formats: ClassVar[dict[str, SignatureFormat]] = {
        "v1": SignatureFormat("base64", 32),
        "v1a": SignatureFormat("base64", 64),
    }
    signs_timestamp = True

    def __init__(
        self,
        tolerance: int | None = DEFAULT_TOLERANCE,
        *,
        key_type: StandardKeyType = "symmetric",
    ) -> None:
        self.tolerance = check_tolerance(tolerance)
        if key_type not in STANDARD_KEY_TYPES:
            raise ValueError(f"key_type must be 'symmetric' or 'asymmetric'; got {key_type!r}")
        self.key_type = key_type
        if key_type == "asymmetric" and not HAS_CRYPTOGRAPHY:
            raise ValueError("StandardWebhooks(key_type='asymmetric') needs 'cryptography'")

    def _parse(self, headers: Headers, body: bytes) -> SignedMessage:
        prefix = "webhook-"
        if headers.get("webhook-signature") is None and headers.get("svix-signature"):
            prefix = "svix-"
        value = headers.require(f"{prefix}signature")
        raw_id = headers.require(f"{prefix}id")
        raw_timestamp = headers.require(f"{prefix}timestamp")
        entries = [
            (v if sep else "", text) for v, sep, text in (e.partition(",") for e in value.split())
        ]
        delivery_id = check_delivery_id(raw_id, f"the {prefix}id header")
        timestamp = parse_timestamp(raw_timestamp, f"the {prefix}timestamp header")
        signatures = collect_signatures(entries, self.formats, f"the {prefix}signature header")
        message = b"%s.%s.%s" % (
            raw_id.encode("utf-8", "surrogatepass"),
            raw_timestamp.encode(),
            body,
        )
        return SignedMessage(
            message=message,
            signatures=signatures,
            timestamp=timestamp,
            delivery_id=delivery_id,
        )

    def _load_key(self, secret: str) -> Any:
        secret = secret.strip()
        if secret.startswith("whsk_"):
            raise ValueError("this is the signing key; set its public key (whpk_...) instead")
        if self.key_type == "asymmetric":
            return self._public_key(secret)
        if secret.startswith("whpk_"):
            raise ValueError(
                "this is a public key (whpk_...), and the source declares symmetric "
                "(whsec_) secrets; declare StandardWebhooks(key_type='asymmetric') to "
                "check Ed25519 signatures with it"
            )
        try:
            key = decode_base64(secret.removeprefix("whsec_"))
        except ValueError:
            raise ValueError("the secret is not whsec_ followed by base64") from None
        if not key:
            raise ValueError("the secret is empty")
        return key

    def _public_key(self, secret: str) -> Any:
        """The Ed25519 public key of a ``whpk_`` value (the prefix is optional)."""
        if secret.startswith("whsec_"):
            raise ValueError(
                "this is an HMAC secret (whsec_...), and the source declares asymmetric "
                "(whpk_) public keys; set the sender's Ed25519 public key instead"
            )
        try:
            raw = decode_base64(secret.removeprefix("whpk_"))
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise ValueError("a whpk_ public key must be 32 bytes of base64")
        return load_public_key(raw.hex(), "ed25519")

    def _matches(self, signed: SignedMessage, key: Any) -> bool:
        if self.key_type == "symmetric":
            return hmac_matches(key, signed, "sha256", scheme="v1")
        return any(
            verify_public_key_signature(key, "ed25519", sig, signed.message)
            for version, sig in signed.signatures
            if version == "v1a"
        )

    def __repr__(self) -> str:
        return f"StandardWebhooks(tolerance={self.tolerance!r}, key_type={self.key_type!r})"
