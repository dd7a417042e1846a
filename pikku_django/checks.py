"""System checks for the ``PIKKU`` settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from pikku_django.conf import DEFAULTS, pikku_settings
from pikku_django.leases.registry import BACKENDS


@checks.register(checks.Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """PIKKU must be a dict of known keys."""
    raw = getattr(settings, "PIKKU", None)
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [
            checks.Error(
                "settings.PIKKU must be a dict.",
                hint="Set PIKKU = {...} with the keys listed in the pikku_django README.",
                id="pikku.E001",
            )
        ]
    return [
        checks.Warning(
            f"settings.PIKKU has an unknown key {key!r}; it is ignored.",
            hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
            id="pikku.W001",
        )
        for key in sorted(set(raw) - set(DEFAULTS))
    ]


@checks.register(checks.Tags.compatibility)
def check_lease_backend(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The configured lease backend must be usable."""
    if not isinstance(getattr(settings, "PIKKU", None) or {}, dict):
        return []
    backend = pikku_settings.LEASE_BACKEND
    ttl = pikku_settings.LEASE_TTL_MS
    errors: list[checks.CheckMessage] = []
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
        errors.append(
            checks.Error(
                f"PIKKU['LEASE_TTL_MS'] must be a positive int of milliseconds, not {ttl!r}.",
                id="pikku.E002",
            )
        )
    if backend == "database":
        alias = pikku_settings.LEASE_DATABASE
        if alias not in settings.DATABASES:
            errors.append(
                checks.Error(
                    f"PIKKU['LEASE_DATABASE'] is {alias!r}, which is not in DATABASES.",
                    hint="Name an alias from DATABASES (default: 'default').",
                    id="pikku.E003",
                )
            )
        else:
            engine = settings.DATABASES[alias].get("ENGINE", "")
            if not any(v in engine for v in ("postgresql", "mysql", "sqlite3")):
                errors.append(
                    checks.Error(
                        f"The database lease backend supports PostgreSQL, MariaDB/MySQL and "
                        f"SQLite; DATABASES[{alias!r}] uses {engine!r}.",
                        hint="Set PIKKU['LEASE_BACKEND'] to 'redis' or point "
                        "PIKKU['LEASE_DATABASE'] at a supported database.",
                        id="pikku.E004",
                    )
                )
    elif backend == "redis":
        alias = pikku_settings.LEASE_CACHE
        caches = getattr(settings, "CACHES", {})
        if not alias:
            errors.append(
                checks.Error(
                    "PIKKU['LEASE_BACKEND'] is 'redis' but PIKKU['LEASE_CACHE'] is not set.",
                    hint="Set PIKKU['LEASE_CACHE'] to the CACHES alias of a django-redis cache.",
                    id="pikku.E005",
                )
            )
        elif alias not in caches:
            errors.append(
                checks.Error(
                    f"PIKKU['LEASE_CACHE'] is {alias!r}, which is not in CACHES.",
                    id="pikku.E006",
                )
            )
        elif not str(caches[alias].get("BACKEND", "")).startswith("django_redis."):
            errors.append(
                checks.Error(
                    f"CACHES[{alias!r}] is not a django-redis cache.",
                    hint="Use BACKEND 'django_redis.cache.RedisCache' "
                    "(pip install 'pikku-django[redis]').",
                    id="pikku.E007",
                )
            )
    elif backend not in BACKENDS and not (isinstance(backend, str) and "." in backend):
        errors.append(
            checks.Error(
                f"PIKKU['LEASE_BACKEND'] is {backend!r}.",
                hint=f"Use one of {', '.join(BACKENDS)} or a dotted path to a LeaseService.",
                id="pikku.E008",
            )
        )
    return errors


@checks.register(checks.Tags.compatibility)
def check_workflow_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The workflow database must exist; on SQLite, writers must queue rather than fail."""
    if not isinstance(getattr(settings, "PIKKU", None) or {}, dict):
        return []
    alias = pikku_settings.WORKFLOW_DATABASE
    if alias not in settings.DATABASES:
        return [
            checks.Error(
                f"PIKKU['WORKFLOW_DATABASE'] is {alias!r}, which is not in DATABASES.",
                hint="Name an alias from DATABASES (default: 'default').",
                id="pikku.E009",
            )
        ]
    db = settings.DATABASES[alias]
    messages: list[checks.CheckMessage] = []
    if "sqlite3" in db.get("ENGINE", ""):
        options = db.get("OPTIONS", {})
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            messages.append(
                checks.Warning(
                    f"DATABASES[{alias!r}] is SQLite without transaction_mode 'IMMEDIATE': "
                    "pikku_worker threads and lease connections that write at once may fail "
                    "with 'database is locked'.",
                    hint='Set OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 20, '
                    '"init_command": "PRAGMA journal_mode=WAL;"}.',
                    id="pikku.W002",
                )
            )
        concurrency = pikku_settings.WORKER_CONCURRENCY
        processes = pikku_settings.WORKER_PROCESSES
        if isinstance(processes, int) and processes > 1:
            messages.append(
                checks.Warning(
                    f"PIKKU['WORKER_PROCESSES'] is {processes}, but on SQLite only one "
                    "pikku_worker process can run (a second one exits with an error).",
                    hint="Run one process with more threads (PIKKU['WORKER_CONCURRENCY'], "
                    f"now {concurrency}), or move workflows to PostgreSQL or MariaDB.",
                    id="pikku.W003",
                )
            )
    return messages
