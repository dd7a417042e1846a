"""The lease table used by the database lease backend."""

from __future__ import annotations

import time

from django.db import models
from django.utils.translation import gettext_lazy as _


class Lease(models.Model):
    """One named lease: who holds it, its fencing token, and when it lapses.

    Rows are never deleted: releasing a lease sets ``expires_at`` to 0 and keeps
    ``token``, so the next holder's token is always higher.
    """

    key = models.CharField(_("key"), max_length=255, primary_key=True)
    holder = models.CharField(_("holder"), max_length=255)
    token = models.BigIntegerField(_("fencing token"))
    expires_at = models.BigIntegerField(_("expires at (epoch ms)"), help_text=_("0 once released"))

    class Meta:
        db_table = "pikku_lease"
        verbose_name = _("lease")
        verbose_name_plural = _("leases")
        ordering = ("key",)

    def __str__(self) -> str:
        return f"{self.key} held by {self.holder} (token {self.token})"

    @property
    def is_live(self) -> bool:
        """Whether the lease has not lapsed, judged on this process's clock."""
        return self.expires_at > int(time.time() * 1000)
