"""The ORM store's vendors: SQLite (one writer) and MariaDB/MySQL (named locks)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from django.db import OperationalError, connections

from pikku_django.workflows.config import EngineConfig, engine_config
from pikku_django.workflows.store.orm import LIMIT_LOCK_WAIT, OrmStore, queue_lock_name


class SqliteStore(OrmStore):
    """SQLite: one writer, so this process's claims take turns."""

    vendor = "sqlite"

    def __init__(self, using: str, config: Callable[[], EngineConfig] = engine_config) -> None:
        super().__init__(using, config)
        self._claims = threading.Lock()

    def claims_serialised(self) -> AbstractContextManager[Any]:
        return self._claims


class MysqlStore(OrmStore):
    """MariaDB and MySQL."""

    vendor = "mysql"

    @contextlib.contextmanager
    def limited_claim(self, queues: Sequence[str]) -> Iterator[None]:
        # A named lock per queue, held until after the claim's transaction commits
        # (so the next holder counts this claim): GET_LOCK is not transactional.
        names = [queue_lock_name(q) for q in sorted(set(queues))]
        taken: list[str] = []
        with connections[self.using].cursor() as cursor:
            try:
                for name in names:
                    cursor.execute("SELECT GET_LOCK(%s, %s)", [name, LIMIT_LOCK_WAIT])
                    row = cursor.fetchone()
                    if not row or row[0] != 1:
                        raise OperationalError(f"Timed out waiting for the claim lock {name}")
                    taken.append(name)
                with self.atomic():
                    yield
            finally:
                for name in reversed(taken):
                    with contextlib.suppress(Exception):
                        cursor.execute("SELECT RELEASE_LOCK(%s)", [name])

    def as_stored(self, step_id: int, field: str, value: Any) -> Any:
        # MySQL's JSON type reorders keys and normalises numbers; MariaDB keeps the text.
        if value is None or getattr(connections[self.using], "mysql_is_mariadb", False):
            return value
        return self.steps().filter(id=step_id).values_list(field, flat=True).first()
