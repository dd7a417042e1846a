"""Whether pikku_django's migrations are applied, and the one-line error when they are not."""

from __future__ import annotations

from django.core.management.base import CommandError

from pikku_django.conf import pikku_settings


def pending_migrations(alias: str) -> list[str]:
    """pikku_django's migrations not yet applied on database ``alias``, oldest first.

    Raises ``django.db.DatabaseError`` when the database cannot be read.
    """
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[alias])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "pikku_django"]
    return [migration.name for migration, _ in executor.migration_plan(targets)]


def pending_migrations_offline(alias: str) -> list[str] | None:
    """:func:`pending_migrations` for a database read without a network connection or
    a side effect: an SQLite file. ``None`` for any other database.

    An SQLite file that does not exist yet has every migration pending (it is not
    created here).
    """
    from pathlib import Path

    from django.conf import settings
    from django.db.migrations.loader import MigrationLoader

    database = settings.DATABASES.get(alias, {})
    name = str(database.get("NAME") or "")
    if "sqlite3" not in database.get("ENGINE", ""):
        return None
    if not name or name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
        return None
    if not Path(name).exists():
        loader = MigrationLoader(None, ignore_no_migrations=True)
        return sorted(
            migration for app, migration in loader.disk_migrations if app == "pikku_django"
        )
    return pending_migrations(alias)


def pikku_databases(database: str | None = None) -> list[str]:
    """The aliases holding pikku_django's tables: workflows and, with the database
    lease backend, leases."""
    aliases = [database or pikku_settings.WORKFLOW_DATABASE]
    if pikku_settings.LEASE_BACKEND == "database":
        aliases.append(pikku_settings.LEASE_DATABASE)
    return list(dict.fromkeys(aliases))


def require_migrated(database: str | None = None) -> None:
    """Raise a ``CommandError`` saying to run ``migrate`` when a table is missing.

    ``database`` is the workflow database a command was given (default:
    ``PIKKU["WORKFLOW_DATABASE"]``). A database that cannot be reached is reported
    in one line too.
    """
    from django.conf import settings
    from django.db import DatabaseError

    for alias in pikku_databases(database):
        if alias not in settings.DATABASES:
            raise CommandError(f"There is no database {alias!r} in DATABASES.")
        try:
            pending = pending_migrations(alias)
        except DatabaseError as exc:
            first_line = (
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            )
            raise CommandError(f"Cannot read database {alias!r}: {first_line}") from exc
        if pending:
            option = "" if alias == "default" else f" --database {alias}"
            raise CommandError(
                f"pikku_django's tables are not set up on database {alias!r} "
                f"({len(pending)} migration(s) not applied): "
                f"run `python manage.py migrate{option}` first."
            )
