"""Queue rate limits: at most ``count`` claims per period, across every worker.

Each claim from a rated queue is one :class:`~pikku_django.models.QueueClaim`
row stamped with the store's clock as it is written (after the claim), and a
claim is made only while fewer than ``count`` rows are younger than the period,
counted before it. Both run inside the claim's transaction, under the queue's
claim lock, so no two workers count the same free slot: any ``count + 1``
claims of a queue are at least one period apart.
"""

from __future__ import annotations

import random

from django.db.models import BigIntegerField, ExpressionWrapper, Value
from django.db.models.expressions import CombinedExpression

from pikku_django.dbclock import EpochMs
from pikku_django.models import QueueClaim
from pikku_django.workflows.queues import Rate
from pikku_django.workflows.store import WorkflowStore

#: About one look at a queue's rate in this many deletes the claims that no longer
#: count (they are never counted, so they only take room until then).
PRUNE_EVERY = 20


def _period_start(rate: Rate) -> ExpressionWrapper[CombinedExpression]:
    """The store's now less one period, in epoch ms."""
    return ExpressionWrapper(
        EpochMs() - Value(int(rate.per_seconds * 1000)), output_field=BigIntegerField()
    )


def free_claims(store: WorkflowStore, queue: str, rate: Rate) -> int:
    """How many claims ``queue`` may make now; now and then (one look in
    :data:`PRUNE_EVERY`) claims older than a period are deleted too."""
    if random.random() < 1 / PRUNE_EVERY:
        prune_claims(store, queue, rate)
    return max(rate.count - recent_claims(store, queue, rate), 0)


def prune_claims(store: WorkflowStore, queue: str, rate: Rate) -> int:
    """Delete the claims of ``queue`` that no longer count against its rate: how many."""
    old = QueueClaim.objects.using(store.using).filter(
        queue=queue, claimed_ms__lte=_period_start(rate)
    )
    return int(old.delete()[0])


def record_claim(store: WorkflowStore, queue: str) -> None:
    """Count one claim of ``queue`` against its rate, at the store's now."""
    QueueClaim.objects.using(store.using).create(queue=queue, claimed_ms=EpochMs())


def recent_claims(store: WorkflowStore, queue: str, rate: Rate) -> int:
    """How many claims of ``queue`` count against its rate now (for the admin)."""
    return (
        QueueClaim.objects.using(store.using)
        .filter(queue=queue, claimed_ms__gt=_period_start(rate))
        .count()
    )
