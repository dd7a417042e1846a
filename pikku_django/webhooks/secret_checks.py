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

__all__ = ["InvalidSecretError", "UnusableSecret", "check_secret", "reason_unusable"]


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


def reason_unusable(source: WebhookSource, value: str) -> str | None:
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
        if (reason := reason_unusable(source, value)) is not None
    ]
    if problems:
        raise InvalidSecretError(
            f"This value for {credential!r} is unusable: " + "; ".join(problems)
        )
