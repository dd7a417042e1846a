"""Named credentials (webhook secrets), encrypted at rest, with several active values.

Values are encrypted with Fernet keys from ``PIKKU['CREDENTIAL_KEYS']`` (the first
encrypts, every one decrypts, so keys rotate); without it, the keys are derived from
``SECRET_KEY`` (which encrypts) and ``SECRET_KEY_FALLBACKS`` (which still decrypt), so
rotating ``SECRET_KEY`` as Django documents keeps every value readable.
``PIKKU['CREDENTIALS']`` may give values in settings instead.
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


class UndecryptableCredentialError(ImproperlyConfigured):
    """A stored credential value no key at hand decrypts (the key it was written with
    was dropped); ``credential`` names it when known."""

    def __init__(self, credential: str | None = None) -> None:
        self.credential = credential
        value = f"A stored value of credential {credential!r}" if credential else "A stored value"
        super().__init__(f"{value} cannot be decrypted with {keys_described()}: {keys_advice()}")


def keys_described() -> str:
    """Which keys decrypt stored values, as a message names them."""
    if pikku_settings.CREDENTIAL_KEYS:
        return "any key in PIKKU['CREDENTIAL_KEYS']"
    return "the keys derived from SECRET_KEY and SECRET_KEY_FALLBACKS"


def keys_advice() -> str:
    """What to do when a stored value cannot be decrypted."""
    if pikku_settings.CREDENTIAL_KEYS:
        keep = (
            "put the key it was written with back in PIKKU['CREDENTIAL_KEYS'] (after the new one)"
        )
    else:
        keep = "put the SECRET_KEY it was written with back in SECRET_KEY_FALLBACKS"
    return (
        f"{keep} until `manage.py pikku_credentials rotate` has re-encrypted every value, "
        "or retire the value (`pikku_credentials retire ID`) and set it again"
    )


def _derived_keys() -> list[str]:
    """Fernet keys from SECRET_KEY (first: it encrypts) and SECRET_KEY_FALLBACKS."""
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    return [
        base64.urlsafe_b64encode(
            hashlib.sha256(b"pikku-credentials:" + str(secret).encode()).digest()
        ).decode()
        for secret in secrets
    ]


def _key_id() -> tuple[Any, ...]:
    """What the keys in use are made from, to remember decrypted values by."""
    keys = pikku_settings.CREDENTIAL_KEYS
    if keys:
        return tuple(keys) if isinstance(keys, list | tuple) else (keys,)
    return ("SECRET_KEY", settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ()))


def _fernet() -> MultiFernet:
    try:
        from cryptography.fernet import Fernet, MultiFernet
    except ImportError as exc:
        raise ImproperlyConfigured(
            "Stored credentials need cryptography: pip install 'pikku-django[webhooks]'"
        ) from exc
    keys = pikku_settings.CREDENTIAL_KEYS or _derived_keys()
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


def decrypt(token: str, credential: str | None = None) -> str:
    """The value ``token`` encrypts, or :class:`UndecryptableCredentialError`."""
    from cryptography.fernet import InvalidToken

    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise UndecryptableCredentialError(credential) from exc


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
        decrypt(token, name)
        for token in CredentialValue.objects.filter(credential=name, active=True)
        .order_by("-created_at")
        .values_list("ciphertext", flat=True)
    ]


def decrypt_cached(token: str, credential: str | None = None) -> str:
    """:func:`decrypt`, remembered per key set and ciphertext (a webhook's hot path)."""
    try:
        return _decrypt_once(_key_id(), token)
    except UndecryptableCredentialError as exc:
        raise UndecryptableCredentialError(credential) from exc.__cause__


@functools.lru_cache(maxsize=512)
def _decrypt_once(key_id: tuple[Any, ...], token: str) -> str:
    return decrypt(token)


def undecryptable_values() -> list[Any]:
    """The stored values (active or not) that no key at hand decrypts, oldest first."""
    from pikku_django.models import CredentialValue

    found = []
    for row in CredentialValue.objects.order_by("created_at", "pk"):
        try:
            decrypt(row.ciphertext)
        except UndecryptableCredentialError:
            found.append(row)
    return found


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
                value = decrypt(row.ciphertext, credential)
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
