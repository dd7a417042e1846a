"""The heartbeat each worker process records, so operators see which workers are alive."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class WorkerHeartbeat(models.Model):
    """The last word of one worker process: what it serves and when it was last seen."""

    worker_id = models.CharField(_("worker"), max_length=255, primary_key=True)
    hostname = models.CharField(_("host"), max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(_("process id"), null=True, blank=True)
    version = models.CharField(_("version"), max_length=50, blank=True, default="")
    queues = models.JSONField(_("queues"), default=list, blank=True)
    concurrency = models.PositiveIntegerField(_("concurrency"), default=1)
    running = models.PositiveIntegerField(
        _("steps in hand"), default=0, help_text=_("steps the worker was running when seen")
    )
    started_at = models.DateTimeField(_("started"))
    seen_at = models.DateTimeField(_("last seen"), db_index=True)
    stopped_at = models.DateTimeField(
        _("stopped"), null=True, blank=True, help_text=_("set when the worker shut down cleanly")
    )

    class Meta:
        db_table = "pikku_worker_heartbeat"
        verbose_name = _("worker heartbeat")
        verbose_name_plural = _("worker heartbeats")
        ordering = ("-seen_at",)

    def __str__(self) -> str:
        return self.worker_id
