"""The writes of a queue's flow control: its pause, and its rate's slots."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import BigIntegerField, ExpressionWrapper, Value
from django.db.models.expressions import CombinedExpression

from pikku_django.dbclock import EpochMs
from pikku_django.models import QueueClaim, QueuePause

logger = logging.getLogger("pikku_django.workflows.control.pauses")

#: The transactions open on the connection's database but its own, by vendor: each
#: row names one (a process and when its transaction began, or InnoDB's id for it).
_OPEN_TRANSACTIONS = {
    "postgresql": (
        "SELECT pid, xact_start FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
        "AND xact_start IS NOT NULL AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)"
    ),
    "mysql": (
        "SELECT t.trx_id, t.trx_mysql_thread_id, t.trx_started "
        "FROM information_schema.INNODB_TRX t "
        "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
        "WHERE t.trx_mysql_thread_id <> CONNECTION_ID() AND p.DB = DATABASE()"
    ),
}


@dataclass(frozen=True)
class PauseAdded:
    """What pausing a queue found: the pause in force, and whether this call made it."""

    row: QueuePause
    added: bool


def period_start(per_seconds: float) -> ExpressionWrapper[CombinedExpression]:
    """The store's now less ``per_seconds``, in epoch ms."""
    return ExpressionWrapper(
        EpochMs() - Value(int(per_seconds * 1000)), output_field=BigIntegerField()
    )


class QueueWrites:
    """The queue writes of :class:`~pikku_django.workflows.store.WorkflowStore`."""

    #: The database alias (the store's).
    using: str

    # -- pauses ------------------------------------------------------------------------

    def add_pause(self, queue: str, reason: str, paused_by: str) -> PauseAdded:
        """Pause ``queue`` (in the caller's transaction, if any): the pause in force,
        new or kept as it was."""
        rows = QueuePause.objects.using(self.using)
        try:
            with transaction.atomic(using=self.using):
                row = rows.create(queue=queue, reason=reason, paused_by=paused_by[:150])
        except IntegrityError:
            existing = rows.filter(queue=queue).first()
            if existing is None:
                raise
            return PauseAdded(existing, added=False)
        return PauseAdded(row, added=True)

    def remove_pause(self, queue: str) -> bool:
        """Lift ``queue``'s pause (in the caller's transaction): whether it had one."""
        deleted, _ = QueuePause.objects.using(self.using).filter(queue=queue).delete()
        return bool(deleted)

    def await_open_transactions(self, seconds: float) -> bool:
        """Wait until the transactions open on the database as this is called (other
        than this connection's) have ended, up to ``seconds``: whether they all had.
        (SQLite, whose writers take turns, needs no wait.)"""
        connection = connections[self.using]
        sql = _OPEN_TRANSACTIONS.get(connection.vendor)
        if sql is None:
            return True
        deadline = time.monotonic() + seconds
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
                waited = {tuple(row) for row in cursor.fetchall()}
                while waited:
                    if time.monotonic() >= deadline:
                        logger.warning(
                            "Transactions begun before the pause were still open after %gs: "
                            "a claim among them may still commit",
                            seconds,
                        )
                        return False
                    time.sleep(0.01)
                    cursor.execute(sql)
                    waited &= {tuple(row) for row in cursor.fetchall()}
                return True
        except DatabaseError:
            logger.warning(
                "Could not see the transactions in flight on %r (on MariaDB this needs the "
                "PROCESS privilege): a claim begun before the pause may still commit",
                self.using,
                exc_info=True,
            )
            return False

    # -- rate slots ----------------------------------------------------------------------

    def add_rate_slots(self, queue: str, numbers: range) -> None:
        """Make ``queue``'s slots ``numbers``, free; numbers another made are left."""
        QueueClaim.objects.using(self.using).bulk_create(
            [QueueClaim(queue=queue, slot=n, claimed_ms=0) for n in numbers],
            batch_size=1000,
            ignore_conflicts=True,
        )

    def stamp_rate_slots(self, slot_ids: Collection[int]) -> None:
        """Mark the slots ``slot_ids`` used now, on the store's clock."""
        if slot_ids:
            QueueClaim.objects.using(self.using).filter(id__in=list(slot_ids)).update(
                claimed_ms=EpochMs()
            )

    def drop_rate_slots(self, queue: str, count: int, per_seconds: float) -> int:
        """Delete ``queue``'s slots numbered ``count`` and up that no claim used in the
        last ``per_seconds``: how many."""
        old = QueueClaim.objects.using(self.using).filter(
            queue=queue, slot__gte=count, claimed_ms__lte=period_start(per_seconds)
        )
        return int(old.delete()[0])
