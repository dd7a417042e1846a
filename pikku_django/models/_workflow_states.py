"""The statuses and kinds of workflow runs, steps and attempts."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class RunStatus(models.TextChoices):
    RUNNING = "running", _("running")
    SUSPENDED = "suspended", _("suspended")
    COMPLETED = "completed", _("completed")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


TERMINAL_RUN_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class StepStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    SCHEDULED = "scheduled", _("scheduled")
    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    SUSPENDED = "suspended", _("suspended")


#: The statuses of a step waiting for a worker to claim it (once it is due).
WAITING_STEP_STATUSES = (StepStatus.SCHEDULED, StepStatus.PENDING)

#: The statuses a queued step may be claimed in (the pikku_step_claim_order index's
#: condition, which the claim repeats so that its plan can read that index).
CLAIMABLE_STATUSES = ("scheduled", "pending", "failed", "running")


class AttemptStatus(models.TextChoices):
    """An attempt's status: its step's, or ``superseded`` once a later claim replaced it."""

    PENDING = "pending", _("pending")
    SCHEDULED = "scheduled", _("scheduled")
    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    SUSPENDED = "suspended", _("suspended")
    SUPERSEDED = "superseded", _("superseded")


class StepKind(models.TextChoices):
    QUEUED = "queued", _("queued function")
    INLINE = "inline", _("inline function")
    SLEEP = "sleep", _("sleep")
    SUSPEND = "suspend", _("suspend")
    CHILD = "child", _("child workflow")
    EVENT = "event", _("wait for an event")
    PUBLISH = "publish", _("published value")
    PATCH = "patch", _("patch marker")
    PARALLEL = "parallel", _("parallel group")


class Backoff(models.TextChoices):
    FIXED = "fixed", _("fixed")
    EXPONENTIAL = "exponential", _("exponential")
