"""How each database is reached: directly, or through a connection pooler.

``PIKKU["DATABASE_POOLING"]`` names, per ``DATABASES`` alias, the pooling mode in front
of it (PgBouncer's words). Behind a pooler in transaction mode every transaction may run
on another server session, so nothing pikku_django does on that alias may leave state in
a session between transactions: :func:`keeps_sessions` says whether it may.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pikku_django.conf import pikku_settings

if TYPE_CHECKING:
    from django.core.checks import CheckMessage


class Pooling(StrEnum):
    """The pooling mode in front of one database alias."""

    #: Each transaction may run on another server session (PgBouncer's ``transaction``).
    TRANSACTION = "transaction"
    #: A client keeps one server session while connected (PgBouncer's ``session``).
    SESSION = "session"
    #: No pooler: the server session is the connection's own.
    NONE = "none"


def pooling_of(alias: str) -> Pooling:
    """The pooling mode ``PIKKU["DATABASE_POOLING"]`` states for ``alias`` (``NONE`` when
    it names none; a value the system check refuses counts as ``NONE`` too)."""
    stated = pikku_settings.DATABASE_POOLING
    if not isinstance(stated, dict):
        return Pooling.NONE
    try:
        return Pooling(stated.get(alias, Pooling.NONE))
    except ValueError:
        return Pooling.NONE


def keeps_sessions(alias: str) -> bool:
    """Whether a connection to ``alias`` keeps its server session between transactions,
    so that prepared statements, ``LISTEN`` and session settings outlive a transaction."""
    return pooling_of(alias) is not Pooling.TRANSACTION


def pooling_problems() -> list[CheckMessage]:
    """What the system checks report on ``PIKKU["DATABASE_POOLING"]``: an alias that is
    not in ``DATABASES`` or a mode that is not one (E511), pooling stated for a database
    that is not PostgreSQL (W510), and Django's own session state behind a transaction
    pooler: server-side cursors on (E512) or Django's statements prepared (W511)."""
    from django.conf import settings
    from django.core import checks
    from django.db import connections

    stated = pikku_settings.DATABASE_POOLING
    if not isinstance(stated, dict):
        return []  # check_settings reports it (E510)
    modes = ", ".join(repr(str(m)) for m in Pooling)
    found: list[CheckMessage] = []
    for alias, mode in stated.items():
        where = f"PIKKU['DATABASE_POOLING'][{alias!r}]"
        if alias not in settings.DATABASES:
            found.append(
                checks.Error(
                    f"{where} names a database that is not in DATABASES.",
                    hint=f"Use one of {sorted(settings.DATABASES)}.",
                    id="pikku_django.E511",
                )
            )
            continue
        if mode not in set(Pooling):
            found.append(
                checks.Error(
                    f"{where} is {mode!r}, which is no pooling mode.",
                    hint=f"Use one of {modes}.",
                    id="pikku_django.E511",
                )
            )
            continue
        if mode == Pooling.NONE:
            continue
        if connections[alias].vendor != "postgresql":
            found.append(
                checks.Warning(
                    f"{where} is {mode!r}, but {alias!r} is not a PostgreSQL database: "
                    "pooling is stated for PostgreSQL poolers (PgBouncer) only, and is ignored.",
                    hint=f"Remove {alias!r} from PIKKU['DATABASE_POOLING'].",
                    id="pikku_django.W510",
                )
            )
        elif mode == Pooling.TRANSACTION:
            found.extend(_django_session_state(alias, where))
    return found


def _django_session_state(alias: str, where: str) -> list[CheckMessage]:
    """What Django itself would keep in a server session on a transaction-pooled alias."""
    from django.conf import settings
    from django.core import checks

    database: dict[str, Any] = dict(settings.DATABASES[alias])
    found: list[CheckMessage] = []
    if database.get("DISABLE_SERVER_SIDE_CURSORS") is not True:
        found.append(
            checks.Error(
                f"{where} is 'transaction', but DATABASES[{alias!r}] has server-side "
                "cursors on: a QuerySet.iterator() fails once its next fetch runs on "
                "another server session.",
                hint=f"Set DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = True.",
                id="pikku_django.E512",
            )
        )
    options = database.get("OPTIONS") or {}
    if options.get("server_side_binding") and options.get("prepare_threshold") is not None:
        found.append(
            checks.Warning(
                f"{where} is 'transaction', but DATABASES[{alias!r}]['OPTIONS'] has psycopg "
                "prepare Django's statements (server_side_binding with a prepare_threshold): "
                "below PgBouncer 1.21 (max_prepared_statements) they fail on another "
                "server session.",
                hint="Remove 'prepare_threshold' from the OPTIONS (or set it to None).",
                id="pikku_django.W511",
            )
        )
    return found
