"""Webhook trigger sources, their secrets (encrypted), and receipts of accepted events."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from pikku_django.models.fields import ReadableJSONField


class TriggerSource(models.Model):
    """What is known of one declared trigger source: its switch and its provider registration."""

    name = models.CharField(_("name"), max_length=100, primary_key=True)
    kind = models.CharField(_("kind"), max_length=20, default="webhook")
    base_url = models.URLField(_("base URL"), max_length=500, blank=True, default="")
    label_prefix = models.CharField(_("label prefix"), max_length=100, blank=True, default="")
    declared = models.BooleanField(
        _("declared"), default=True, help_text=_("false once the declaration left the code")
    )
    enabled = models.BooleanField(
        _("enabled"), default=False, help_text=_("only an enabled source receives events")
    )
    status = models.CharField(_("status"), max_length=20, blank=True, default="")
    state = models.JSONField(
        _("provider state"), null=True, blank=True, help_text=_("provider ids only")
    )
    detail = models.TextField(_("detail"), blank=True, default="")
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        db_table = "pikku_trigger_source"
        verbose_name = _("trigger source")
        verbose_name_plural = _("trigger sources")
        ordering = ("name",)

    def __str__(self) -> str:
        return f"{self.name} ({'on' if self.enabled else 'off'})"


class CredentialValue(models.Model):
    """One value of a named credential (e.g. ``githubWebhookSecret``), encrypted at rest.

    A credential may have several active values at once, so a secret can be rotated
    without dropping deliveries signed with the old one.
    """

    credential = models.CharField(_("credential"), max_length=200, db_index=True)
    ciphertext = models.TextField(_("encrypted value"))
    hint = models.CharField(
        _("hint"), max_length=20, blank=True, default="", help_text=_("the last characters")
    )
    active = models.BooleanField(_("active"), default=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        db_table = "pikku_credential_value"
        verbose_name = _("credential value")
        verbose_name_plural = _("credential values")
        ordering = ("credential", "-created_at")

    def __str__(self) -> str:
        return f"{self.credential} …{self.hint}"


class WebhookReceiptQuerySet(models.QuerySet["WebhookReceipt"]):
    """Receipts by what became of their event (read-only; the intake writes them)."""

    def waiting(self) -> WebhookReceiptQuerySet:
        """Receipts whose run a worker has yet to start (not those set aside)."""
        return self.filter(run_id__isnull=True, input__isnull=False, set_aside="")

    def dealt_with(self) -> WebhookReceiptQuerySet:
        """Receipts no longer waiting: their run started, or set aside."""
        return self.exclude(run_id__isnull=True, input__isnull=False, set_aside="")

    def set_aside(self) -> WebhookReceiptQuerySet:
        """Receipts a worker set aside instead of starting their run."""
        return self.exclude(set_aside="")


class WebhookReceipt(models.Model):
    """An accepted webhook event, once per (source, event, provider id).

    The request stores the event here, with the input of the run it is to start;
    a worker starts that run and then links it (``run``), and the input moves to
    the run, so the event's data is kept once. A receipt whose run cannot be started
    (its input cannot be read back, or the run refused it) is set aside instead: it
    keeps its input, says why in ``set_aside``, and waits no more.
    """

    source = models.CharField(_("source"), max_length=100)
    event = models.CharField(_("event"), max_length=200)
    provider_id = models.CharField(_("provider event id"), max_length=255)
    # The run that handled the event. A receipt outlives it (it still refuses a
    # redelivery after the run is pruned), so no constraint ties them and the id stays.
    run = models.ForeignKey(
        "pikku_django.WorkflowRun",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        null=True,
        blank=True,
        related_name="webhook_receipts",
        verbose_name=_("dispatch run"),
    )
    received_at = models.DateTimeField(_("received"), auto_now_add=True, db_index=True)
    # The workflow the event starts, and that run's input until a worker starts it.
    workflow = models.CharField(_("workflow"), max_length=200, blank=True, default="")
    # Loads even when Python cannot read it back (then an UnreadableJSON).
    input = ReadableJSONField(_("run input"), null=True, blank=True, finite_floats=True)
    set_aside = models.CharField(
        _("set aside"),
        max_length=500,
        blank=True,
        default="",
        db_default="",  # the receipt's INSERT (webhooks/sql.py) leaves it out
        help_text=_("why a worker set the event aside instead of starting its run"),
    )

    objects = WebhookReceiptQuerySet.as_manager()

    class Meta:
        db_table = "pikku_webhook_receipt"
        verbose_name = _("webhook receipt")
        verbose_name_plural = _("webhook receipts")
        ordering = ("-received_at",)
        constraints = (
            models.UniqueConstraint(
                fields=("source", "event", "provider_id"), name="pikku_receipt_once"
            ),
        )
        # Receipts waiting for their run (run_id IS NULL), oldest first.
        indexes = (models.Index(fields=("run", "id"), name="pikku_receipt_waiting"),)

    def __str__(self) -> str:
        return f"{self.source}:{self.event} {self.provider_id}"

    @property
    def waiting(self) -> bool:
        """Whether the event's run has yet to be started by a worker."""
        return self.run_id is None and self.input is not None and not self.set_aside


class WebhookDigest(models.Model):
    """A signed request a source accepted, by the digest of its signed bytes.

    Kept for schemes that sign no timestamp checked against a replay window (GitHub,
    Shopify, SendGrid without one): the same signed bytes are never accepted twice by
    a source, whatever unsigned delivery id comes with them. A digest outlives the
    receipts of its events, for ``PIKKU["WEBHOOK_DIGEST_RETENTION"]``.
    """

    source = models.CharField(_("source"), max_length=100)
    digest = models.CharField(_("SHA-256 of the signed bytes"), max_length=64)
    received_at = models.DateTimeField(_("received"), db_index=True)

    class Meta:
        db_table = "pikku_webhook_digest"
        verbose_name = _("webhook digest")
        verbose_name_plural = _("webhook digests")
        ordering = ("-received_at",)
        constraints = (
            models.UniqueConstraint(fields=("source", "digest"), name="pikku_digest_once"),
        )

    def __str__(self) -> str:
        return f"{self.source} sha256:{self.digest}"
