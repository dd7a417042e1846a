"""Reading a request's signature material: bounded headers, strict decoding, the
replay window, and headers that carry several signatures.

The errors raised here say which answer a request gets: 400 for a malformed
header, 401 for a missing one or a signature that does not match.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.datastructures import CaseInsensitiveMapping

from pikku_django.webhooks.identifiers import MAX_IDENTIFIER_LENGTH, is_usable

__all__ = [
    "MAX_DELIVERY_ID_LENGTH",
    "MAX_HEADER_LENGTH",
    "MAX_SIGNATURES",
    "Headers",
    "MalformedSignatureError",
    "SignatureFormat",
    "SignatureMismatchError",
    "SignedMessage",
    "StaleRequestError",
    "WebhookRequest",
    "WebhookVerificationError",
    "check_delivery_id",
    "check_tolerance",
    "check_window",
    "collect_signatures",
    "decode_base64",
    "decode_hex",
    "decode_signature",
    "parse_timestamp",
    "strip_prefix",
]

MAX_HEADER_LENGTH = 4096
"""A signature, timestamp or delivery-id header longer than this is malformed."""
MAX_SIGNATURES = 16
"""At most this many signatures in one header (bounds the work per request)."""
MAX_DELIVERY_ID_LENGTH = MAX_IDENTIFIER_LENGTH
"""A delivery id longer than this is malformed."""
#: A timestamp header: unix seconds, ASCII digits only.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}")


class WebhookVerificationError(Exception):
    """A webhook request failed verification; answer it with ``status_code``."""

    status_code = 401


class MalformedSignatureError(WebhookVerificationError):
    """A signature or timestamp header is present but cannot be parsed (answer 400)."""

    status_code = 400


class SignatureMismatchError(WebhookVerificationError):
    """No secret is set, a required header is absent, or no secret matches (answer 401)."""

    status_code = 401


class StaleRequestError(SignatureMismatchError):
    """The signature matches but its timestamp is outside the replay window (answer 401)."""


@dataclass(frozen=True, slots=True)
class WebhookRequest:
    """The request a :class:`Function` check receives: headers and raw body."""

    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class SignedMessage:
    """A request's signature material, parsed from its headers."""

    #: The exact bytes the provider signed.
    message: bytes
    #: ``(scheme, raw signature)`` pairs; any one of them may match.
    signatures: tuple[tuple[str, bytes], ...]
    timestamp: int | None = None
    delivery_id: str | None = None
    #: The request itself, for checks that need more than the signed bytes.
    request: WebhookRequest | None = None


class _CaseInsensitiveHeaders(Mapping[str, str]):
    """A read-only header mapping looked up without regard to case."""

    def __init__(self, headers: Mapping[Any, Any]) -> None:
        self._items: dict[str, tuple[str, Any]] = {}
        for name, value in headers.items():
            if isinstance(name, str):
                self._items.setdefault(name.lower(), (name, value))

    def __getitem__(self, name: str) -> Any:
        if not isinstance(name, str):
            raise KeyError(name)
        return self._items[name.lower()][1]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items.values())

    def __len__(self) -> int:
        return len(self._items)


class Headers:
    """The request headers as a verifier reads them: trimmed, bounded text."""

    def __init__(self, headers: Mapping[Any, Any]) -> None:
        # Django's request.headers is already looked up without regard to case.
        self.mapping = (
            headers
            if isinstance(headers, CaseInsensitiveMapping)
            else _CaseInsensitiveHeaders(headers)
        )

    def get(self, name: str) -> str | None:
        """The trimmed value of ``name``, or ``None`` when absent or empty."""
        value = self.mapping.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise MalformedSignatureError(f"the {name} header is not text")
        if len(value) > MAX_HEADER_LENGTH:
            raise MalformedSignatureError(f"the {name} header is too long")
        return value.strip() or None

    def require(self, name: str) -> str:
        """The trimmed value of ``name``; its absence refuses the request."""
        value = self.get(name)
        if value is None:
            raise SignatureMismatchError(f"the {name} header is missing")
        return value


def decode_signature(value: str, encoding: str, what: str, *, lower_hex: bool = False) -> bytes:
    """Decode a hex or base64 signature, or raise :class:`MalformedSignatureError`.

    With ``lower_hex``, upper-case hex is well formed but never matches
    (:class:`SignatureMismatchError`), as with providers whose libraries compare
    the hex text itself.
    """
    try:
        signature = decode_hex(value) if encoding == "hex" else decode_base64(value)
    except ValueError:
        raise MalformedSignatureError(f"{what} is not valid {encoding}") from None
    if lower_hex and encoding == "hex" and value != value.lower():
        raise SignatureMismatchError(f"{what} is upper-case hex, which never matches")
    return signature


@dataclass(frozen=True, slots=True)
class SignatureFormat:
    """How one version of a scheme writes a signature: its encoding, its size in
    bytes, and whether only lower-case hex can match."""

    encoding: str
    size: int
    lower_hex: bool = False


def collect_signatures(
    entries: Sequence[tuple[str, str]], formats: Mapping[str, SignatureFormat], what: str
) -> tuple[tuple[str, bytes], ...]:
    """The ``(version, signature)`` pairs that could match, from a header's
    ``(version, text)`` entries (an empty version: an entry that is not one).

    Entries of another version and malformed ones are skipped, as the providers'
    libraries skip them. :class:`MalformedSignatureError` when there are entries
    and none is well formed; :class:`SignatureMismatchError` when none could match.
    """
    if len(entries) > MAX_SIGNATURES:
        raise MalformedSignatureError(f"{what} has more than {MAX_SIGNATURES} signatures")
    found: list[tuple[str, bytes]] = []
    well_formed = False
    for version, text in entries:
        form = formats.get(version)
        if form is None:  # another version, or not an entry at all
            well_formed = well_formed or bool(version and text)
            continue
        try:
            signature = decode_signature(text, form.encoding, what, lower_hex=form.lower_hex)
        except MalformedSignatureError:
            continue
        except SignatureMismatchError:  # well formed, but it cannot match
            well_formed = True
            continue
        if len(signature) == form.size:
            well_formed = True
            found.append((version, signature))
    if found:
        return tuple(found)
    if entries and not well_formed:
        raise MalformedSignatureError(f"{what} has no well-formed signature")
    raise SignatureMismatchError(f"{what} has no {' or '.join(formats)} signature that could match")


def decode_hex(value: str) -> bytes:
    """Strict hex (either case, no separators); ``ValueError`` otherwise."""
    try:
        data = bytes.fromhex(value)
    except ValueError:
        raise ValueError("not hex") from None
    # fromhex skips whitespace between bytes: strict hex is two digits per byte, nothing else.
    if not data or len(data) * 2 != len(value):
        raise ValueError("not hex")
    return data


def decode_base64(value: str) -> bytes:
    """Base64, standard or URL-safe alphabet, padding optional; ``ValueError`` otherwise."""
    if not _BASE64.fullmatch(value):
        raise ValueError("not base64")
    data = value.rstrip("=").replace("-", "+").replace("_", "/")
    if len(data) % 4 == 1:
        raise ValueError("not base64")
    try:
        return base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    except binascii.Error:
        raise ValueError("not base64") from None


def parse_timestamp(value: str, what: str) -> int:
    """Unix seconds from ASCII digits, or raise :class:`MalformedSignatureError`."""
    if not _TIMESTAMP.fullmatch(value):
        raise MalformedSignatureError(f"{what} is not a unix timestamp")
    return int(value)


def check_delivery_id(value: str, what: str) -> str:
    """A delivery id fit to store and log (the rule of
    :mod:`~pikku_django.webhooks.identifiers`), or raise :class:`MalformedSignatureError`."""
    if not is_usable(value):
        raise MalformedSignatureError(f"{what} is not a usable delivery id")
    return value


def check_window(timestamp: int, now: float, tolerance: int | None) -> None:
    """Raise :class:`StaleRequestError` unless ``timestamp`` is within ``tolerance`` of now."""
    if tolerance is None:
        return
    age = now - timestamp
    if age > tolerance:
        raise StaleRequestError(f"the request is {int(age)} s old (window {tolerance} s)")
    if -age > tolerance:
        raise StaleRequestError(
            f"the request is {int(-age)} s in the future (window {tolerance} s)"
        )


def check_tolerance(tolerance: int | None) -> int | None:
    """``tolerance`` if it is None or a positive number of seconds; ``ValueError`` otherwise."""
    if tolerance is not None and (
        isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance <= 0
    ):
        raise ValueError("tolerance must be a positive number of seconds, or None")
    return tolerance


def strip_prefix(value: str, prefix: str, header: str, *, exact_case: bool = False) -> str:
    """``value`` after ``prefix`` (in any case, unless ``exact_case``: then a prefix in
    another case is well formed but never matches)."""
    if not prefix:
        return value
    if value[: len(prefix)].lower() != prefix.lower():
        raise MalformedSignatureError(f"the {header} header does not start with {prefix!r}")
    if exact_case and not value.startswith(prefix):
        raise SignatureMismatchError(f"the {header} header's prefix is not {prefix!r} exactly")
    rest = value[len(prefix) :].strip()
    if not rest:
        raise MalformedSignatureError(f"the {header} header has nothing after {prefix!r}")
    return rest
