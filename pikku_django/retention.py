"""Retention: the workers delete settled runs past their age, with no cron job to write.

``PIKKU["RETENTION"]`` (None: keep for ever) is the age after which a settled run is
deleted, and ``@workflow(retention=...)`` a workflow's own ("forever" keeps its runs).
While either is set, the schedule ``pikku.retention`` starts the ``pikku.retention``
workflow hourly through the workers' cron intake; its step deletes what has aged, in
batches of ``pikku_prune``'s size, by the rule ``pikku_prune`` deletes by
(:func:`~pikku_django.workflows.runs._pruning.settled_runs`): never a run still going, nor
one a live parent waits on. Webhook receipts and the heartbeats of workers gone are
deleted after the default retention, as ``pikku_prune`` deletes them, and webhook
digests after ``PIKKU["WEBHOOK_DIGEST_RETENTION"]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from pikku_django.conf import pikku_settings
from pikku_django.heartbeats import prune_heartbeats
from pikku_django.models import WebhookDigest, WebhookReceipt
from pikku_django.models.schedules import MissedTicks, ScheduleOrigin
from pikku_django.schedules.cron import Cron
from pikku_django.schedules.declarations import ScheduleSpec, register_builtin_schedule
from pikku_django.webhooks.digests import expired_digests
from pikku_django.workflows import registry
from pikku_django.workflows.config import check_retention, engine_config
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.runs._pruning import (
    BATCH_SIZE,
    delete_runs_and_leases,
    in_batches,
    old_receipts,
    settled_runs,
)

#: The built-in schedule and workflow that apply retention, and the step of their runs.
RETENTION_WORKFLOW = "pikku.retention"
RETENTION_STEP = "pikku.retention.prune"
#: When the schedule ticks: hourly, at minute 0 UTC.
RETENTION_CRON = "0 * * * *"
#: How long the retention job's own runs are kept.
OWN_RETENTION = "7d"


def default_retention() -> float | None:
    """``PIKKU["RETENTION"]`` in seconds (None: kept for ever); ImproperlyConfigured
    saying what is wrong when it is not a duration above 0."""
    value = pikku_settings.RETENTION
    if value is None:
        return None
    seconds = check_retention(value, "PIKKU['RETENTION']")
    return None if math.isinf(seconds) else seconds


@dataclass(frozen=True)
class RetentionPolicy:
    """How long settled runs are kept: by default, and per workflow (``math.inf``: for ever)."""

    default: float | None = None
    workflows: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_settings(cls) -> RetentionPolicy:
        """``PIKKU["RETENTION"]`` and the ``retention=`` of every registered workflow."""
        return cls(default_retention(), registry.retained_workflows())

    @property
    def in_effect(self) -> bool:
        """Whether anything the project declared is ever deleted (the job's own runs aside)."""
        own = {RETENTION_WORKFLOW}
        return self.default is not None or any(
            not math.isinf(seconds) for name, seconds in self.workflows.items() if name not in own
        )


@dataclass(frozen=True)
class RetentionReport:
    """What one pass of retention deleted, and whether its time ran out first."""

    runs: int = 0
    receipts: int = 0
    heartbeats: int = 0
    digests: int = 0
    more: bool = False


def apply_retention(
    *,
    using: str | None = None,
    now: datetime | None = None,
    batch_size: int = BATCH_SIZE,
    seconds: float | None = None,
    policy: RetentionPolicy | None = None,
) -> RetentionReport:
    """Delete what ``policy`` (default: the settings') says has aged, ``batch_size``
    rows a transaction; after ``seconds`` (None: no limit) it stops after the batch it
    is in (each kind of row gets one at least), and the report says ``more``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size!r}")
    alias = using or pikku_settings.WORKFLOW_DATABASE
    now = now or timezone.now()
    policy = policy or RetentionPolicy.from_settings()
    deadline = None if seconds is None else time.monotonic() + seconds
    cut_short = False

    def more() -> bool:
        nonlocal cut_short
        if deadline is not None and time.monotonic() >= deadline:
            cut_short = True
        return not cut_short

    def runs_past(**which: Any) -> Callable[[float], int]:
        def delete(age: float) -> int:
            queryset = settled_runs(alias, now - timedelta(seconds=age), **which)
            return in_batches(
                queryset,
                batch_size,
                alias,
                "runs",
                lambda ids: delete_runs_and_leases(alias, ids),
                more=more,
            )

        return delete

    runs = sum(
        runs_past(workflows=[name])(age)
        for name, age in sorted(policy.workflows.items())
        if not math.isinf(age)
    )
    receipts = heartbeats = 0
    if policy.default is not None:
        runs += runs_past(excluding=sorted(policy.workflows))(policy.default)
        cutoff = now - timedelta(seconds=policy.default)
        receipts = in_batches(
            old_receipts(alias, cutoff),
            batch_size,
            alias,
            "webhook receipts",
            lambda ids: WebhookReceipt.objects.using(alias).filter(pk__in=ids).delete(),
            more=more,
        )
        heartbeats = prune_heartbeats(timedelta(seconds=policy.default), using=alias, now=now)
    digests = in_batches(
        expired_digests(alias, now),
        batch_size,
        alias,
        "webhook digests",
        lambda ids: WebhookDigest.objects.using(alias).filter(pk__in=ids).delete(),
        more=more,
    )
    return RetentionReport(runs, receipts, heartbeats, digests, cut_short)


@registry.step(name=RETENTION_STEP)
def prune_aged(data: Any) -> dict[str, Any]:
    """One step of the retention job: deletes for at most half a step lease (the next
    step goes on), so no other worker takes the step over while it deletes."""
    options = data if isinstance(data, dict) else {}
    budget = engine_config().step_lease_ms / 2000
    report = apply_retention(
        using=options.get("database"),
        batch_size=int(options.get("batch_size") or BATCH_SIZE),
        seconds=budget,
    )
    return asdict(report)


@registry.workflow(name=RETENTION_WORKFLOW, retention=OWN_RETENTION)
def retention_job(ctx: WorkflowContext, input: Any) -> dict[str, int]:
    """Deletes what has aged, a step at a time until nothing is left: the counts."""
    totals = {"runs": 0, "receipts": 0, "heartbeats": 0, "digests": 0}
    turn = 1
    while True:
        done = ctx.do(f"prune-{turn}", RETENTION_STEP, input)
        for key in totals:
            totals[key] += int(done[key])
        if not done["more"]:
            return totals
        turn += 1


def retention_schedule() -> ScheduleSpec | None:
    """The built-in hourly schedule of the retention job, while retention is in effect
    (None when nothing is ever deleted, or PIKKU["RETENTION"] is wrong: the system
    check reports that)."""
    try:
        policy = RetentionPolicy.from_settings()
    except ImproperlyConfigured:
        return None
    if not policy.in_effect:
        return None
    return ScheduleSpec(
        RETENTION_WORKFLOW,
        RETENTION_WORKFLOW,
        Cron.parse(RETENTION_CRON, "UTC"),
        missed=MissedTicks.LATEST,
        origin=ScheduleOrigin.CODE,
    )


register_builtin_schedule(retention_schedule)
