"""The ORM store's vendors: SQLite (one writer) and MariaDB/MySQL (named locks)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.db import OperationalError, connections

from pikku_django.models import WorkflowRun
from pikku_django.workflows._values import NewStep
from pikku_django.workflows.config import EngineConfig, engine_config
from pikku_django.workflows.store.mysql_sql import statement
from pikku_django.workflows.store.orm import LIMIT_LOCK_WAIT, OrmStore, queue_lock_name

logger = logging.getLogger(__name__)

#: Seconds a start waits for its key's named lock before it goes on without it: less
#: than InnoDB's lock wait (50 s by default), so that a transaction starting its own
#: key again while another start waits on that key's row holds neither up for good.
KEY_LOCK_WAIT = 20


def key_lock_name(workflow: str, idempotency_key: str) -> str:
    """The name of the lock a start of ``idempotency_key`` takes (64 characters at most)."""
    digest = hashlib.sha1(
        f"{workflow}\x00{idempotency_key}".encode(), usedforsecurity=False
    ).hexdigest()
    return "pikku_start:" + digest


@contextlib.contextmanager
def named_lock(using: str, name: str, wait: float = KEY_LOCK_WAIT) -> Iterator[None]:
    """MariaDB/MySQL's named lock ``name`` held over the block (not transactional:
    released as the block ends); the block runs without it when not had in ``wait``."""
    with connections[using].cursor() as cursor:
        cursor.execute(statement("get_lock"), [name, wait])
        row = cursor.fetchone()
        held = bool(row) and row[0] == 1
        if not held:
            logger.warning("Not given the lock %s within %gs: going on without it", name, wait)
        try:
            yield
        finally:
            if held:
                with contextlib.suppress(Exception):
                    cursor.execute(statement("release_lock"), [name])


class SqliteStore(OrmStore):
    """SQLite: one writer, so this process's claims take turns."""

    vendor = "sqlite"
    one_worker_process = True

    def __init__(self, using: str, config: Callable[[], EngineConfig] = engine_config) -> None:
        super().__init__(using, config)
        self._claims = threading.Lock()

    def claims_serialised(self) -> AbstractContextManager[Any]:
        return self._claims


class MysqlStore(OrmStore):
    """MariaDB and MySQL."""

    vendor = "mysql"

    def create_run(
        self, run: WorkflowRun, opening: NewStep | None, due_at: datetime | None
    ) -> None:
        if run.idempotency_key is None:
            super().create_run(run, opening, due_at)
            return
        with self.key_turn(run.workflow, run.idempotency_key):
            super().create_run(run, opening, due_at)

    def key_turn(self, workflow: str, idempotency_key: str) -> AbstractContextManager[Any]:
        # InnoDB: an insert that finds its key taken by a transaction not yet ended
        # waits for it, with a shared lock on the key. If that transaction rolls back,
        # every waiter inserts, each waiting on the others' shared locks; and starts
        # that then lock the run to change it (debounced ones) each wait on the others'
        # shared locks too. Either is a deadlock, which rolls back a start's whole
        # transaction (its caller's writes too). A named lock per key lets one start
        # wait at a time.
        return named_lock(self.using, key_lock_name(workflow, idempotency_key))

    def keyed_run(self, workflow: str, idempotency_key: str) -> WorkflowRun:
        # A shared lock, not FOR UPDATE: every start that found the key taken holds a
        # shared lock on it already (its insert took it), and raising those to
        # exclusive ones deadlocks them with each other.
        found = list(
            WorkflowRun.objects.db_manager(self.using).raw(
                statement("keyed_run_shared"), [workflow, idempotency_key]
            )
        )
        if not found:
            raise WorkflowRun.DoesNotExist(
                f"No run of {workflow!r} holds idempotency key {idempotency_key!r}"
            )
        return found[0]

    @contextlib.contextmanager
    def limited_claim(self, queues: Sequence[str]) -> Iterator[None]:
        # A named lock per queue, held until after the claim's transaction commits
        # (so the next holder counts this claim): GET_LOCK is not transactional.
        names = [queue_lock_name(q) for q in sorted(set(queues))]
        taken: list[str] = []
        with connections[self.using].cursor() as cursor:
            try:
                for name in names:
                    cursor.execute(statement("get_lock"), [name, LIMIT_LOCK_WAIT])
                    row = cursor.fetchone()
                    if not row or row[0] != 1:
                        raise OperationalError(f"Timed out waiting for the claim lock {name}")
                    taken.append(name)
                with self.atomic():
                    yield
            finally:
                for name in reversed(taken):
                    with contextlib.suppress(Exception):
                        cursor.execute(statement("release_lock"), [name])

    def as_stored(self, step_id: int, field: str, value: Any) -> Any:
        # MySQL's JSON type reorders keys and normalises numbers; MariaDB keeps the text.
        if value is None or getattr(connections[self.using], "mysql_is_mariadb", False):
            return value
        return self.steps().filter(id=step_id).values_list(field, flat=True).first()
