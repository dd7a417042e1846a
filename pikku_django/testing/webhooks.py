"""Sign webhook requests the way each provider does, for your own tests.

One signer per preset of :mod:`pikku_django.webhooks.presets`. A signer holds the
provider's side of the secret and gives your source the other side in
:attr:`WebhookSigner.secret` (the value to store as the source's credential): the same
shared secret for the HMAC schemes, the public key for Discord, SendGrid and Standard
Webhooks' Ed25519 keys, whose private key the signer generates.

::

    signer = StripeSigner()
    set_credential("stripeWebhookSecret", signer.secret)
    response = signer.post(client, "/pikku/webhooks/stripe/", {"id": "evt_1", ...})

:meth:`WebhookSigner.headers` gives the headers alone, for a request you build yourself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DiscordSigner",
    "GitHubSigner",
    "SendGridSigner",
    "ShopifySigner",
    "SlackSigner",
    "StandardWebhooksSigner",
    "StripeSigner",
    "WebhookSigner",
    "encode_body",
]

Body = bytes | str | Mapping[str, Any] | list[Any]


def encode_body(body: Body) -> bytes:
    """The request body as bytes: bytes as they are, text as UTF-8, anything else as JSON."""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    except ImportError as exc:  # pragma: no cover - the webhooks extra is missing
        raise ImportError(
            "signing with a public-key scheme needs the 'cryptography' package: "
            "pip install 'pikku-django[webhooks]'"
        ) from exc
    return ec, ed25519


class WebhookSigner(ABC):
    """Signs request bodies as one provider does."""

    #: The value to store as the source's credential (a shared secret or a public key).
    secret: str

    def headers(
        self,
        body: Body,
        *,
        timestamp: int | None = None,
        delivery_id: str | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The headers the provider sends with ``body``.

        ``timestamp`` (epoch seconds) defaults to now; ``delivery_id`` to a new UUID,
        for schemes that send one; ``extra`` headers are added as they are.
        """
        signed = self._sign(
            encode_body(body),
            int(time.time()) if timestamp is None else timestamp,
            delivery_id or str(uuid.uuid4()),
        )
        return {**signed, **(extra or {})}

    def post(
        self,
        client: Any,
        path: str,
        body: Body,
        *,
        content_type: str = "application/json",
        timestamp: int | None = None,
        delivery_id: str | None = None,
        extra: Mapping[str, str] | None = None,
        **options: Any,
    ) -> Any:
        """POST ``body`` to ``path`` with a Django test ``client``, signed; the response.

        ``timestamp``, ``delivery_id`` and ``extra`` are as for :meth:`headers`; other
        options go to ``client.post``.
        """
        data = encode_body(body)
        headers = self.headers(data, timestamp=timestamp, delivery_id=delivery_id, extra=extra)
        return client.post(path, data, content_type=content_type, headers=headers, **options)

    @abstractmethod
    def _sign(self, body: bytes, timestamp: int, delivery_id: str) -> dict[str, str]:
        """The provider's signature headers for ``body``."""


class GitHubSigner(WebhookSigner):
    """GitHub: ``X-Hub-Signature-256`` over the body, ``X-GitHub-Delivery``, and the event.

    ``event`` is sent as ``X-GitHub-Event`` (GitHub names the event in a header).
    """

    def __init__(self, secret: str | None = None, *, event: str | None = None) -> None:
        self.secret = secret or secrets.token_hex(20)
        self.event = event

    def _sign(self, body: bytes, timestamp: int, delivery_id: str) -> dict[str, str]:
        headers = {
            "X-Hub-Signature-256": "sha256=" + _hmac(self.secret.encode(), body).hex(),
            "X-GitHub-Delivery": delivery_id,
        }
        if self.event:
            headers["X-GitHub-Event"] = self.event
        return headers


class StripeSigner(WebhookSigner):
    """Stripe: ``Stripe-Signature: t=<timestamp>,v1=<hex>`` over ``{t}.{body}``."""

    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret or "whsec_" + secrets.token_hex(16)

    def _sign(self, body: bytes, timestamp: int, delivery_id: str) -> dict[str, str]:
        mac = _hmac(self.secret.encode(), f"{timestamp}.".encode() + body)
        return {"Stripe-Signature": f"t={timestamp},v1={mac.hex()}"}


class SlackSigner(WebhookSigner):
    """Slack: ``X-Slack-Signature: v0=<hex>`` over ``v0:{ts}:{body}``."""

    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret or secrets.token_hex(16)

    def _sign(self, body: bytes, timestamp: int, delivery_id: str) -> dict[str, str]:
        mac = _hmac(self.secret.encode(), f"v0:{timestamp}:".encode() + body)
        return {"X-Slack-Signature": "v0=" + mac.hex(), "X-Slack-Request-Timestamp": str(timestamp)}


class ShopifySigner(WebhookSigner):
    """Shopify: ``X-Shopify-Hmac-Sha256: <base64>`` over the body, ``X-Shopify-Webhook-Id``."""

    def __init__(self, secret: str | None = None, *, topic: str | None = None) -> None:
        self.secret = secret or secrets.token_hex(16)
        self.topic = topic

    def _sign(self, body: bytes, timestamp: int, delivery_id: str) -> dict[str, str]:
        headers = {
            "X-Shopify-Hmac-Sha256": base64.b64encode(_hmac(self.secret.encode(), body)).decode(),
            "X-Shopify-Webhook-Id": delivery_id,
        }
        if self.topic:
            headers["X-Shopify-Topic"] = self.topic
        return headers


class StandardWebhooksSigner(WebhookSigner):
    """Standard Webhooks (and Svix): ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``.

    With a ``whsec_<base64>`` secret (one is generated when none is given) it signs
    ``v1`` HMAC-SHA256; :meth:`ed25519` makes one that signs ``v1a`` with a new key pair,
    whose ``whpk_`` public key is :attr:`secret`. ``svix=True`` sends Svix's
    ``svix-*`` header names instead.
    """

    def __init__(self, secret: str | None = None, *, svix: bool = False) -> None:
        self.secret = secret or "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        if not self.secret.startswith("whsec_"):
            raise ValueError("a Standard Webhooks HMAC secret starts with whsec_")
        self._private: Any = None
        self.prefix = "svix-" if svix else "webhook-"

    @classmethod
    def ed25519(cls, *, svix: bool = False) -> StandardWebhooksSigner:
        """A signer with a new Ed25519 key pair; :attr:`secret` is its ``whpk_`` key."""
        _, ed25519 = _crypto()
        signer = cls(svix=svix)
        signer._private = ed25519.Ed25519PrivateKey.generate()
        public = signer._private.public_key().public_bytes_raw()
        signer.secret = "whpk_" + base64.b64encode(public).decode()
        return signer

    def _sign(self, body: bytes, timestamp: int, delivery_id: str) -> dict[str, str]:
        message = f"{delivery_id}.{timestamp}.".encode() + body
        if self._private is not None:
            signature = "v1a," + base64.b64encode(self._private.sign(message)).decode()
        else:
            key = base64.b64decode(self.secret.removeprefix("whsec_"))
            signature = "v1," + base64.b64encode(_hmac(key, message)).decode()
        return {
            f"{self.prefix}id": delivery_id,
            f"{self.prefix}timestamp": str(timestamp),
            f"{self.prefix}signature": signature,
        }


class DiscordSigner(WebhookSigner):
    """Discord interactions: Ed25519 over timestamp + body; :attr:`secret` is the hex public key."""

    def __init__(self) -> None:
        _, ed25519 = _crypto()
        self._private = ed25519.Ed25519PrivateKey.generate()
        self.secret = self._private.public_key().public_bytes_raw().hex()

    def _sign(self, body: bytes, timestamp: int, delivery_id: str) -> dict[str, str]:
        signature = self._private.sign(str(timestamp).encode() + body)
        return {"X-Signature-Ed25519": signature.hex(), "X-Signature-Timestamp": str(timestamp)}


class SendGridSigner(WebhookSigner):
    """SendGrid: ECDSA P-256 over timestamp + body; :attr:`secret` is the verification key.

    The key is base64 DER, the form SendGrid shows.
    """

    def __init__(self) -> None:
        ec, _ = _crypto()
        from cryptography.hazmat.primitives import serialization

        self._ec = ec
        self._private = ec.generate_private_key(ec.SECP256R1())
        der = self._private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.secret = base64.b64encode(der).decode()

    def _sign(self, body: bytes, timestamp: int, delivery_id: str) -> dict[str, str]:
        from cryptography.hazmat.primitives import hashes

        signature = self._private.sign(
            str(timestamp).encode() + body, self._ec.ECDSA(hashes.SHA256())
        )
        return {
            "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
            "X-Twilio-Email-Event-Webhook-Timestamp": str(timestamp),
        }
