"""Named credentials (webhook secrets), encrypted at rest, with several active values.

Values are encrypted with Fernet keys from ``PIKKU['CREDENTIAL_KEYS']`` (the first
encrypts, every one decrypts, so keys rotate); without it, one key is derived
from ``SECRET_KEY``. ``PIKKU['CREDENTIALS']`` may give values in settings instead.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from pikku_django.conf import pikku_settings

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

    from pikku_django.webhooks.secret_checks import UnusableSecret


def _fernet() -> MultiFernet:
    try:
        from cryptography.fernet import Fernet, MultiFernet
    except ImportError as exc:
        raise ImproperlyConfigured(
            "Stored credentials need cryptography: pip install 'pikku-django[webhooks]'"
        ) from exc
    keys = pikku_settings.CREDENTIAL_KEYS
    if not keys:
        digest = hashlib.sha256(b"pikku-credentials:" + settings.SECRET_KEY.encode()).digest()
        keys = [base64.urlsafe_b64encode(digest).decode()]
    if isinstance(keys, str):
        keys = [keys]
    try:
        return MultiFernet([Fernet(k) for k in keys])
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            "PIKKU['CREDENTIAL_KEYS'] must be a list of Fernet keys "
            "(make one with: python -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())')"
        ) from exc


def encrypt(value: str) -> str:
    return _fernet().encrypt(value.encode()).decode()


def decrypt(token: str) -> str:
    from cryptography.fernet import InvalidToken

    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise ImproperlyConfigured(
            "A stored credential cannot be decrypted with PIKKU['CREDENTIAL_KEYS']: keep "
            "the old key in the list (after the new one) until `manage.py pikku_credentials "
            "rotate` has re-encrypted every value."
        ) from exc


def hint_of(value: str) -> str:
    """The last characters of a secret, shown instead of it."""
    return value[-4:] if len(value) >= 12 else ""


def set_credential(name: str, value: str, *, replace: bool = False, validate: bool = True) -> Any:
    """Store a new active value for ``name``; ``replace`` retires the others.

    With ``validate``, a value that a declared source using ``name`` cannot verify
    with raises :class:`~pikku_django.webhooks.secret_checks.InvalidSecretError`
    (a ``ValueError`` naming the source and what is wrong), and nothing is stored.
    """
    from django.db import transaction

    from pikku_django.models import CredentialValue
    from pikku_django.webhooks.secret_checks import check_secret

    if not isinstance(value, str) or not value:
        raise ValueError(f"A value for credential {name!r} must be a non-empty str")
    if validate:
        check_secret(name, value)
    with transaction.atomic():
        if replace:
            CredentialValue.objects.filter(credential=name, active=True).update(active=False)
        return CredentialValue.objects.create(
            credential=name, ciphertext=encrypt(value), hint=hint_of(value)
        )


def configured_values(name: str) -> list[str]:
    """The values of ``name`` given in ``PIKKU['CREDENTIALS']``."""
    configured = (pikku_settings.CREDENTIALS or {}).get(name)
    if isinstance(configured, str):
        return [configured]
    if isinstance(configured, Iterable):
        return [str(v) for v in configured if v]
    return []


def credential_values(name: str) -> list[str]:
    """Every active value of ``name``: from settings, then the database (newest first)."""
    from pikku_django.models import CredentialValue

    return configured_values(name) + [
        decrypt(token)
        for token in CredentialValue.objects.filter(credential=name, active=True)
        .order_by("-created_at")
        .values_list("ciphertext", flat=True)
    ]


def decrypt_cached(token: str) -> str:
    """:func:`decrypt`, remembered per key set and ciphertext (a webhook's hot path)."""
    keys = pikku_settings.CREDENTIAL_KEYS
    key_id = tuple(keys) if isinstance(keys, list | tuple) else (keys, settings.SECRET_KEY)
    return _decrypt_once(key_id, token)


@functools.lru_cache(maxsize=512)
def _decrypt_once(key_id: tuple[Any, ...], token: str) -> str:
    return decrypt(token)


def rotate_encryption() -> int:
    """Re-encrypt every stored value with the first key; how many were rewritten."""
    from pikku_django.models import CredentialValue

    fernet = _fernet()
    count = 0
    for row in CredentialValue.objects.all():
        row.ciphertext = fernet.rotate(row.ciphertext.encode()).decode()
        row.save(update_fields=["ciphertext"])
        count += 1
    return count


def unusable_secrets() -> list[UnusableSecret]:
    """Every active value, from settings or stored, that a source using its credential
    cannot load. Stored values that cannot be decrypted are left to the caller."""
    from pikku_django.models import CredentialValue
    from pikku_django.webhooks.secret_checks import UnusableSecret, reason_unusable
    from pikku_django.webhooks.sources import sources

    found: list[UnusableSecret] = []
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
            reason = reason_unusable(source, value)
            if reason is not None:
                found.append(UnusableSecret(source.name, credential, where, reason, stored_id))
    return found
