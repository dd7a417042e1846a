"""Signature verification for inbound webhooks.

A :class:`Verifier` holds how a provider signs its requests (never the secret):
``verifier.verify(request.headers, request.body, secrets)`` returns a
:class:`VerifiedRequest` or raises a :class:`WebhookVerificationError` whose
``status_code`` is the answer to give (400 malformed, 401 refused).

Several secrets mean rotation: the request is accepted when any of them matches.
No secret means refusal, never acceptance.

How a replay of a signed request is told apart follows from what the scheme signs
(:attr:`Verifier.replay_guard`): a signed timestamp checked against a window
refuses it; otherwise the request carries the digest of its signed bytes, which
the view accepts once per source.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, Literal, TypeVar

from pikku_django.webhooks._public_keys import (
    load_public_key,
    require_cryptography,
    verify_public_key_signature,
)
from pikku_django.webhooks.signatures import (
    MAX_DELIVERY_ID_LENGTH,
    MAX_HEADER_LENGTH,
    MAX_SIGNATURES,
    Headers,
    MalformedSignatureError,
    SignatureMismatchError,
    SignedMessage,
    StaleRequestError,
    WebhookRequest,
    WebhookVerificationError,
    check_delivery_id,
    check_tolerance,
    check_window,
    decode_base64,
    decode_hex,
    decode_signature,
    parse_timestamp,
    strip_prefix,
)

__all__ = [
    "HMAC",
    "MAX_DELIVERY_ID_LENGTH",
    "MAX_HEADER_LENGTH",
    "MAX_SIGNATURES",
    "Function",
    "MalformedSignatureError",
    "PublicKey",
    "ReplayGuard",
    "SignatureMismatchError",
    "StaleRequestError",
    "Token",
    "VerifiedRequest",
    "Verifier",
    "WebhookRequest",
    "WebhookVerificationError",
    "verify_request",
]

logger = logging.getLogger("pikku_django.webhooks")


HmacAlgorithm = Literal["sha1", "sha256", "sha512"]
SignatureEncoding = Literal["hex", "base64"]
SecretEncoding = Literal["utf8", "base64", "hex"]
PublicKeyAlgorithm = Literal[
    "ed25519",
    "rsa-pkcs1v15-sha256",
    "rsa-pss-sha256",
    "ecdsa-p256-sha256",
    "ecdsa-p384-sha384",
    "ecdsa-p521-sha512",
]
HMAC_ALGORITHMS: tuple[str, ...] = ("sha1", "sha256", "sha512")
SIGNATURE_ENCODINGS: tuple[str, ...] = ("hex", "base64")
SECRET_ENCODINGS: tuple[str, ...] = ("utf8", "base64", "hex")
PUBLIC_KEY_ALGORITHMS: tuple[str, ...] = (
    "ed25519",
    "rsa-pkcs1v15-sha256",
    "rsa-pss-sha256",
    "ecdsa-p256-sha256",
    "ecdsa-p384-sha384",
    "ecdsa-p521-sha512",
)


class ReplayGuard(Enum):
    """What refuses a replay of a signed request, by what its scheme signs."""

    #: A signed timestamp, refused outside the replay window (``tolerance``).
    WINDOW = "window"
    #: Nothing signed changes between deliveries (no timestamp, or no window): the
    #: signed bytes are accepted once per source, by their digest.
    DIGEST = "digest"
    #: The verifier does not say what it covers (a shared token, a check of your own).
    NONE = "none"


@dataclass(frozen=True, slots=True)
class VerifiedRequest:
    """What a successful verification learnt about the request."""

    #: The provider's id for this delivery (de-duplication key), when the scheme has one.
    delivery_id: str | None = None
    #: The signed timestamp (unix seconds), when the scheme signs one.
    timestamp: int | None = None
    #: Position in ``secrets`` of the secret that matched (rotation bookkeeping).
    secret_index: int = 0
    #: SHA-256 (hex) of the signed bytes, when the scheme's replays are refused by it
    #: (:attr:`ReplayGuard.DIGEST`); None otherwise.
    replay_digest: str | None = None


def _choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _as_body(body: object) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    raise TypeError(f"body must be the raw request bytes (request.body), not {type(body).__name__}")


K = TypeVar("K")


class Verifier(ABC, Generic[K]):
    """How one provider signs its requests.

    Subclasses parse the headers (:meth:`_parse`), turn each secret into a key
    (:meth:`_load_key`, ``ValueError`` when unusable) and check one key
    (:meth:`_matches`); :meth:`verify` does the rest.
    """

    #: Replay window in seconds (both ways) for schemes that sign a timestamp.
    tolerance: int | None = None
    #: Header carrying the provider's delivery id, if not already signed by the scheme.
    delivery_id_header: str | None = None
    #: Whether the signature covers a timestamp (checked against ``tolerance``).
    signs_timestamp: bool = False
    #: Whether the signature covers the request's body (False: a shared token, or a
    #: check whose coverage is not known).
    signs_body: bool = True

    @property
    def replay_guard(self) -> ReplayGuard:
        """What refuses a replay of a request this verifier accepted: the one rule.

        A signed timestamp with a window refuses it; a signed body without one is
        accepted once per source (a delivery id the signature does not cover can be
        changed at will, and even a signed one is forgotten when receipts are pruned).
        """
        if not self.signs_body:
            return ReplayGuard.NONE
        if self.signs_timestamp and self.tolerance is not None:
            return ReplayGuard.WINDOW
        return ReplayGuard.DIGEST

    def verify(
        self,
        headers: Mapping[str, str],
        body: bytes,
        secrets: Sequence[str] | None,
        *,
        now: float | None = None,
    ) -> VerifiedRequest:
        """Verify one request, or raise a :class:`WebhookVerificationError`."""
        body = _as_body(body)
        keys = self._keys(secrets)
        reader = Headers(headers)
        signed = self._parse(reader, body)
        delivery_id = signed.delivery_id
        if delivery_id is None and self.delivery_id_header:
            raw_id = reader.get(self.delivery_id_header)
            if raw_id is not None:
                delivery_id = check_delivery_id(raw_id, f"the {self.delivery_id_header} header")
        for index, key in keys:
            if self._safe_matches(signed, key, index):
                break
        else:
            raise SignatureMismatchError("the signature does not match any secret")
        if signed.timestamp is not None:
            check_window(signed.timestamp, time.time() if now is None else now, self.tolerance)
        digest = None
        if self.replay_guard is ReplayGuard.DIGEST:
            digest = hashlib.sha256(signed.message).hexdigest()
        return VerifiedRequest(
            delivery_id=delivery_id,
            timestamp=signed.timestamp,
            secret_index=index,
            replay_digest=digest,
        )

    def validate_secret(self, secret: str) -> None:
        """Raise ``ValueError`` if this verifier cannot use ``secret``."""
        if not isinstance(secret, str) or not secret.strip():
            raise ValueError("the secret is empty")
        self._load_key(secret)

    @abstractmethod
    def _parse(self, headers: Headers, body: bytes) -> SignedMessage:
        """The request's signature material; raises on malformed or missing headers."""

    @abstractmethod
    def _load_key(self, secret: str) -> K:
        """The key a secret stands for; ``ValueError`` when it cannot be used."""

    @abstractmethod
    def _matches(self, signed: SignedMessage, key: K) -> bool:
        """Whether ``key`` signed ``signed`` (any of its signatures)."""

    def _keys(self, secrets: Sequence[str] | None) -> list[tuple[int, K]]:
        if isinstance(secrets, str | bytes):
            raise TypeError("secrets must be a sequence of secrets, not a single string")
        items = list(secrets or ())
        for secret in items:
            if secret is not None and not isinstance(secret, str):
                raise TypeError(f"a secret must be a str, not {type(secret).__name__}")
        present = [(i, s) for i, s in enumerate(items) if s and s.strip()]
        if not present:
            raise SignatureMismatchError("no secret is set")
        keys: list[tuple[int, K]] = []
        for index, secret in present:
            try:
                keys.append((index, self._load_key(secret)))
            except Exception as exc:
                logger.error("webhook secret #%d cannot be used by %r: %s", index, self, exc)
        if not keys:
            raise SignatureMismatchError("no usable secret is set")
        return keys

    def _safe_matches(self, signed: SignedMessage, key: K, index: int) -> bool:
        try:
            return self._matches(signed, key)
        except Exception:
            logger.warning("checking webhook secret #%d with %r failed", index, self, exc_info=True)
            return False

    def __repr__(self) -> str:
        args = ", ".join(
            f"{name}={value!r}"
            for name, value in vars(self).items()
            if not name.startswith("_") and value is not None
        )
        return f"{type(self).__name__}({args})"


def _decode_secret(secret: str, encoding: str) -> bytes:
    if encoding == "utf8":
        key = secret.encode("utf-8")
    else:
        try:
            decode = decode_hex if encoding == "hex" else decode_base64
            key = decode(secret.strip())
        except ValueError:
            raise ValueError(
                f"the secret is not {encoding} (secret_encoding={encoding!r})"
            ) from None
    if not key:
        raise ValueError("the secret is empty")
    return key


class HMAC(Verifier[bytes]):
    """An HMAC of the raw body in one header, e.g. ``sha256=<hex>``.

    ``exact_case`` matches only the prefix as given and lower-case hex, for
    providers whose own libraries compare the header's text.
    """

    def __init__(
        self,
        header: str,
        *,
        prefix: str = "",
        algorithm: HmacAlgorithm = "sha256",
        encoding: SignatureEncoding = "hex",
        secret_encoding: SecretEncoding = "utf8",  # noqa: S107 - an encoding, not a secret
        exact_case: bool = False,
        delivery_id_header: str | None = None,
    ) -> None:
        self.header = header
        self.prefix = prefix
        self.algorithm = _choice("algorithm", algorithm, HMAC_ALGORITHMS)
        self.encoding = _choice("encoding", encoding, SIGNATURE_ENCODINGS)
        self.secret_encoding = _choice("secret_encoding", secret_encoding, SECRET_ENCODINGS)
        self.exact_case = exact_case
        self.delivery_id_header = delivery_id_header
        self._digest_size = hashlib.new(algorithm).digest_size

    def _parse(self, headers: Headers, body: bytes) -> SignedMessage:
        what = f"the {self.header} header"
        value = strip_prefix(
            headers.require(self.header), self.prefix, self.header, exact_case=self.exact_case
        )
        signature = decode_signature(value, self.encoding, what, lower_hex=self.exact_case)
        if len(signature) != self._digest_size:
            raise MalformedSignatureError(
                f"the {self.header} header is not a {self.algorithm} signature"
            )
        return SignedMessage(message=body, signatures=(("", signature),))

    def _load_key(self, secret: str) -> bytes:
        return _decode_secret(secret, self.secret_encoding)

    def _matches(self, signed: SignedMessage, key: bytes) -> bool:
        return hmac_matches(key, signed, self.algorithm)


def hmac_matches(
    key: bytes, signed: SignedMessage, algorithm: str = "sha256", scheme: str | None = None
) -> bool:
    """Whether any signature (of ``scheme``, if given) is the HMAC of the signed bytes."""
    expected = hmac.digest(key, signed.message, algorithm)
    return any(
        hmac.compare_digest(expected, signature)
        for name, signature in signed.signatures
        if scheme is None or name == scheme
    )


class Token(Verifier[bytes]):
    """A shared token in one header (optionally after a prefix such as ``Bearer ``).

    The token covers nothing of the request, so replays are not told apart.
    """

    signs_body = False

    def __init__(
        self, header: str, *, prefix: str = "", delivery_id_header: str | None = None
    ) -> None:
        self.header = header
        self.prefix = prefix
        self.delivery_id_header = delivery_id_header

    def _parse(self, headers: Headers, body: bytes) -> SignedMessage:
        token = strip_prefix(headers.require(self.header), self.prefix, self.header)
        return SignedMessage(message=b"", signatures=(("", _text_bytes(token)),))

    def _load_key(self, secret: str) -> bytes:
        return secret.encode("utf-8")

    def _matches(self, signed: SignedMessage, key: bytes) -> bool:
        # Digests first, so the comparison does not reveal the token's length either.
        expected = hashlib.sha256(key).digest()
        return any(
            hmac.compare_digest(expected, hashlib.sha256(token).digest())
            for _, token in signed.signatures
        )


def _text_bytes(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


class PublicKey(Verifier[Any]):
    """A public-key signature in one header; the secret is the provider's public key.

    With ``timestamp_header``, the signed bytes are that header's value followed
    by the body, and ``tolerance`` (seconds, both ways) bounds its age.
    """

    def __init__(
        self,
        header: str,
        *,
        algorithm: PublicKeyAlgorithm = "ed25519",
        encoding: SignatureEncoding = "hex",
        timestamp_header: str | None = None,
        tolerance: int | None = None,
        delivery_id_header: str | None = None,
    ) -> None:
        require_cryptography("PublicKey")
        self.header = header
        self.algorithm = _choice("algorithm", algorithm, PUBLIC_KEY_ALGORITHMS)
        self.encoding = _choice("encoding", encoding, SIGNATURE_ENCODINGS)
        self.timestamp_header = timestamp_header
        if tolerance is not None and timestamp_header is None:
            raise ValueError("tolerance needs a timestamp_header")
        self.tolerance = check_tolerance(tolerance)
        self.delivery_id_header = delivery_id_header

    @property
    def signs_timestamp(self) -> bool:  # type: ignore[override]
        """Whether a timestamp header is signed with the body."""
        return self.timestamp_header is not None

    def _parse(self, headers: Headers, body: bytes) -> SignedMessage:
        what = f"the {self.header} header"
        signature = decode_signature(headers.require(self.header), self.encoding, what)
        if self.algorithm == "ed25519" and len(signature) != 64:
            raise MalformedSignatureError(f"{what} is not an Ed25519 signature")
        if len(signature) > 1024:
            raise MalformedSignatureError(f"{what} is too long for a signature")
        timestamp = None
        message = body
        if self.timestamp_header:
            raw = headers.require(self.timestamp_header)
            timestamp = parse_timestamp(raw, f"the {self.timestamp_header} header")
            message = raw.encode("ascii") + body
        return SignedMessage(
            message=message,
            signatures=(("", signature),),
            timestamp=timestamp,
        )

    def _load_key(self, secret: str) -> Any:
        return load_public_key(secret, self.algorithm)

    def _matches(self, signed: SignedMessage, key: Any) -> bool:
        return any(
            verify_public_key_signature(key, self.algorithm, signature, signed.message)
            for _, signature in signed.signatures
        )


class Function(Verifier[str]):
    """A user check ``fn(request, secret) -> bool``, tried with each secret.

    ``request`` has ``headers`` (case-insensitive) and ``body`` (raw bytes), like
    Django's ``HttpRequest``. Only ``True`` accepts; an exception counts as a mismatch.
    What the check covers is not known, so replays are left to it.
    """

    signs_body = False

    def __init__(
        self,
        fn: Callable[[WebhookRequest, str], bool],
        *,
        delivery_id_header: str | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError("fn must be callable")
        self.fn = fn
        self.delivery_id_header = delivery_id_header

    def _parse(self, headers: Headers, body: bytes) -> SignedMessage:
        return SignedMessage(
            message=body, signatures=(), request=WebhookRequest(headers.mapping, body)
        )

    def _load_key(self, secret: str) -> str:
        return secret

    def _matches(self, signed: SignedMessage, key: str) -> bool:
        if signed.request is None:
            return False
        try:
            result: object = self.fn(signed.request, key)  # user code: checked below
        except Exception:
            logger.warning("webhook check %r raised; treated as a mismatch", self.fn, exc_info=True)
            return False
        if not isinstance(result, bool):
            logger.warning(
                "webhook check %r returned %s, not a bool; treated as a mismatch",
                self.fn,
                type(result).__name__,
            )
            return False
        return result


def verify_request(
    verifier: Verifier[Any],
    headers: Mapping[str, str],
    body: bytes,
    secrets: Sequence[str] | None,
    now: float | None = None,
) -> VerifiedRequest:
    """Verify one request with ``verifier`` (see :meth:`Verifier.verify`)."""
    return verifier.verify(headers, body, secrets, now=now)
