"""Every SQL statement of the MariaDB/MySQL store, by name: its named locks and the
shared-lock read of a run by its idempotency key. The rest of it is the ORM's."""

from __future__ import annotations

import functools
from collections.abc import Callable

from pikku_django.models import WorkflowRun
from pikku_django.workflows.store.base import columns


def q(name: str) -> str:
    """``name`` quoted as a MariaDB/MySQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def _keyed_run_shared() -> str:
    """A run by its workflow and idempotency key, under a shared lock. Parameters: the
    workflow, the key."""
    workflow, key = (columns(WorkflowRun, (name,), q) for name in ("workflow", "idempotency_key"))
    table = q(WorkflowRun._meta.db_table)
    return f"SELECT * FROM {table} WHERE {workflow} = %s AND {key} = %s LOCK IN SHARE MODE"


#: Every named statement and how it is built.
BUILDERS: dict[str, Callable[[], str]] = {
    # locks (not transactional: held until released, or the session ends)
    "get_lock": lambda: "SELECT GET_LOCK(%s, %s)",  # name, seconds to wait
    "release_lock": lambda: "SELECT RELEASE_LOCK(%s)",  # name
    # start
    "keyed_run_shared": _keyed_run_shared,
}


@functools.cache
def statement(name: str) -> str:
    """The statement ``name`` (see :data:`BUILDERS`), built on first use."""
    return BUILDERS[name]()
