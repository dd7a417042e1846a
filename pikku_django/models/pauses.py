"""Paused queues: while a queue has a row here, no worker claims its steps."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class QueuePause(models.Model):
    """A paused queue: since when, by whom and why (see
    ``pikku_django.workflows.control.pauses``).

    Every claim of a queued step checks this table in the statement that takes the
    step, so a pause holds across every worker and survives restarts; resuming the
    queue deletes its row.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(_("queue"), max_length=100, unique=True)
    paused_at = models.DateTimeField(_("paused at"), default=timezone.now)
    paused_by = models.CharField(_("paused by"), max_length=150, blank=True, default="")
    reason = models.TextField(_("reason"), blank=True, default="")

    class Meta:
        db_table = "pikku_queue_pause"
        verbose_name = _("queue pause")
        verbose_name_plural = _("queue pauses")

    def __str__(self) -> str:
        return f"{self.queue} paused since {self.paused_at:%Y-%m-%d %H:%M:%S}"
