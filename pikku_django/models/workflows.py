"""Workflow runs, their steps, and the history of every step attempt."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from pikku_django.models._workflow_queries import (
    StepAttemptQuerySet,
    WorkflowRunQuerySet,
    WorkflowStepQuerySet,
)
from pikku_django.models._workflow_states import (
    CLAIMABLE_STATUSES,
    TERMINAL_RUN_STATUSES,
    WAITING_STEP_STATUSES,
    AttemptStatus,
    Backoff,
    RunStatus,
    StepKind,
    StepStatus,
)
from pikku_django.models.fields import ReadableJSONField

__all__ = [
    "CLAIMABLE_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "WAITING_STEP_STATUSES",
    "AttemptStatus",
    "Backoff",
    "RunStatus",
    "StepAttempt",
    "StepAttemptQuerySet",
    "StepKind",
    "StepStatus",
    "WorkflowRun",
    "WorkflowRunQuerySet",
    "WorkflowStep",
    "WorkflowStepQuerySet",
]


class WorkflowRun(models.Model):
    """One execution of a workflow function, from start to a terminal status."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.CharField(_("workflow"), max_length=200)
    status = models.CharField(
        _("status"), max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING
    )
    input = ReadableJSONField(_("input"), null=True, blank=True)
    output = ReadableJSONField(_("output"), null=True, blank=True)
    error = ReadableJSONField(
        _("error"), null=True, blank=True, help_text=_("type, message and traceback")
    )
    suspend_reason = models.TextField(_("suspend reason"), blank=True, default="")
    inline = models.BooleanField(_("inline"), default=False)
    # NULL, not "", when absent: runs without a key never collide on the unique constraint.
    idempotency_key = models.CharField(  # noqa: DJ001
        _("idempotency key"), max_length=255, null=True, blank=True
    )
    wake_at = models.DateTimeField(
        _("next orchestration"),
        null=True,
        blank=True,
        help_text=_("when the run next needs an orchestration pass; empty while it waits"),
    )
    wakes = models.BigIntegerField(
        _("wake count"), default=0, help_text=_("raised each time something wakes the run")
    )
    priority = models.SmallIntegerField(
        _("priority"),
        default=0,
        db_default=0,
        help_text=_("-100 to 100: higher is claimed first; its steps inherit it"),
    )
    queue = models.CharField(
        _("queue"),
        max_length=100,
        blank=True,
        default="",
        db_default="",
        help_text=_("the queue of its steps that name none; empty: the default queue"),
    )
    start_at = models.DateTimeField(
        _("start at"),
        null=True,
        blank=True,
        help_text=_("its first pass is not claimed before this time"),
    )
    # NULL when the run has no key: only runs sharing a key limit each other.
    concurrency_key = models.CharField(  # noqa: DJ001
        _("concurrency key"),
        max_length=255,
        null=True,
        blank=True,
        help_text=_("runs sharing this key run at most their concurrency limit at a time"),
    )
    concurrency_limit = models.PositiveSmallIntegerField(
        _("concurrency limit"),
        default=1,
        db_default=1,
        help_text=_("how many runs of its concurrency key may be in progress at once"),
    )
    key_waiting = models.BooleanField(
        _("waiting for its key"),
        default=False,
        db_default=False,
        help_text=_("not started yet: its concurrency key has no free slot"),
    )
    pass_errors = models.PositiveIntegerField(
        _("pass errors"),
        default=0,
        db_default=0,
        help_text=_("orchestration passes in a row that a data or programming error ended"),
    )
    deadline_at = models.DateTimeField(
        _("deadline"),
        null=True,
        blank=True,
        help_text=_("the run fails with WorkflowTimeoutError if it has not ended by then"),
    )
    trace_context = ReadableJSONField(
        _("trace context"),
        null=True,
        blank=True,
        editable=False,
        help_text=_("the W3C trace headers of the code that started the run (OpenTelemetry)"),
    )
    version = models.CharField(
        _("version"),
        max_length=64,
        blank=True,
        default="",
        db_default="",
        help_text=_("the workflow version (declared, or a hash of its code) it started under"),
    )
    published = ReadableJSONField(
        _("published values"),
        null=True,
        blank=True,
        editable=False,
        help_text=_("the values the run set with ctx.set_event, by name"),
    )
    first_step = ReadableJSONField(
        _("first step"),
        null=True,
        blank=True,
        editable=False,
        help_text=_(
            "the queued step its first pass will reach, found when it started; a worker "
            "that claims the run may store it claimed and skip that pass (cleared then)"
        ),
    )
    forked_from = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        editable=False,
        related_name="forks",
        verbose_name=_("forked from"),
        help_text=_("the run this one re-runs from a step (see fork_run)"),
    )
    forked_at_step = models.CharField(
        _("forked at step"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text=_("the step of the original run this one was re-run from"),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    objects = WorkflowRunQuerySet.as_manager()

    class Meta:
        db_table = "pikku_workflow_run"
        verbose_name = _("workflow run")
        verbose_name_plural = _("workflow runs")
        ordering = ("-created_at",)
        constraints = (
            models.UniqueConstraint(
                fields=("workflow", "idempotency_key"), name="pikku_run_idempotency_key"
            ),
        )
        # Lookups by workflow use the idempotency key's unique index, which starts with it.
        indexes = (
            models.Index(fields=("status", "wake_at"), name="pikku_run_due"),
            models.Index(fields=("created_at",), name="pikku_run_created"),
            # Claiming due runs: running worker runs by when they are due.
            models.Index(
                fields=("wake_at",),
                name="pikku_run_wake",
                condition=models.Q(status="running", inline=False),
            ),
            # Runs past their deadline: open runs that have one, by when.
            models.Index(
                fields=("deadline_at",),
                name="pikku_run_deadline",
                condition=models.Q(status__in=("running", "suspended"), deadline_at__isnull=False),
            ),
            # The stalled-run sweep: running runs nothing has woken, by last change.
            models.Index(
                fields=("updated_at",),
                name="pikku_run_idle",
                condition=models.Q(status="running", wake_at__isnull=True),
            ),
            # Per-key concurrency: a key's runs in progress, and the runs waiting for
            # a slot, in start order.
            models.Index(fields=("concurrency_key", "status"), name="pikku_run_key"),
            models.Index(fields=("key_waiting", "created_at"), name="pikku_run_key_waiting"),
            # Pruning: settled runs by last change, oldest first. Running runs, which
            # change on every pass, are not in it. Declared as an expression (a bare
            # column all the same) so that MariaDB, which has no expression indexes
            # and would drop the condition, leaves it out rather than index every
            # run's updated_at again: pikku_run_settled_status serves it there.
            models.Index(
                models.F("updated_at"),
                name="pikku_run_settled",
                condition=models.Q(status__in=TERMINAL_RUN_STATUSES),
            ),
            # Pruning where partial indexes are unavailable (MariaDB, MySQL), which
            # drop the condition. Elsewhere no run meets it and it stays empty.
            models.Index(
                fields=("status", "updated_at"),
                name="pikku_run_settled_status",
                condition=models.Q(id__isnull=True),
            ),
        )

    def __str__(self) -> str:
        return f"{self.workflow} {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES


class WorkflowStep(models.Model):
    """One memoised step of a run: a function call, a sleep, a suspension or a child run."""

    #: Not indexed alone: the unique (run, name) index begins with it.
    run = models.ForeignKey(
        WorkflowRun,
        on_delete=models.CASCADE,
        related_name="steps",
        verbose_name=_("run"),
        db_index=False,
    )
    name = models.CharField(_("step name"), max_length=255)
    kind = models.CharField(_("kind"), max_length=16, choices=StepKind.choices)
    function = models.CharField(_("function"), max_length=255, blank=True, default="")
    input = ReadableJSONField(_("input"), null=True, blank=True)
    status = models.CharField(
        _("status"), max_length=16, choices=StepStatus.choices, default=StepStatus.PENDING
    )
    result = ReadableJSONField(_("result"), null=True, blank=True)
    error = ReadableJSONField(_("error"), null=True, blank=True)
    retries = models.PositiveIntegerField(_("retries"), default=5)
    retry_delay = models.FloatField(_("retry delay (s)"), default=0)
    backoff = models.CharField(
        _("backoff"), max_length=16, choices=Backoff.choices, default=Backoff.FIXED
    )
    attempt = models.PositiveIntegerField(_("current attempt"), default=0)
    lease_expires_at = models.BigIntegerField(
        _("lease expires at (epoch ms)"), null=True, blank=True
    )
    #: The fencing number of the step's latest claim: every claim sets a higher one
    #: (on PostgreSQL never below the first lease token of the server's timeline), and
    #: every write of a claimed attempt must carry it.
    claim_token = models.BigIntegerField(
        _("claim token"),
        default=0,
        db_default=0,
        editable=False,
        help_text=_("the fencing number of the step's latest claim"),
    )
    child_run = models.ForeignKey(
        WorkflowRun,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="parent_steps",
        verbose_name=_("child run"),
    )
    queue = models.CharField(_("queue"), max_length=100, default="default")
    priority = models.SmallIntegerField(
        _("priority"), default=0, db_default=0, help_text=_("its run's priority")
    )
    transactional = models.BooleanField(_("transactional"), default=False)
    timeout = models.FloatField(
        _("timeout (s)"),
        null=True,
        blank=True,
        help_text=_("how long one attempt may run before it is failed as timed out"),
    )
    available_at = models.DateTimeField(_("available at"), null=True, blank=True)
    #: A branch's parallel group (a step of kind ``parallel`` of the same run).
    group = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="branches",
        verbose_name=_("parallel group"),
    )
    #: A parallel group's child branches not settled yet: the last one wakes the run.
    open_branches = models.IntegerField(_("open child branches"), default=0, db_default=0)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    objects = WorkflowStepQuerySet.as_manager()

    class Meta:
        db_table = "pikku_workflow_step"
        verbose_name = _("workflow step")
        verbose_name_plural = _("workflow steps")
        ordering = ("run", "id")
        constraints = (models.UniqueConstraint(fields=("run", "name"), name="pikku_step_name"),)
        indexes = (
            # Every claim and settle rewrites a step in each index it is in: the
            # indexes below hold only the steps that their looks read.
            #
            # For databases without partial indexes (MariaDB, MySQL), which drop
            # every condition here: their looks for ready steps by queue. Elsewhere
            # a condition no step meets leaves it empty (the partial indexes below
            # serve those looks).
            models.Index(
                fields=("queue", "status", "available_at"),
                name="pikku_step_ready",
                condition=models.Q(id__isnull=True),
            ),
            models.Index(fields=("status", "lease_expires_at"), name="pikku_step_lease"),
            # Each branch of the ready rule, and the next due time, over queued steps
            # that may still run: succeeded steps (most rows) are in none of them.
            models.Index(
                fields=("available_at",),
                name="pikku_step_due",
                condition=models.Q(kind="queued", status__in=("scheduled", "pending")),
            ),
            models.Index(
                fields=("available_at",),
                name="pikku_step_retry_due",
                condition=models.Q(kind="queued", status="failed"),
            ),
            models.Index(
                fields=("lease_expires_at",),
                name="pikku_step_held",
                condition=models.Q(kind="queued", status="running"),
            ),
            # The claim's order over queued steps that may be ready: highest
            # priority first, first in first out within one.
            models.Index(
                models.F("priority").desc(),
                "id",
                name="pikku_step_claim_order",
                condition=models.Q(kind="queued", status__in=CLAIMABLE_STATUSES),
            ),
            # Suspensions with a timeout, by when they time out.
            models.Index(
                fields=("available_at",),
                name="pikku_step_suspend_due",
                condition=models.Q(kind="suspend", status="suspended", available_at__isnull=False),
            ),
            # A run's steps that are not done yet (the stalled-run sweep's look).
            models.Index(
                fields=("run",),
                name="pikku_step_open",
                condition=models.Q(
                    status__in=("scheduled", "pending", "suspended", "failed", "running")
                ),
            ),
        )

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @property
    def attempts_allowed(self) -> int:
        return self.retries + 1


class StepAttempt(models.Model):
    """One attempt of a step: kept as it was, also after later attempts replace it."""

    step = models.ForeignKey(
        WorkflowStep, on_delete=models.CASCADE, related_name="attempts", verbose_name=_("step")
    )
    attempt = models.PositiveIntegerField(_("attempt"))
    status = models.CharField(
        _("status"), max_length=16, choices=AttemptStatus.choices, default=AttemptStatus.RUNNING
    )
    result = ReadableJSONField(_("result"), null=True, blank=True)
    error = ReadableJSONField(_("error"), null=True, blank=True)
    worker = models.CharField(_("worker"), max_length=255, blank=True, default="")
    #: When the attempt was claimed: a claim sets it to the instant its lease starts from,
    #: so that a lease capped at the step's timeout never lapses before the timeout does.
    started_at = models.DateTimeField(_("started"), default=timezone.now, editable=False)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)

    objects = StepAttemptQuerySet.as_manager()

    class Meta:
        db_table = "pikku_step_attempt"
        verbose_name = _("step attempt")
        verbose_name_plural = _("step attempts")
        ordering = ("step", "attempt")
        constraints = (
            models.UniqueConstraint(fields=("step", "attempt"), name="pikku_attempt_number"),
        )

    def __str__(self) -> str:
        return f"{self.step.name} attempt {self.attempt} ({self.status})"
