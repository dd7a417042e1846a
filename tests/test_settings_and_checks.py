"""The PIKKU settings, the lease backend they build, and the system checks."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from pikku_django.checks import check_lease_backend, check_settings
from pikku_django.conf import DEFAULTS, pikku_settings
from pikku_django.leases import InMemoryLeaseService, get_lease_service
from pikku_django.leases.database import DatabaseLeaseService
from pikku_django.leases.registry import build_lease_service
from tests.conftest import require_service


def ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [m.id or "" for m in messages]


def test_defaults_apply_key_by_key(settings: Any) -> None:
    settings.PIKKU = {"LEASE_TTL_MS": 5000}
    assert pikku_settings.LEASE_TTL_MS == 5000
    assert pikku_settings.LEASE_BACKEND == DEFAULTS["LEASE_BACKEND"] == "database"
    with pytest.raises(AttributeError):
        _ = pikku_settings.NOT_A_SETTING


def test_default_backend_is_the_default_database(settings: Any) -> None:
    settings.PIKKU = {}
    service = get_lease_service()
    assert isinstance(service, DatabaseLeaseService)
    assert service.using == "default"
    assert get_lease_service() is service


def test_changing_settings_rebuilds_the_service(settings: Any) -> None:
    settings.PIKKU = {"LEASE_BACKEND": "memory"}
    first = get_lease_service()
    assert isinstance(first, InMemoryLeaseService)
    settings.PIKKU = {"LEASE_BACKEND": "memory", "LEASE_TTL_MS": 10}
    assert get_lease_service() is not first


def test_redis_backend_from_cache_alias(settings: Any) -> None:
    require_service("redis")
    settings.PIKKU = {"LEASE_BACKEND": "redis", "LEASE_CACHE": "redis", "LEASE_KEY_PREFIX": "x:"}
    from pikku_django.leases.redis import RedisLeaseService

    service = get_lease_service()
    assert isinstance(service, RedisLeaseService)
    assert service.prefix == "x:"
    assert check_lease_backend() == []


def test_dotted_path_backend(settings: Any) -> None:
    settings.PIKKU = {"LEASE_BACKEND": "pikku_django.leases.memory.InMemoryLeaseService"}
    assert isinstance(build_lease_service(), InMemoryLeaseService)
    assert check_lease_backend() == []


@pytest.mark.parametrize(
    ("pikku", "message"),
    [
        ({"LEASE_BACKEND": "redis"}, "LEASE_CACHE"),
        ({"LEASE_BACKEND": "redis", "LEASE_CACHE": "nope"}, "not an alias in CACHES"),
        ({"LEASE_BACKEND": "redis", "LEASE_CACHE": "default"}, "not a django-redis cache"),
        ({"LEASE_BACKEND": "carrier-pigeon"}, "carrier-pigeon"),
        ({"LEASE_BACKEND": "no.such.Module"}, "cannot be imported"),
        ({"LEASE_BACKEND": "pikku_django.conf.DEFAULTS"}, "not a LeaseService"),
        ({"LEASE_DATABASE": "elsewhere"}, "not in DATABASES"),
    ],
)
def test_bad_backend_settings_name_what_to_set(settings: Any, pikku: dict, message: str) -> None:
    settings.PIKKU = pikku
    with pytest.raises(ImproperlyConfigured, match=message):
        build_lease_service()


@pytest.mark.parametrize(
    ("pikku", "expected"),
    [
        ({}, []),
        ({"LEASE_BACKEND": "redis"}, ["pikku_django.E005"]),
        ({"LEASE_BACKEND": "redis", "LEASE_CACHE": "nope"}, ["pikku_django.E006"]),
        ({"LEASE_BACKEND": "redis", "LEASE_CACHE": "default"}, ["pikku_django.E007"]),
        ({"LEASE_BACKEND": "carrier-pigeon"}, ["pikku_django.E008"]),
        ({"LEASE_DATABASE": "elsewhere"}, ["pikku_django.E003"]),
        ({"LEASE_TTL_MS": 0}, ["pikku_django.E002"]),
        ({"LEASE_TTL_MS": "30s"}, ["pikku_django.E002"]),
    ],
)
def test_lease_backend_check(settings: Any, pikku: dict, expected: list[str]) -> None:
    settings.PIKKU = pikku
    assert ids(check_settings() + check_lease_backend()) == expected


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_unsupported_database_engine_is_reported(settings: Any) -> None:
    settings.DATABASES = {
        **settings.DATABASES,
        "oracle": {"ENGINE": "django.db.backends.oracle", "NAME": "x"},
    }
    settings.PIKKU = {"LEASE_DATABASE": "oracle"}
    assert ids(check_lease_backend()) == ["pikku_django.E004"]


def test_settings_check(settings: Any) -> None:
    settings.PIKKU = ["not", "a", "dict"]
    assert ids(check_settings()) == ["pikku_django.E001"]
    settings.PIKKU = {"LEASE_BAKEND": "memory"}
    messages = check_settings()
    assert ids(messages) == ["pikku_django.W001"]
    assert "LEASE_BAKEND" in messages[0].msg


def test_checks_run_through_django(settings: Any) -> None:
    settings.PIKKU = {"LEASE_BACKEND": "redis"}
    assert "pikku_django.E005" in ids(checks.run_checks(tags=[checks.Tags.compatibility]))
