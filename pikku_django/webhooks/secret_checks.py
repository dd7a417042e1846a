"""Whether a credential's values are secrets its sources' verifiers can use.

A value is checked by the verifier of every declared source that uses the
credential (a Discord key must be an Ed25519 public key, a Standard Webhooks
secret ``whsec_`` and base64, ...), when it is stored and by the system check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pikku_django.webhooks.sources import WebhookSource, sources

logger = logging.getLogger(__name__)

__all__ = ["InvalidSecretError", "UnusableSecret", "check_secret", "unusable_secrets"]


class InvalidSecretError(ValueError):
    """A value for a credential that a source using it cannot verify with."""


@dataclass(frozen=True)
class UnusableSecret:
    """One active value (stored, or from settings) a source's verifier cannot load."""

    source: str
    credential: str
    #: Where the value is: ``stored value 12 (…abcd)`` or ``PIKKU['CREDENTIALS'] value 1``.
    where: str
    reason: str
    #: The stored value's id, None for a value from settings.
    stored_id: int | None = None


def _users(credential: str) -> Iterator[WebhookSource]:
    for source in sources():
        if source.verify is not None and source.credential == credential:
            yield source


def _reason(source: WebhookSource, value: str) -> str | None:
    """Why ``source``'s verifier cannot use ``value`` (None when it can)."""
    try:
        source.verify.validate_secret(value)
    except Exception as exc:  # a verifier says what is wrong in its own words
        return str(exc) or type(exc).__name__
    return None


def check_secret(credential: str, value: str) -> None:
    """Raise :class:`InvalidSecretError`, naming each source and what is wrong, unless
    every declared source that uses ``credential`` can verify with ``value``."""
    problems = [
        f"webhook source {source.name!r} ({source.verify!r}) cannot use it: {reason}"
        for source in _users(credential)
        if (reason := _reason(source, value)) is not None
    ]
    if problems:
        raise InvalidSecretError(
            f"This value for {credential!r} is unusable: " + "; ".join(problems)
        )


def unusable_secrets() -> list[UnusableSecret]:
    """Every active value, from settings or stored, that a source using its credential
    cannot load. Stored values that cannot be decrypted are left to the caller."""
    from pikku_django.models import CredentialValue
    from pikku_django.webhooks.credentials import configured_values, decrypt

    found = []
    for source in sources():
        credential = source.credential
        if source.verify is None or not credential:
            continue
        values: list[tuple[str, int | None, str]] = [
            (f"PIKKU['CREDENTIALS'] value {n}", None, value)
            for n, value in enumerate(configured_values(credential), 1)
        ]
        for row in CredentialValue.objects.filter(credential=credential, active=True):
            try:
                value = decrypt(row.ciphertext)
            except Exception:
                logger.debug("credential value %s cannot be decrypted", row.pk, exc_info=True)
                continue
            hint = f" (…{row.hint})" if row.hint else ""
            values.append((f"stored value {row.pk}{hint}", row.pk, value))
        for where, stored_id, value in values:
            reason = _reason(source, value)
            if reason is not None:
                found.append(UnusableSecret(source.name, credential, where, reason, stored_id))
    return found
