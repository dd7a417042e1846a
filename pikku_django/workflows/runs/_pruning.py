"""What ``pikku_prune`` and the retention job delete: settled runs, each batch read off
an index, in transactions of at most a batch each.

The runs are selected oldest change first from ``pikku_run_settled`` (PostgreSQL,
SQLite) or ``pikku_run_settled_status`` (MariaDB, MySQL), so a batch reads about as
many runs as it deletes however many recent runs there are. Their steps, attempts
and events go with them through each table's foreign key index.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, F, Lookup, OuterRef, QuerySet

from pikku_django.models import TERMINAL_RUN_STATUSES, WebhookReceipt, WorkflowRun, WorkflowStep
from pikku_django.workflows.store import store_for

logger = logging.getLogger("pikku_django.prune")

#: Rows deleted per transaction, by ``pikku_prune`` (``--batch-size``) and the retention job.
BATCH_SIZE = 500

_WORD = re.compile(r"[a-z_]+")
_SETTLED = [status.value for status in TERMINAL_RUN_STATUSES]


class InLiterals(Lookup):
    """``column IN ('a', 'b')`` with the values written into the statement.

    A partial index whose condition is ``column IN (...)`` serves only statements
    the planner can prove that condition from: not from parameters in a prepared
    statement's generic plan, nor in SQLite's. The values are fixed words.
    """

    lookup_name = "in_literals"
    prepare_rhs = False

    def __init__(self, lhs: Any, rhs: Sequence[str]) -> None:
        values = tuple(str(value) for value in rhs)
        if not values or not all(_WORD.fullmatch(value) for value in values):
            raise ValueError(f"not a list of lowercase words: {values!r}")
        super().__init__(lhs, values)

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs, params = self.process_lhs(compiler, connection)
        values = ", ".join(f"'{value}'" for value in self.rhs)
        return f"{lhs} IN ({values})", tuple(params)


def settled_runs(
    using: str,
    cutoff: datetime,
    *,
    workflows: Sequence[str] | None = None,
    excluding: Sequence[str] = (),
) -> QuerySet[WorkflowRun]:
    """Settled runs last changed before ``cutoff`` that no live parent waits on, in
    the order of the index that holds them: of ``workflows`` only when given, and of
    none of ``excluding``. The one rule of what may be deleted."""
    live_parent = (
        WorkflowStep.objects.using(using)
        .filter(child_run=OuterRef("pk"))
        .exclude(InLiterals(F("run__status"), _SETTLED))
    )
    runs = (
        WorkflowRun.objects.using(using)
        .filter(InLiterals(F("status"), _SETTLED), updated_at__lt=cutoff)
        .exclude(Exists(live_parent))
    )
    if workflows is not None:
        runs = runs.filter(workflow__in=list(workflows))
    if excluding:
        runs = runs.exclude(workflow__in=list(excluding))
    if connections[using].features.supports_partial_indexes:
        return runs.order_by("updated_at")
    # The order of pikku_run_settled_status: read in it, a batch needs no sort.
    return runs.order_by("status", "updated_at")


def delete_runs_and_leases(using: str, ids: Sequence[uuid.UUID]) -> int:
    """Delete the runs ``ids`` with their steps, attempts and events, and their run
    leases (nothing takes them again): how many runs. In the caller's transaction
    when leases are kept in the same database."""
    from pikku_django.leases import get_lease_service
    from pikku_django.workflows.engine import run_lease_key

    deleted = store_for(using).delete_runs(ids)
    get_lease_service().forget([run_lease_key(i) for i in ids])
    return deleted


def old_receipts(using: str, cutoff: datetime) -> QuerySet[WebhookReceipt]:
    """Webhook receipts received before ``cutoff``. A receipt still waiting for its
    run holds the event: it is kept (one a worker set aside waits no more, and goes)."""
    return WebhookReceipt.objects.using(using).filter(received_at__lt=cutoff).dealt_with()


def in_batches(
    queryset: QuerySet[Any],
    batch: int,
    using: str,
    what: str,
    delete: Callable[[list[Any]], object],
    *,
    more: Callable[[], bool] | None = None,
) -> int:
    """Delete what ``queryset`` selects, ``batch`` rows a transaction, with ``delete(ids)``:
    how many rows. After each full batch, ``more()`` False stops it (a time budget): it
    always deletes one batch, and asks only while rows may be left (a short batch was
    the last)."""
    total = 0
    while True:
        ids = list(queryset.values_list("pk", flat=True)[:batch])
        if not ids:
            return total
        with transaction.atomic(using=using):
            delete(ids)
        total += len(ids)
        logger.info("Pruned %d %s so far", total, what)
        if more is not None and len(ids) == batch and not more():
            return total
