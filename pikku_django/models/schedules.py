"""Cron schedules: one row per declared schedule, with its next and last tick."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from pikku_django.models.fields import ReadableJSONField


class MissedTicks(models.TextChoices):
    """What a schedule does with ticks that passed while no worker was up."""

    LATEST = "latest", _("start the latest missed tick once")
    ALL = "all", _("start every missed tick (up to SCHEDULE_CATCHUP_LIMIT)")
    NONE = "none", _("start none of them")


class ScheduleOrigin(models.TextChoices):
    CODE = "code", _("@workflow(schedule=...)")
    SETTINGS = "settings", _("PIKKU['SCHEDULES']")


class Schedule(models.Model):
    """A cron schedule that starts one run of its workflow on each tick."""

    name = models.CharField(_("name"), max_length=200, unique=True)
    workflow = models.CharField(_("workflow"), max_length=200)
    cron = models.CharField(_("cron expression"), max_length=200)
    timezone = models.CharField(_("time zone"), max_length=64)
    input = ReadableJSONField(_("input"), null=True, blank=True)
    missed = models.CharField(
        _("missed ticks"), max_length=16, choices=MissedTicks.choices, default=MissedTicks.LATEST
    )
    origin = models.CharField(_("declared in"), max_length=16, choices=ScheduleOrigin.choices)
    declared = models.BooleanField(
        _("declared"), default=True, help_text=_("false once the declaration has gone")
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    declared_enabled = models.BooleanField(
        _("declared enabled"),
        default=True,
        help_text=_("the declaration's enabled value at the last sync; a change to it wins once"),
    )
    next_tick_at = models.DateTimeField(
        _("next tick"),
        null=True,
        blank=True,
        help_text=_("empty while disabled or no longer declared"),
    )
    last_tick_at = models.DateTimeField(_("last tick"), null=True, blank=True)
    last_run_id = models.UUIDField(_("last run"), null=True, blank=True)
    last_run_at = models.DateTimeField(_("last run started"), null=True, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        db_table = "pikku_schedule"
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering = ("name",)
        indexes = (models.Index(fields=("next_tick_at",), name="pikku_schedule_due"),)

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"
