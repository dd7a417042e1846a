"""The recent claims of rate-limited queues, counted by every worker's claim."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class QueueClaim(models.Model):
    """One claim of a step from a queue that declares a ``rate``, at the store's time.

    A claim counts against its queue's rate for one period; older rows are deleted
    by the next claim from the queue.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(_("queue"), max_length=100)
    claimed_ms = models.BigIntegerField(_("claimed at (epoch ms)"))

    class Meta:
        db_table = "pikku_queue_claim"
        verbose_name = _("queue claim")
        verbose_name_plural = _("queue claims")
        indexes = (models.Index(fields=("queue", "claimed_ms"), name="pikku_queue_claim_time"),)

    def __str__(self) -> str:
        return f"{self.queue} at {self.claimed_ms}"
