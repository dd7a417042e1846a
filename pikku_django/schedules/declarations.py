"""The schedules declared in code (``@workflow(schedule=...)``) and in ``PIKKU['SCHEDULES']``."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from pikku_django.conf import pikku_settings
from pikku_django.models.schedules import MissedTicks, ScheduleOrigin
from pikku_django.schedules.cron import Cron
from pikku_django.schedules.errors import ScheduleError
from pikku_django.workflows import registry

#: The keys one entry of PIKKU['SCHEDULES'] understands.
SETTINGS_KEYS = frozenset({"workflow", "cron", "timezone", "input", "missed", "enabled"})


#: Functions giving each a schedule pikku_django declares itself, or None while it is off.
_builtin: list[Callable[[], ScheduleSpec | None]] = []


def register_builtin_schedule(declare: Callable[[], ScheduleSpec | None]) -> None:
    """Declare a schedule of pikku_django's own (the retention job's), read on each sync."""
    if declare not in _builtin:
        _builtin.append(declare)


@dataclass(frozen=True)
class ScheduleSpec:
    """One declared schedule, checked: what a ``Schedule`` row is synced to."""

    name: str
    workflow: str
    cron: Cron
    input: Any = None
    missed: MissedTicks = MissedTicks.LATEST
    enabled: bool = True
    origin: ScheduleOrigin = ScheduleOrigin.SETTINGS

    @property
    def timezone(self) -> str:
        return self.cron.zone.key


@dataclass(frozen=True)
class Declarations:
    """Every declared schedule that checks out, and what is wrong with the others."""

    specs: list[ScheduleSpec] = field(default_factory=list)
    errors: list[ScheduleError] = field(default_factory=list)

    def raise_first(self) -> None:
        if self.errors:
            raise self.errors[0]


def default_timezone() -> str:
    """PIKKU['SCHEDULE_TIMEZONE'], else Django's TIME_ZONE, else UTC."""
    return pikku_settings.SCHEDULE_TIMEZONE or getattr(settings, "TIME_ZONE", None) or "UTC"


def parse_missed(value: object, where: str) -> MissedTicks:
    try:
        return MissedTicks(str(value))
    except ValueError:
        choices = ", ".join(repr(m.value) for m in MissedTicks)
        raise ScheduleError(f"{where}: missed must be one of {choices}, not {value!r}") from None


def read_declarations() -> Declarations:
    """Every schedule declared in code and in settings, each checked on its own."""
    specs: dict[str, ScheduleSpec] = {}
    errors: list[ScheduleError] = []
    for definition in registry.scheduled_workflows():
        where = f"@workflow {definition.name!r}"
        try:
            cron = _parse_cron(definition.schedule, definition.timezone, where)
            specs[definition.name] = ScheduleSpec(
                definition.name,
                definition.name,
                cron,
                missed=parse_missed(pikku_settings.SCHEDULE_MISSED, "PIKKU['SCHEDULE_MISSED']"),
                origin=ScheduleOrigin.CODE,
            )
        except ScheduleError as exc:
            errors.append(exc)
    for declare in list(_builtin):
        builtin = declare()
        if builtin is not None:
            specs[builtin.name] = builtin
    raw = pikku_settings.SCHEDULES
    if not isinstance(raw, dict):
        errors.append(ScheduleError(f"PIKKU['SCHEDULES'] must be a dict by name, not {raw!r}"))
        raw = {}
    for name, options in raw.items():
        try:
            spec = _settings_spec(name, options)
        except ScheduleError as exc:
            errors.append(exc)
            continue
        if spec.name in specs:
            errors.append(
                ScheduleError(
                    f"Two schedules are named {name!r}: PIKKU['SCHEDULES'] and the workflow "
                    f"declared with schedule= (or the built-in retention job). Give the one "
                    f"in settings another name."
                )
            )
            continue
        specs[spec.name] = spec
    return Declarations(sorted(specs.values(), key=lambda s: s.name), errors)


def _parse_cron(expression: object, timezone: object, where: str) -> Cron:
    try:
        return Cron.parse(expression, timezone or default_timezone())
    except ScheduleError as exc:
        raise ScheduleError(f"{where}: {exc}") from None


def _settings_spec(name: object, options: object) -> ScheduleSpec:
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ScheduleError(
            f"PIKKU['SCHEDULES'] names must be non-empty str of at most 200 characters: {name!r}"
        )
    where = f"PIKKU['SCHEDULES'][{name!r}]"
    if not isinstance(options, dict):
        raise ScheduleError(f"{where} must be a dict with at least 'workflow' and 'cron'")
    unknown = sorted(set(options) - SETTINGS_KEYS)
    if unknown:
        raise ScheduleError(
            f"{where} has unknown key(s) {unknown}; known: {', '.join(sorted(SETTINGS_KEYS))}"
        )
    for required in ("workflow", "cron"):
        if required not in options:
            raise ScheduleError(f"{where} needs {required!r}")
    workflow = options["workflow"]
    if registry.get_workflow(workflow) is None:
        raise ScheduleError(
            f"{where} names workflow {workflow!r}, which is not registered. Registered: "
            f"{', '.join(registry.workflow_names()) or 'none'}"
        )
    cron = _parse_cron(options["cron"], options.get("timezone"), where)
    payload = options.get("input")
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{where}: input must be plain JSON ({exc})") from None
    enabled = options.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ScheduleError(f"{where}: enabled must be True or False, not {enabled!r}")
    missed = parse_missed(options.get("missed", pikku_settings.SCHEDULE_MISSED), where)
    return ScheduleSpec(name, str(workflow), cron, payload, missed, enabled)
