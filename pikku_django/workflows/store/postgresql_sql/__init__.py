"""Every SQL statement of the PostgreSQL store, by name, grouped by what it does:
start, look, claim, settle, end. Announcements ride in the statements that make the
work (``pg_notify`` on :mod:`pikku_django.wakeups`' channels); a bare announcement is
:func:`pikku_django.wakeups.announce`.

Tables and columns are named from the models' ``_meta``; each statement is built
once per process, on first use (:func:`statement`). A statement's parameters are
listed in its entry's comment, in order; ``postgresql_rows`` builds them.

Built by concept: the names and shared conditions in ``_names``, the starts in
``_start``, the looks and claims in ``_claim``, the settles and ends of runs in
``_settle``; here the catalogue, and the names the store's other modules use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from pikku_django.workflows.store.postgresql_sql._claim import (
    _claim_due_runs,
    _claim_due_runs_first,
    _claim_step,
    _first_fresh_queue,
    _insert_claimed,
    _queue_lock,
    _ready_exists,
    claim_fresh,
)
from pikku_django.workflows.store.postgresql_sql._names import (
    ATTEMPTS,
    CLAIM_FENCE,
    FIRST_CLAIM_TOKEN,
    NEW_STEP_FIELDS,
    NEXT_CLAIM_TOKEN,
    NO_CAP,
    QUEUE_LOCK_SPACE,
    RUNS,
    STEP_STATE_FIELDS,
    STEPS,
    a,
    all_columns,
    claimed,
    k,
    not_paused,
    q,
    r,
    s,
    step_lease,
)
from pikku_django.workflows.store.postgresql_sql._settle import (
    _finish_run,
    _insert_settled,
    _settle,
)
from pikku_django.workflows.store.postgresql_sql._start import (
    _runs_with_keys,
    _start_run,
    _start_runs,
    insert_fields,
)

__all__ = [
    "ATTEMPTS",
    "BUILDERS",
    "CLAIM_FENCE",
    "FIRST_CLAIM_TOKEN",
    "NEW_STEP_FIELDS",
    "NEXT_CLAIM_TOKEN",
    "NO_CAP",
    "QUEUE_LOCK_SPACE",
    "RUNS",
    "STEPS",
    "STEP_STATE_FIELDS",
    "a",
    "all_columns",
    "claim_fresh",
    "claimed",
    "insert_fields",
    "k",
    "not_paused",
    "q",
    "r",
    "s",
    "statement",
    "step_lease",
    "unlimited_claim",
]

# -- the catalogue -------------------------------------------------------------------

#: Every named statement and how it is built. A statement used in one shape per
#: parameter (the unlimited fresh claim's LIMIT) is built by :func:`claim_fresh`.
BUILDERS: dict[str, Callable[[], str]] = {
    # start
    "runs_with_keys": _runs_with_keys,
    "start_runs": lambda: _start_runs(False, False),
    "start_runs_announced": lambda: _start_runs(False, True),
    "start_runs_with_steps": lambda: _start_runs(True, False),
    "start_runs_with_steps_announced": lambda: _start_runs(True, True),
    "start_run": lambda: _start_run(False, False),
    "start_run_announced": lambda: _start_run(False, True),
    "start_run_with_step": lambda: _start_run(True, False),
    "start_run_with_step_announced": lambda: _start_run(True, True),
    # look (one statement per shape, so that a generic plan fits each)
    "ready_steps_exist": lambda: _ready_exists(False),
    "ready_steps_exist_on": lambda: _ready_exists(True),
    "retries_or_lapsed_exist": lambda: _ready_exists(False, fresh=False),
    "retries_or_lapsed_exist_on": lambda: _ready_exists(True, fresh=False),
    "first_fresh_queue": lambda: _first_fresh_queue(False),
    "first_fresh_queue_on": lambda: _first_fresh_queue(True),
    # claim
    "claim_step": _claim_step,
    "claim_limited_c": lambda: claim_fresh(fresh_on=True, concurrency=True, excluding=False),
    "claim_limited_r": lambda: claim_fresh(fresh_on=True, rated=True, excluding=False),
    "claim_limited_cr": lambda: claim_fresh(
        fresh_on=True, concurrency=True, rated=True, excluding=False
    ),
    "queue_lock": _queue_lock,
    "claim_due_runs": _claim_due_runs,
    "claim_due_runs_leased": lambda: _claim_due_runs(leased=True),
    "claim_due_runs_first": lambda: _claim_due_runs_first(False),
    "claim_due_runs_first_served": lambda: _claim_due_runs_first(True),
    "insert_claimed": _insert_claimed,
    # settle
    "insert_settled": _insert_settled,
    "settle": _settle,
    "settle_then_claim": lambda: _insert_claimed(after_step=True),
    "settle_then_finish": lambda: _finish_run(after_step=True),
    "settle_then_finish_released": lambda: _finish_run(after_step=True, release=True),
    # end of a run
    "finish_run": _finish_run,
    # wake-up
}


@functools.cache
def statement(name: str) -> str:
    """The statement ``name`` (see :data:`BUILDERS`), built on first use."""
    return BUILDERS[name]()


@functools.lru_cache(maxsize=64)
def unlimited_claim(fresh_on: bool, excluding: bool, limit: int) -> str:
    """The claim of fresh steps of the queues without limits, one statement per shape
    and LIMIT (see :func:`claim_fresh`)."""
    return claim_fresh(fresh_on=fresh_on, excluding=excluding, limit=limit)
