"""Events sent to workflow runs: kept until a ``ctx.wait_for_event`` takes them."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from pikku_django.models.fields import ReadableJSONField
from pikku_django.models.workflows import WorkflowRun, WorkflowStep


class WorkflowEvent(models.Model):
    """One event sent to a run, unique per run and event id."""

    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="events", verbose_name=_("run")
    )
    name = models.CharField(_("event name"), max_length=200)
    event_id = models.CharField(_("event id"), max_length=255)
    data = ReadableJSONField(_("data"), null=True, blank=True)
    step = models.OneToOneField(
        WorkflowStep,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="event",
        verbose_name=_("taken by step"),
        help_text=_("the wait that got the event; empty while it is kept for a later wait"),
    )
    created_at = models.DateTimeField(_("sent"), auto_now_add=True)

    class Meta:
        db_table = "pikku_workflow_event"
        verbose_name = _("workflow event")
        verbose_name_plural = _("workflow events")
        ordering = ("run", "id")
        constraints = (models.UniqueConstraint(fields=("run", "event_id"), name="pikku_event_id"),)
        indexes = (
            # A wait's look for the oldest event of its name that no wait took.
            models.Index(
                fields=("run", "name", "id"),
                name="pikku_event_kept",
                condition=models.Q(step__isnull=True),
            ),
        )

    def __str__(self) -> str:
        return f"{self.name} {self.event_id}"
