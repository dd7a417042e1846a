"""The rate slots of rate-limited queues, taken by every worker's claim."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class QueueClaim(models.Model):
    """One of a rated queue's ``count`` slots, stamped with the store's time of the
    last claim that used it (see ``pikku_django.workflows.control._rates``).

    A slot is free again one period after its stamp; a queue has at most as many
    slots as its rate's count.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(_("queue"), max_length=100)
    slot = models.PositiveIntegerField(_("slot"), default=0)
    claimed_ms = models.BigIntegerField(_("claimed at (epoch ms)"))

    class Meta:
        db_table = "pikku_queue_claim"
        verbose_name = _("queue claim")
        verbose_name_plural = _("queue claims")
        indexes = (models.Index(fields=("queue", "claimed_ms"), name="pikku_queue_claim_time"),)
        constraints = (
            models.UniqueConstraint(fields=("queue", "slot"), name="pikku_queue_claim_slot"),
        )

    def __str__(self) -> str:
        return f"{self.queue} slot {self.slot} at {self.claimed_ms}"
