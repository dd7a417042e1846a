"""Admin screen for cron schedules.

Rows are recorded from the declarations (``@workflow(schedule=...)`` and
``PIKKU['SCHEDULES']``) and are read-only here. The **Enable**, **Disable** and
**Start one run now** actions need Django's "Can change schedule" permission
(``pikku_django.change_schedule``); users without it are not offered them. A
row whose declaration has gone may be deleted (with "Can delete schedule").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from pikku_django.admin.formatting import EMPTY, READING_METHODS
from pikku_django.admin.workflows import json_block
from pikku_django.models import Schedule
from pikku_django.read_database import read_database
from pikku_django.schedules import (
    ScheduleError,
    disable_schedule,
    enable_schedule,
    trigger_schedule,
)
from pikku_django.schedules.store import cron_of, database
from pikku_django.workflows.errors import WorkflowNotFoundError


def in_zone(row: Schedule, moment: datetime | None) -> str:
    """``moment`` in the schedule's time zone, to the second; a dash when empty."""
    if moment is None:
        return EMPTY
    try:
        return moment.astimezone(cron_of(row).zone).strftime("%Y-%m-%d %H:%M:%S %Z")
    except ScheduleError:
        return moment.isoformat(timespec="seconds")


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Declared schedules with their next tick and last run; switched by actions."""

    list_display = (
        "name",
        "enabled",
        "workflow",
        "when",
        "next_tick",
        "last_tick",
        "last_run",
        "missed",
        "declared",
    )
    list_filter = ("enabled", "declared", "missed", "origin")
    search_fields = ("name", "workflow")
    actions = ("enable_schedules", "disable_schedules", "trigger_schedules")
    fields = (
        "name",
        "workflow",
        "when",
        "missed",
        "enabled",
        "declared",
        "origin",
        "input_json",
        "next_tick",
        "last_tick",
        "last_run",
        "last_run_at",
        "updated_at",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        """From the read database on a page only shown; actions read the schedules'."""
        using = database()
        if request.method in READING_METHODS:
            using = read_database(using)
        return super().get_queryset(request).using(using)

    # -- who may do what --------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # schedules are declared in code or settings and recorded by sync

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # fields are never edited; the actions check has_switch_permission

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.declared:
            return False  # sync would only record it again
        return super().has_delete_permission(request, obj)

    def has_switch_permission(self, request: HttpRequest) -> bool:
        """Enable, disable and trigger: Django's "Can change schedule" permission."""
        codename = get_permission_codename("change", self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    # -- columns ----------------------------------------------------------------------

    @admin.display(description=gettext_lazy("when"))
    def when(self, obj: Schedule) -> str:
        try:
            words = cron_of(obj).describe()
        except ScheduleError as exc:
            return str(exc)
        return f"{obj.cron} ({words}, {obj.timezone})"

    @admin.display(description=gettext_lazy("next tick"), ordering="next_tick_at")
    def next_tick(self, obj: Schedule) -> str:
        return in_zone(obj, obj.next_tick_at)

    @admin.display(description=gettext_lazy("last tick"), ordering="last_tick_at")
    def last_tick(self, obj: Schedule) -> str:
        return in_zone(obj, obj.last_tick_at)

    @admin.display(description=gettext_lazy("last run"))
    def last_run(self, obj: Schedule) -> SafeString | str:
        if obj.last_run_id is None:
            return EMPTY
        url = reverse("admin:pikku_django_workflowrun_change", args=[obj.last_run_id])
        return format_html('<a href="{}">{}</a>', url, obj.last_run_id)

    @admin.display(description=gettext_lazy("input"))
    def input_json(self, obj: Schedule) -> SafeString | str:
        return json_block(obj.input)

    # -- actions ----------------------------------------------------------------------

    @admin.action(
        permissions=["switch"],
        description=gettext_lazy("Enable selected schedules (needs “Can change schedule”)"),
    )
    def enable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for row in queryset:
            try:
                result = enable_schedule(row.name)
            except ScheduleError as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
                continue
            self.message_user(
                request,
                _("%(name)s: enabled; next tick %(tick)s")
                % {"name": row.name, "tick": in_zone(result.schedule, result.schedule.next_tick_at)}
                if result.changed
                else _("%(name)s: already enabled") % {"name": row.name},
            )

    @admin.action(
        permissions=["switch"],
        description=gettext_lazy("Disable selected schedules (needs “Can change schedule”)"),
    )
    def disable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for row in queryset:
            result = disable_schedule(row.name)
            self.message_user(
                request,
                (_("%(name)s: disabled") if result.changed else _("%(name)s: already disabled"))
                % {"name": row.name},
            )

    @admin.action(
        permissions=["switch"],
        description=gettext_lazy(
            "Start one run of each selected schedule now (needs “Can change schedule”)"
        ),
    )
    def trigger_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for row in queryset:
            try:
                run = trigger_schedule(row.name)
            except WorkflowNotFoundError as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
                continue
            self.message_user(
                request, _("%(name)s: started run %(run)s") % {"name": row.name, "run": run.id}
            )
