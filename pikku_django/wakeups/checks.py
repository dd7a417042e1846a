"""System checks for wake-ups: whether workers listen or poll, and the LISTEN aliases."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from pikku_django.conf import pikku_settings
from pikku_django.pooling import Pooling, pooling_of
from pikku_django.wakeups.channels import listen_alias, notifies


@checks.register(checks.Tags.compatibility)
def check_wakeups(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each ``LISTEN_DATABASES`` pair names two aliases of one PostgreSQL database, the
    second not behind a transaction pooler (a pair of another database has no effect);
    and behind a transaction pooler, whether the workers listen (over that alias) or poll."""
    if not isinstance(getattr(settings, "PIKKU", None) or {}, dict):
        return []
    names = ("LISTEN_DATABASES", "WORKFLOW_DATABASE", "WORKER_NOTIFY")
    if not pikku_settings.well_typed(*names, "WORKER_POOLED_POLL_INTERVAL"):
        return []  # check_settings reports the value of the wrong type
    messages = [
        message
        for pooled, direct in pikku_settings.LISTEN_DATABASES.items()
        for message in _pair_problems(pooled, direct)
    ]
    alias = pikku_settings.WORKFLOW_DATABASE
    serious = any(m.is_serious() for m in messages)
    if serious or alias not in settings.DATABASES or not pikku_settings.WORKER_NOTIFY:
        return messages
    if not notifies(alias) or pooling_of(alias) is not Pooling.TRANSACTION:
        return messages
    through = listen_alias(alias)
    if through is not None:
        messages.append(
            checks.Info(
                f"{alias!r} is behind a transaction pooler: pikku_worker announces new work "
                f"through it and listens for it over {through!r}.",
                id="pikku_django.I501",
            )
        )
    else:
        interval = min(
            float(pikku_settings.WORKER_POLL_INTERVAL),
            float(pikku_settings.WORKER_POOLED_POLL_INTERVAL),
        )
        messages.append(
            checks.Warning(
                f"{alias!r} is behind a transaction pooler, where a connection cannot "
                f"LISTEN: pikku_worker polls for new work every {interval:g}s instead.",
                hint=f"Add a DATABASES alias that reaches the same database without the "
                f"pooler and name it in PIKKU['LISTEN_DATABASES'] = {{{alias!r}: ...}}; "
                "or silence pikku_django.W501 to keep polling.",
                id="pikku_django.W501",
            )
        )
    return messages


def _pair_problems(pooled: Any, direct: Any) -> list[checks.CheckMessage]:
    """What is wrong with ``LISTEN_DATABASES[pooled] = direct``."""
    unknown = [a for a in (pooled, direct) if not isinstance(a, str) or a not in settings.DATABASES]
    if unknown:
        return [
            checks.Error(
                f"PIKKU['LISTEN_DATABASES'] names {unknown[0]!r}, which is not in DATABASES.",
                hint="Map a DATABASES alias to another alias of the same database.",
                id="pikku_django.E501",
            )
        ]
    problem = None
    if notifies(pooled) != notifies(direct):
        problem = "only one of them is PostgreSQL"
    elif not notifies(pooled):
        return [
            checks.Warning(
                f"PIKKU['LISTEN_DATABASES'] maps {pooled!r} to {direct!r}, which do not "
                "carry notifications (not PostgreSQL): nothing listens, workers poll.",
                hint=f"Remove {pooled!r} from PIKKU['LISTEN_DATABASES'].",
                id="pikku_django.W502",
            )
        ]
    elif _name(pooled) != _name(direct):
        problem = f"they name different databases ({_name(pooled)!r}, {_name(direct)!r})"
    elif pooling_of(direct) is Pooling.TRANSACTION:
        problem = f"{direct!r} is itself behind a transaction pooler"
    if problem is None:
        return []
    return [
        checks.Error(
            f"PIKKU['LISTEN_DATABASES'] maps {pooled!r} to {direct!r}, but {problem}.",
            hint="Name an alias that reaches the same database directly (not pooled by "
            "transaction); it is used only to LISTEN.",
            id="pikku_django.E502",
        )
    ]


def _name(alias: str) -> Any:
    return connections[alias].settings_dict.get("NAME")
