"""System checks for the ``PIKKU`` settings."""

from __future__ import annotations

import contextlib
import difflib
import logging
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from pikku_django.conf import (
    DEFAULTS,
    MILLISECONDS,
    RULES,
    pikku_settings,
    setting_problem,
)
from pikku_django.leases.registry import BACKENDS

logger = logging.getLogger(__name__)


@checks.register(checks.Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """PIKKU must be a dict of known keys, each value of the type (and in the range) its
    rule in ``pikku_django.conf.RULES`` says."""
    raw = getattr(settings, "PIKKU", None)
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [
            checks.Error(
                "settings.PIKKU must be a dict.",
                hint="Set PIKKU = {...} with the keys listed in the settings reference.",
                id="pikku_django.E001",
            )
        ]
    messages: list[checks.CheckMessage] = [
        checks.Warning(
            f"settings.PIKKU has an unknown key {key!r}; it is ignored.",
            hint=closest_key_hint(key),
            id="pikku_django.W001",
        )
        for key in sorted(set(raw) - set(DEFAULTS))
    ]
    for key in DEFAULTS:
        if key not in raw:
            continue
        problem = setting_problem(key, raw[key])
        if problem is not None:
            messages.append(
                checks.Error(
                    f"{problem}.",
                    hint=f"The default is {DEFAULTS[key]!r}; see the settings reference.",
                    id=RULES[key].check_id,
                )
            )
    return messages


@checks.register(checks.Tags.compatibility)
def check_lease_backend(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The configured lease backend must be usable."""
    if not isinstance(getattr(settings, "PIKKU", None) or {}, dict):
        return []
    if not pikku_settings.well_typed("LEASE_BACKEND", "LEASE_DATABASE", "LEASE_CACHE"):
        return []  # check_settings reports the value of the wrong type
    backend = pikku_settings.LEASE_BACKEND
    errors: list[checks.CheckMessage] = []
    if backend == "database":
        alias = pikku_settings.LEASE_DATABASE
        if alias not in settings.DATABASES:
            errors.append(
                checks.Error(
                    f"PIKKU['LEASE_DATABASE'] is {alias!r}, which is not in DATABASES.",
                    hint="Name an alias from DATABASES (default: 'default').",
                    id="pikku_django.E003",
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
                        id="pikku_django.E004",
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
                    id="pikku_django.E005",
                )
            )
        elif alias not in caches:
            errors.append(
                checks.Error(
                    f"PIKKU['LEASE_CACHE'] is {alias!r}, which is not in CACHES.",
                    id="pikku_django.E006",
                )
            )
        elif not str(caches[alias].get("BACKEND", "")).startswith("django_redis."):
            errors.append(
                checks.Error(
                    f"CACHES[{alias!r}] is not a django-redis cache.",
                    hint="Use BACKEND 'django_redis.cache.RedisCache' "
                    "(pip install 'pikku-django[redis]').",
                    id="pikku_django.E007",
                )
            )
    elif backend not in BACKENDS and not (isinstance(backend, str) and "." in backend):
        errors.append(
            checks.Error(
                f"PIKKU['LEASE_BACKEND'] is {backend!r}.",
                hint=f"Use one of {', '.join(BACKENDS)} or a dotted path to a LeaseService.",
                id="pikku_django.E008",
            )
        )
    return errors


@checks.register(checks.Tags.compatibility)
def check_workflow_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The workflow database must exist; on SQLite, writers must queue rather than fail."""
    if not isinstance(getattr(settings, "PIKKU", None) or {}, dict):
        return []
    if not pikku_settings.well_typed("WORKFLOW_DATABASE"):
        return []  # check_settings reports it
    alias = pikku_settings.WORKFLOW_DATABASE
    if alias not in settings.DATABASES:
        return [
            checks.Error(
                f"PIKKU['WORKFLOW_DATABASE'] is {alias!r}, which is not in DATABASES.",
                hint="Name an alias from DATABASES (default: 'default').",
                id="pikku_django.E009",
            )
        ]
    db: dict[str, Any] = settings.DATABASES[alias]
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
                    id="pikku_django.W002",
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
                    id="pikku_django.W003",
                )
            )
    return messages


@checks.register(checks.Tags.compatibility)
def check_read_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The read database, when one is named, must be a DATABASES alias."""
    if not isinstance(getattr(settings, "PIKKU", None) or {}, dict):
        return []
    if not pikku_settings.well_typed("READ_DATABASE"):
        return []  # check_settings reports it
    alias = pikku_settings.READ_DATABASE
    if alias is None or alias in settings.DATABASES:
        return []
    return [
        checks.Error(
            f"PIKKU['READ_DATABASE'] is {alias!r}, which is not in DATABASES.",
            hint="Name the DATABASES alias of a replica of PIKKU['WORKFLOW_DATABASE'], "
            "or None to read from PIKKU['WORKFLOW_DATABASE'] itself.",
            id="pikku_django.E030",
        )
    ]


@checks.register(checks.Tags.compatibility)
def check_workflow_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Step defaults, leases and worker settings must be usable."""
    if not isinstance(getattr(settings, "PIKKU", None) or {}, dict):
        return []
    from pikku_django.workflows.durations import parse_duration

    messages: list[checks.CheckMessage] = []
    if pikku_settings.well_typed("STEP_RETRY_DELAY"):  # else check_settings reports it
        try:
            parse_duration(pikku_settings.STEP_RETRY_DELAY, what="PIKKU['STEP_RETRY_DELAY']")
        except ValueError as exc:
            messages.append(checks.Error(str(exc), id="pikku_django.E010"))
    if pikku_settings.well_typed("STEP_BACKOFF") and pikku_settings.STEP_BACKOFF not in (
        "fixed",
        "exponential",
    ):
        messages.append(
            checks.Error(
                f"PIKKU['STEP_BACKOFF'] is {pikku_settings.STEP_BACKOFF!r}.",
                hint="Use 'fixed' or 'exponential'.",
                id="pikku_django.E011",
            )
        )
    queue_leases = pikku_settings.QUEUE_LEASE_MS
    if pikku_settings.well_typed("QUEUE_LEASE_MS"):  # else check_settings reports it
        for queue, value in queue_leases.items():
            if not MILLISECONDS.accepts(value):
                messages.append(
                    checks.Error(
                        f"PIKKU['QUEUE_LEASE_MS'][{queue!r}] must be {MILLISECONDS.what}, "
                        f"not {value!r}.",
                        id="pikku_django.E014",
                    )
                )
    from pikku_django.webhooks.digests import digest_retention

    if pikku_settings.well_typed("WEBHOOK_DIGEST_RETENTION"):  # else check_settings does
        try:
            digest_retention()
        except ValueError as exc:
            messages.append(
                checks.Error(str(exc), hint="Use e.g. '365d', or None.", id="pikku_django.E020")
            )
    from pikku_django.workflows.config import check_retention

    retention = pikku_settings.RETENTION
    if retention is not None and pikku_settings.well_typed("RETENTION"):  # else check_settings
        try:
            check_retention(retention, "PIKKU['RETENTION']")
        except ImproperlyConfigured as exc:
            messages.append(
                checks.Error(
                    str(exc), hint="Use e.g. '30d', or None to keep runs.", id="pikku_django.E021"
                )
            )
    return messages


@checks.register(checks.Tags.compatibility)
def check_queue_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """PIKKU["QUEUES"] must declare usable queues; QUEUE_LEASE_MS is deprecated."""
    if not isinstance(getattr(settings, "PIKKU", None) or {}, dict):
        return []
    from pikku_django.workflows.control.queues import describe, parse_queues, queue_problems

    messages: list[checks.CheckMessage] = [
        checks.Error(
            f"PIKKU['QUEUES'] {problem}.",
            hint='e.g. {"reports": {"lease_ms": 300_000, "concurrency": 8, "rate": "100/1m"}}',
            id="pikku_django.E017",
        )
        for problem in (
            queue_problems(pikku_settings.QUEUES) if pikku_settings.well_typed("QUEUES") else []
        )
    ]
    legacy = pikku_settings.QUEUE_LEASE_MS
    if "QUEUE_LEASE_MS" in pikku_settings.user_keys():
        folded: dict[str, Any] = {}
        with contextlib.suppress(ValueError, TypeError, AttributeError):  # E013/E014 say why
            folded = describe(parse_queues(pikku_settings.QUEUES, legacy))
        messages.append(
            checks.Warning(
                "PIKKU['QUEUE_LEASE_MS'] is deprecated; it is still read for now.",
                hint=f"Declare each queue's lease in PIKKU['QUEUES'] instead: {folded!r}.",
                id="pikku_django.W011",
            )
        )
    return messages


@checks.register(checks.Tags.urls)
def check_urls_included(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The run stream and webhook sources need the app's URLs."""
    from django.urls import NoReverseMatch, reverse

    try:
        reverse("pikku_django:run-status", args=["00000000-0000-0000-0000-000000000000"])
    except NoReverseMatch:
        return [
            checks.Warning(
                "pikku_django's URLs are not included: webhook sources and the run status "
                "stream are unreachable.",
                hint='Add path("pikku/", include("pikku_django.urls")) to your URLconf.',
                id="pikku_django.W004",
            )
        ]
    except Exception:  # a broken URLconf is Django's own check to report
        return []
    return []


@checks.register(checks.Tags.database)
def check_database_state(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Migrations applied on the workflow database; verified webhook sources have secrets.

    Runs with ``manage.py check --database default`` (and before ``migrate``).
    """
    if not pikku_settings.well_typed("WORKFLOW_DATABASE"):
        return []  # check_settings reports it
    alias = pikku_settings.WORKFLOW_DATABASE
    if not databases or alias not in databases or alias not in settings.DATABASES:
        return []
    from django.db import DatabaseError, connections
    from django.db.migrations.executor import MigrationExecutor

    messages: list[checks.CheckMessage] = []
    try:
        executor = MigrationExecutor(connections[alias])
        targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "pikku_django"]
        pending = executor.migration_plan(targets)
    except DatabaseError as exc:
        return [
            checks.Warning(
                f"Could not read the migration state of {alias!r}: {exc}",
                id="pikku_django.W005",
            )
        ]
    if pending:
        from pikku_django.schema import pending_migrations_offline

        if pending_migrations_offline(alias) is not None:
            return messages  # check_migrations_applied reports it, with or without --database
        # A warning, not an error: an error would stop `migrate` itself.
        messages.append(
            checks.Warning(
                f"{len(pending)} pikku_django migration(s) are not applied on {alias!r}: "
                "workflows, leases and webhooks fail until they are.",
                hint=f"Run: python manage.py migrate pikku_django --database {alias}",
                id="pikku_django.W007",
            )
        )
        return messages
    if not pikku_settings.well_typed("CREDENTIALS", "CREDENTIAL_KEYS"):
        return messages  # check_settings reports it
    from pikku_django.webhooks.credentials import credential_values
    from pikku_django.webhooks.sources import sources

    for source in sources():
        if source.verify is None or not source.credential:
            continue
        try:
            has_secret = bool(credential_values(source.credential))
        except Exception as exc:
            messages.append(
                checks.Error(
                    f"The secret of webhook source {source.name!r} cannot be read: {exc}",
                    id="pikku_django.E016",
                )
            )
            continue
        if not has_secret:
            messages.append(
                checks.Warning(
                    f"Webhook source {source.name!r} verifies requests but its credential "
                    f"{source.credential!r} has no value: every request is refused (401).",
                    hint="Set it in the admin (Credential values), with `manage.py "
                    f"pikku_credentials set {source.credential}`, or in PIKKU['CREDENTIALS'].",
                    id="pikku_django.W006",
                )
            )
    return messages


def closest_key_hint(key: object) -> str:
    """The hint for an unknown ``PIKKU`` key: the known key it is closest to, if any."""
    close = difflib.get_close_matches(str(key).upper(), DEFAULTS, n=1, cutoff=0.6)
    if close:
        return f"Did you mean {close[0]!r}?"
    return "See the settings reference for the keys pikku_django knows."


@checks.register(checks.Tags.compatibility)
def check_staticfiles(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The admin's styles and the run page's live panel are static files."""
    from django.apps import apps

    if apps.is_installed("django.contrib.staticfiles"):
        return []
    return [
        checks.Warning(
            "django.contrib.staticfiles is not in INSTALLED_APPS: pikku_django's admin "
            "screens are unstyled and the run page's live panel stays off.",
            hint='Add "django.contrib.staticfiles" to INSTALLED_APPS (and set STATIC_URL).',
            id="pikku_django.W009",
        )
    ]


@checks.register(checks.Tags.compatibility)
def check_migrations_applied(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Unapplied migrations, reported by every command's checks, not only ``--database``.

    Only where the migration state is read without a network connection (an SQLite
    file), so that a command never waits on an unreachable server for its checks;
    elsewhere ``check --database`` (:func:`check_database_state`) and the commands
    themselves report it. Says nothing when the state cannot be read.
    """
    from pikku_django.schema import pending_migrations_offline, pikku_databases

    if not pikku_settings.well_typed("WORKFLOW_DATABASE", "LEASE_BACKEND", "LEASE_DATABASE"):
        return []  # check_settings reports it
    messages: list[checks.CheckMessage] = []
    for alias in pikku_databases():
        if alias not in settings.DATABASES:
            continue
        try:
            pending = pending_migrations_offline(alias)
        except Exception:  # unreadable, or database access is not allowed here
            logger.debug("Could not read the migration state of %r", alias, exc_info=True)
            continue
        if pending:
            option = "" if alias == "default" else f" --database {alias}"
            messages.append(
                checks.Warning(
                    f"{len(pending)} pikku_django migration(s) are not applied on {alias!r}: "
                    "workflows, leases and webhooks fail until they are.",
                    hint=f"Run: python manage.py migrate{option}",
                    id="pikku_django.W007",
                )
            )
    return messages


@checks.register(checks.Tags.database)
def check_webhook_secrets(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Every active webhook secret is one its sources' verifiers can load.

    Runs with ``manage.py check --database default`` (and before ``migrate``).
    """
    if not pikku_settings.well_typed("WORKFLOW_DATABASE"):
        return []  # check_settings reports it
    alias = pikku_settings.WORKFLOW_DATABASE
    if not databases or alias not in databases or alias not in settings.DATABASES:
        return []
    if not pikku_settings.well_typed("CREDENTIALS", "CREDENTIAL_KEYS"):
        return []  # check_settings reports it
    from django.db import DatabaseError

    from pikku_django.webhooks.credentials import unusable_secrets

    try:
        found = unusable_secrets()
    except DatabaseError:  # no tables yet: check_database_state reports the migrations
        return []
    return [
        checks.Warning(
            f"Webhook source {bad.source!r} cannot use {bad.where} of credential "
            f"{bad.credential!r}: {bad.reason}. Requests signed for it are refused (401).",
            hint=(
                f"Retire it (`manage.py pikku_credentials retire {bad.stored_id}`) and set "
                f"one the source can use (`manage.py pikku_credentials set {bad.credential}`)."
                if bad.stored_id is not None
                else f"Correct PIKKU['CREDENTIALS'][{bad.credential!r}] in the settings."
            ),
            id="pikku_django.W008",
        )
        for bad in found
    ]


@checks.register(checks.Tags.compatibility)
def check_database_pooling(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``PIKKU["DATABASE_POOLING"]`` names databases and modes that exist, and nothing
    keeps state in a server session behind a transaction pooler (no connection made)."""
    from pikku_django.pooling import pooling_problems

    return pooling_problems()
