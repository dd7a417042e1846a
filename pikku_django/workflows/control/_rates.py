"""Queue rate limits: at most ``count`` claims per period, across every worker.

A rated queue has at most ``count`` slot rows (:class:`~pikku_django.models.QueueClaim`,
numbered ``0 .. count - 1``), each stamped with the store's clock when a claim last
used it. A claim first locks a slot whose stamp is at least a period old (``SELECT
... FOR UPDATE SKIP LOCKED``: concurrent claims lock different slots, none waits for
another), then claims its step, then stamps the slot, all in the claim's
transaction. A slot is therefore used at most once a period, and any ``count + 1``
claims of a queue are at least one period apart, with no lock on the queue as a
whole. A worker killed mid-claim rolls back its claim and its slot's stamp together.

Slots are made as the queue first needs them (the next numbers, doubling the
queue's slots each time, up to ``count``; the numbers are unique, so concurrent
makers never make more), so a queue keeps at most ``count`` rows; slots numbered
past a lowered ``count`` are deleted now and then.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from django.db.models import ExpressionWrapper, Max
from django.db.models.expressions import CombinedExpression

from pikku_django.models import QueueClaim
from pikku_django.workflows.control.queues import Rate
from pikku_django.workflows.store import WorkflowStore
from pikku_django.workflows.store.queue_writes import period_start

#: About one look at a queue's rate in this many deletes the slots that no longer
#: belong to a rate.
PRUNE_EVERY = 20
#: The fewest slots a queue's slots grow by at once.
GROW_AT_LEAST = 16


def _period_start(rate: Rate) -> ExpressionWrapper[CombinedExpression]:
    """The store's now less one period, in epoch ms."""
    return period_start(rate.per_seconds)


def take_slots(store: WorkflowStore, queue: str, rate: Rate, wanted: int) -> list[int]:
    """Lock up to ``wanted`` of ``queue``'s free slots (used more than a period ago,
    and not locked by another claim), making slots first where the queue has fewer
    than its rate; their ids. Inside the claim's transaction, which holds them until
    it ends: :func:`stamp_slots` marks those a claim used."""
    if wanted <= 0:
        return []
    taken = _free_slots(store, queue, rate, wanted)
    if len(taken) < wanted and grow_slots(store, queue, rate):
        taken += _free_slots(store, queue, rate, wanted - len(taken), taken)
    return taken


def _free_slots(
    store: WorkflowStore, queue: str, rate: Rate, wanted: int, besides: Sequence[int] = ()
) -> list[int]:
    # Read off pikku_queue_claim_time, oldest stamp first: the first free slots end
    # the read, however many slots are in use. (The slot number is not in the
    # condition, so that no plan reads the queue's slots by number and sorts them.)
    claims = QueueClaim.objects.using(store.using)
    free = claims.filter(queue=queue, claimed_ms__lte=_period_start(rate))
    if besides:
        free = free.exclude(id__in=list(besides))
    rows = list(
        free.order_by("claimed_ms")
        .select_for_update(skip_locked=True)
        .values_list("id", "slot")[:wanted]
    )
    taken = [pk for pk, slot in rows if slot < rate.count]
    if len(taken) < len(rows) and prune_claims(store, queue, rate):
        # Numbered past a lowered count: gone now, so the next look finds slots only.
        return taken + _free_slots(store, queue, rate, wanted - len(taken), [*besides, *taken])
    return taken


def grow_slots(store: WorkflowStore, queue: str, rate: Rate) -> bool:
    """Make ``queue``'s next slots, free (doubling its count, at most up to the rate's
    count); False if it has them all. Numbers another claim made meanwhile are left
    to it (the slot numbers are unique)."""
    slots = QueueClaim.objects.using(store.using).filter(queue=queue)
    top = slots.aggregate(top=Max("slot"))["top"]
    first = 0 if top is None else top + 1
    if first >= rate.count:
        return False
    last = min(rate.count, first + max(GROW_AT_LEAST, first))
    store.add_rate_slots(queue, range(first, last))
    return True


def stamp_slots(store: WorkflowStore, slot_ids: Collection[int]) -> None:
    """Mark the slots (locked by :func:`take_slots`) as used by a claim now, on the
    store's clock: after the claim, so the next use of each is a period later still."""
    store.stamp_rate_slots(slot_ids)


def maybe_prune(store: WorkflowStore, queue: str, rate: Rate) -> int:
    """About one call in :data:`PRUNE_EVERY`, :func:`prune_claims`."""
    if random.random() < 1 / PRUNE_EVERY:
        return prune_claims(store, queue, rate)
    return 0


def prune_claims(store: WorkflowStore, queue: str, rate: Rate) -> int:
    """Delete ``queue``'s slots numbered past its rate's count (the count was lowered)
    that no claim used in the last period: how many."""
    return store.drop_rate_slots(queue, rate.count, rate.per_seconds)


def recent_claims(store: WorkflowStore, queue: str, rate: Rate) -> int:
    """How many claims of ``queue`` count against its rate now (for the admin)."""
    return (
        QueueClaim.objects.using(store.using)
        .filter(queue=queue, slot__lt=rate.count, claimed_ms__gt=_period_start(rate))
        .count()
    )
