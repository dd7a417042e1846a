"""The step part of ``benchmarks/failover.py``: runs of a one-step workflow on a private
primary and asynchronous standby, each trial in-process (one engine, workers told
apart by name):

1. baseline: a run started, the connection dropped, and the time until its step has
   completed (a new connection: what a worker pays after a failover too);
2. ``runs`` runs started and their steps claimed by worker-1 under a short lease,
   which lapses (all replicated);
3. the standby held back: worker-2 claims every lapsed step again (attempt 2) and
   ``lost_runs`` more runs start: commits only the primary has;
4. the primary stopped (``immediate``) and the standby promoted; the time from
   promotion to the first step completed by a worker whose connection went to the
   old primary;
5. worker-3 claims the remaining steps (attempt 2 again, on the new timeline); then
   worker-2 renews and settles each of its lost claims, and each must be refused;
   worker-3 settles, and every run the new primary has is driven to its end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.core.management import call_command
from django.db import DatabaseError, connections

from pikku_django.workflows import WorkflowContext, step, workflow

WORKFLOW = "bench_failover_one_step"
SHORT_MS = 200
LONG_MS = 60_000


@step(name="bench_failover_charge")
def charge(data: dict[str, Any]) -> int:
    return int(data["n"])


@workflow(name=WORKFLOW)
def one_step(ctx: WorkflowContext, inp: dict[str, Any]) -> int:
    return int(ctx.do("charge", charge, inp))


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def retried(alias: str, call: Callable[[], Any], timeout: float = 30) -> Any:
    """``call``, again on a new connection while the database cannot be reached (a
    worker's loop does the same)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except DatabaseError:
            if time.monotonic() > deadline:
                raise
            connections[alias].close()
            time.sleep(0.005)


def until_a_step_completes(engine: Any, alias: str, timeout: float = 30) -> None:
    """Do due work until one more step has succeeded than when called."""
    from pikku_django.models import StepStatus

    def succeeded() -> int:
        return int(engine.steps().filter(status=StepStatus.SUCCEEDED).count())

    before = retried(alias, succeeded)
    deadline = time.monotonic() + timeout
    while retried(alias, succeeded) <= before:
        if time.monotonic() > deadline:
            raise TimeoutError("no step completed")
        retried(alias, engine.work_once)


def start_and_pass(engine: Any, n: int, offset: int) -> list[Any]:
    """``n`` runs started and every due run passed (each new one's step stored, not
    claimed)."""
    runs = [engine.start(WORKFLOW, {"n": offset + i}) for i in range(n)]
    while due := engine.claim_due_runs(n):
        for run_id in due:
            engine.orchestrate(run_id)
    return [run.id for run in runs]


def claim_all(engine: Any, run_ids: list[Any], worker: str, lease_ms: int) -> list[Any]:
    steps = engine.steps().filter(run_id__in=run_ids).values_list("id", flat=True)
    claimed = [engine.claim_step(i, lease_ms=lease_ms, worker=worker) for i in steps]
    return [c for c in claimed if c is not None]


def step_trial(pair: Any, alias: str, runs: int, lost_runs: int) -> dict[str, Any]:
    from pikku_django.leases.database import DatabaseLeaseService
    from pikku_django.models import RunStatus
    from pikku_django.workflows import WorkflowEngine, WorkflowStepSupersededError

    call_command("migrate", "pikku_django", database=alias, verbosity=0)
    engine = WorkflowEngine(alias, leases=DatabaseLeaseService(alias))
    engine.start(WORKFLOW, {"n": -1})
    connections[alias].close()
    started = time.monotonic()
    until_a_step_completes(engine, alias)
    baseline_ms = ms(time.monotonic() - started)

    replicated = start_and_pass(engine, runs, 0)
    first = claim_all(engine, replicated, "worker-1", SHORT_MS)
    time.sleep(SHORT_MS / 1000 + 0.05)

    pair.hold_back_standby()
    lost_claims = claim_all(engine, replicated, "worker-2", LONG_MS)
    start_and_pass(engine, lost_runs, runs)
    tokens_before = [c.claim_token for c in first + lost_claims]

    stopped = time.monotonic()
    pair.fail_over()
    promoted = time.monotonic()
    until_a_step_completes(engine, alias)
    first_step_ms = ms(time.monotonic() - promoted)

    current = claim_all(engine, replicated, "worker-3", LONG_MS)
    refused = {"renew": 0, "settle": 0}
    for lost in lost_claims:
        refused["renew"] += not engine.refresh_step_lease(
            lost.step_id, LONG_MS, lost.attempt, lost.claim_token
        )
        try:
            engine.set_step_result(lost.step_id, "lost", lost.attempt, token=lost.claim_token)
        except WorkflowStepSupersededError:
            refused["settle"] += 1
    for claimed in current:
        engine.execute_step(claimed)
    engine.run_until_idle()
    runs_started = 1 + runs + lost_runs
    completed = engine.runs().filter(status=RunStatus.COMPLETED).count()
    stored_lost = engine.steps().filter(result="lost").count()
    tokens_after = [c.claim_token for c in current]
    engine.leases.close()
    connections[alias].close()
    return {
        "steps_baseline_first_step_new_connection_ms": baseline_ms,
        "steps_stop_to_promoted_ms": ms(promoted - stopped),
        "steps_promoted_to_first_step_completed_ms": first_step_ms,
        "runs_started": runs_started,
        "runs_completed": completed,
        "claims_replicated": len(first),
        "lost_claims": len(lost_claims),
        "lost_claims_refused": refused,
        "lost_results_stored": stored_lost,
        "claim_tokens_before_max": max(tokens_before),
        "claim_tokens_after_min": min(tokens_after) if tokens_after else None,
        "claim_tokens_rose": bool(tokens_after) and min(tokens_after) > max(tokens_before),
    }
