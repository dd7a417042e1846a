"""Schedule rows: synced from the declarations, switched on and off, triggered by hand."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from pikku_django.conf import pikku_settings
from pikku_django.models import Schedule, WorkflowRun
from pikku_django.schedules.cron import Cron
from pikku_django.schedules.declarations import ScheduleSpec, read_declarations
from pikku_django.schedules.errors import ScheduleError, ScheduleNotFoundError
from pikku_django.workflows.api import get_engine
from pikku_django.workflows.engine import WorkflowEngine

logger = logging.getLogger(__name__)

_engines_lock = threading.Lock()
_engines: dict[str, WorkflowEngine] = {}


def database(using: str | None = None) -> str:
    """The alias schedules live in: ``using``, else PIKKU['WORKFLOW_DATABASE'] (with the runs)."""
    return using or pikku_settings.WORKFLOW_DATABASE


def engine_for(alias: str) -> WorkflowEngine:
    """The project's engine when it writes to ``alias``, else one kept for ``alias``."""
    engine = get_engine()
    if engine.using == alias:
        return engine
    with _engines_lock:
        if alias not in _engines:
            _engines[alias] = WorkflowEngine(alias)
        return _engines[alias]


def schedules(using: str | None = None) -> QuerySet[Schedule]:
    return Schedule.objects.using(database(using))


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of the run that ``tick`` of schedule ``name`` starts."""
    return f"schedule:{name}:{tick.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def cron_of(row: Schedule) -> Cron:
    """The row's cron expression in its time zone (a :class:`ScheduleError` if it went bad)."""
    try:
        return Cron.parse(row.cron, row.timezone)
    except ScheduleError as exc:
        raise ScheduleError(f"Schedule {row.name!r}: {exc}") from None


def get_schedule(name: str, using: str | None = None) -> Schedule:
    """The row called ``name``, or a :class:`ScheduleNotFoundError` listing the known names."""
    row = schedules(using).filter(name=name).first()
    if row is None:
        known = list(schedules(using).values_list("name", flat=True))
        raise ScheduleNotFoundError(
            f"No schedule is named {name!r}. Known: {', '.join(known) or 'none'} "
            "(declare schedules with @workflow(schedule=...) or PIKKU['SCHEDULES'], "
            "then run `pikku_schedules sync`)"
        )
    return row


# -- sync -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncReport:
    """What :func:`sync_schedules` changed, by schedule name."""

    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    undeclared: tuple[str, ...] = ()


def sync_schedules(now: datetime | None = None, *, using: str | None = None) -> SyncReport:
    """Write every declared schedule to its row, and mark rows no longer declared.

    A new row's first tick is the first one after ``now``. A row keeps its next
    tick (and so the ticks it missed) unless its expression or time zone
    changed. The enabled switch set in the admin or by the command is kept,
    unless the declaration's own ``enabled`` changed since the last sync.
    Raises :class:`ScheduleError` (changing nothing) if any declaration is wrong.
    """
    declarations = read_declarations()
    declarations.raise_first()
    now = now or timezone.now()
    created: list[str] = []
    updated: list[str] = []
    for spec in declarations.specs:
        outcome = _sync_one(spec, now, using)
        if outcome == "created":
            created.append(spec.name)
        elif outcome == "updated":
            updated.append(spec.name)
    names = [spec.name for spec in declarations.specs]
    gone = schedules(using).filter(declared=True).exclude(name__in=names)
    undeclared = tuple(gone.values_list("name", flat=True))
    if undeclared:
        schedules(using).filter(name__in=undeclared).update(declared=False, next_tick_at=None)
        logger.warning("Schedules no longer declared, so stopped: %s", ", ".join(undeclared))
    return SyncReport(tuple(created), tuple(updated), undeclared)


def _sync_one(spec: ScheduleSpec, now: datetime, using: str | None) -> str:
    row = schedules(using).filter(name=spec.name).first()
    if row is None:
        try:
            with transaction.atomic(using=database(using)):
                schedules(using).create(
                    name=spec.name,
                    workflow=spec.workflow,
                    cron=spec.cron.expression,
                    timezone=spec.timezone,
                    input=spec.input,
                    missed=spec.missed,
                    origin=spec.origin,
                    enabled=spec.enabled,
                    declared_enabled=spec.enabled,
                    next_tick_at=spec.cron.next_after(now) if spec.enabled else None,
                )
            return "created"
        except IntegrityError:  # another process created it just now
            row = schedules(using).get(name=spec.name)
    changes: dict[str, Any] = {
        key: value
        for key, value in (
            ("workflow", spec.workflow),
            ("input", spec.input),
            ("missed", spec.missed),
            ("origin", spec.origin),
            ("declared", True),
        )
        if getattr(row, key) != value
    }
    enabled = row.enabled
    if row.declared_enabled != spec.enabled:
        enabled = spec.enabled
        changes.update(enabled=enabled, declared_enabled=spec.enabled)
    timing_changed = (row.cron, row.timezone) != (spec.cron.expression, spec.timezone)
    if timing_changed:
        changes.update(cron=spec.cron.expression, timezone=spec.timezone)
    if timing_changed or "declared" in changes or enabled != row.enabled:
        changes["next_tick_at"] = spec.cron.next_after(now) if enabled else None
    if not changes:
        return "unchanged"
    schedules(using).filter(pk=row.pk).update(**changes, updated_at=timezone.now())
    return "updated"


# -- the switch and a start by hand ----------------------------------------------------


@dataclass(frozen=True)
class SwitchResult:
    """The row after :func:`enable_schedule` or :func:`disable_schedule`, and whether it changed."""

    schedule: Schedule
    changed: bool


def enable_schedule(
    name: str, now: datetime | None = None, *, using: str | None = None
) -> SwitchResult:
    """Switch a schedule on; its next tick is the first one after ``now`` (none are caught up)."""
    row = get_schedule(name, using)
    if not row.declared:
        raise ScheduleError(
            f"Schedule {name!r} is no longer declared in code or settings, so it cannot be enabled"
        )
    next_tick = cron_of(row).next_after(now or timezone.now())
    changed = (
        schedules(using)
        .filter(pk=row.pk, enabled=False)
        .update(enabled=True, next_tick_at=next_tick, updated_at=timezone.now())
    )
    row.refresh_from_db(using=database(using))
    if changed:
        logger.info("Schedule %s enabled; next tick %s", name, next_tick.isoformat())
    return SwitchResult(row, bool(changed))


def disable_schedule(name: str, *, using: str | None = None) -> SwitchResult:
    """Switch a schedule off: no tick starts a run until it is enabled again."""
    row = get_schedule(name, using)
    changed = (
        schedules(using)
        .filter(pk=row.pk, enabled=True)
        .update(enabled=False, next_tick_at=None, updated_at=timezone.now())
    )
    row.refresh_from_db(using=database(using))
    if changed:
        logger.info("Schedule %s disabled", name)
    return SwitchResult(row, bool(changed))


def trigger_schedule(
    name: str, now: datetime | None = None, *, using: str | None = None
) -> WorkflowRun:
    """Start one run of the schedule's workflow now, with its input; its ticks are unchanged."""
    row = get_schedule(name, using)
    now = now or timezone.now()
    key = f"schedule:{name}:manual:{now.astimezone(UTC).isoformat()}"
    alias = database(using)
    with transaction.atomic(using=alias):
        run = engine_for(alias).start(row.workflow, row.input, idempotency_key=key)
        schedules(using).filter(pk=row.pk).update(last_run_id=run.id, last_run_at=now)
    logger.info("Schedule %s triggered by hand: run %s", name, run.id)
    return run
