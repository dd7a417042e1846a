"""``ctx.patched`` across a deploy: two pikku_worker processes, one on the old code of
a workflow and one on the new, pass the same in-flight runs (PostgreSQL, MariaDB).

Runs already past the change keep the old path under either code; runs that reach
it under the new code take the new path, and the old code leaves those to it.
"""

from __future__ import annotations

import signal
from typing import Any

from pikku_django.models import RunStatus, StepKind, WorkflowRun, WorkflowStep
from pikku_django.workflows import WorkflowEngine
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

PAST, FRESH = 4, 4


def _ended(alias: str, ids: list[Any]) -> bool:
    runs = WorkflowRun.objects.using(alias).filter(id__in=ids)
    return all(r.status != RunStatus.RUNNING for r in runs)


@on_databases("postgres", "mariadb")
def test_old_and_new_code_pass_the_same_runs(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    # Started under the old code (this process carries it) and taken to the wait,
    # past the point where the new code asks ctx.patched("add-ten").
    past = [engine.start("testapp.deploy", {"n": n}) for n in range(PAST)]
    code, out = finish(
        worker_process(alias, "--until-idle", PIKKU_TEST_CARRIED_ONLY="1"), timeout=180
    )
    assert code == 0, out
    steps = WorkflowStep.objects.using(alias)
    assert steps.filter(run__in=past, kind=StepKind.EVENT).count() == PAST
    # Started under the old code too, but not passed yet: they reach the change under
    # whichever code passes them first.
    fresh = [engine.start("testapp.deploy", {"n": 100 + n}) for n in range(FRESH)]
    for run in fresh:
        engine.events.send(run.id, "go")
    assert {r.version for r in past + fresh} == {"1"}

    # The new code first, so that it reaches the change in some fresh run; then the old
    # code beside it, and the past runs are let go while both pass runs.
    procs = [worker_process(alias, PIKKU_TEST_DEPLOYED_CODE="new")]
    try:
        wait_for(
            lambda: steps.filter(run__in=fresh, kind=StepKind.PATCH).exists(),
            240,
            "the new code to reach the change in a fresh run",
        )
        procs.append(worker_process(alias, PIKKU_TEST_CARRIED_ONLY="1"))
        for run in past:
            engine.events.send(run.id, "go")
        ids = [r.id for r in past + fresh]
        wait_for(lambda: _ended(alias, ids), 240, "every run to end")
    finally:
        outs = []
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            outs.append(finish(proc, timeout=120)[1])

    for run in past:
        run.refresh_from_db(using=alias)
        assert run.status == RunStatus.COMPLETED, (run.error, outs)
        assert (run.output["path"], run.output["n"]) == ("old", run.input["n"]), run.output
        assert not steps.filter(run=run, kind=StepKind.PATCH).exists()
    paths = set()
    for run in fresh:
        run.refresh_from_db(using=alias)
        assert run.status == RunStatus.COMPLETED, (run.error, outs)
        marked = steps.filter(run=run, kind=StepKind.PATCH).exists()
        paths.add(run.output["path"])
        expected = ("new", run.input["n"] + 10) if marked else ("old", run.input["n"])
        assert (run.output["path"], run.output["n"]) == expected, run.output
    assert "new" in paths
    assert "NonDeterministicWorkflowError" not in "".join(outs)
