"""A fan-out of 1,000 child runs on PostgreSQL, run by pikku_worker processes that
are SIGKILLed while it is under way: every child runs once, and the join returns
every child's output in start order.

The first workers are killed while the parent's pass is still starting children,
a second one while children are running; short run and step leases let the
survivors take over within seconds.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from pikku_django.models import RunStatus, StepKind, WorkflowRun, WorkflowStep
from pikku_django.workflows import WorkflowEngine
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

pytestmark = [pytest.mark.once, pytest.mark.long]

CHILDREN = 1000
ENV = {
    "PIKKU_TEST_STEP_LEASE_MS": "2000",
    "PIKKU_TEST_RUN_LEASE_MS": "2000",
    "PIKKU_TEST_POLL": "0.1",
}


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate()


@on_databases("postgres")
def test_a_thousand_children_survive_killed_workers_and_join(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    parent = engine.start("testapp.fan_out", {"children": CHILDREN})
    children = WorkflowRun.objects.using(alias).filter(workflow="testapp.fan_child")

    first = [worker_process(alias, "--concurrency", "4", **ENV) for _ in range(2)]
    try:
        wait_for(lambda: children.count() >= 150, 60, "the fan-out to start children")
    finally:
        for proc in first:  # one of them is in the parent's pass, starting children
            _kill(proc)

    second = worker_process(alias, "--concurrency", "4", **ENV)
    try:
        wait_for(
            lambda: children.filter(status=RunStatus.COMPLETED).count() >= CHILDREN // 2,
            90,
            "half of the children to complete",
        )
    finally:
        _kill(second)

    code, out = finish(worker_process(alias, "--until-idle", "--concurrency", "4", **ENV), 120)
    assert code == 0, out[-3000:]
    parent.refresh_from_db(using=alias)
    assert parent.status == RunStatus.COMPLETED, (parent.error, out[-3000:])
    assert parent.output == [n * n for n in range(CHILDREN)]

    # Each child was started once and completed once, by its own branch.
    assert children.count() == CHILDREN
    assert set(children.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    branches = WorkflowStep.objects.using(alias).filter(run_id=parent.id, kind=StepKind.CHILD)
    assert branches.count() == CHILDREN
    assert branches.values("child_run_id").distinct().count() == CHILDREN
    assert set(branches.values_list("status", flat=True)) == {"succeeded"}
    group = WorkflowStep.objects.using(alias).get(run_id=parent.id, kind=StepKind.PARALLEL)
    assert group.status == "succeeded"
    assert group.open_branches == 0
    # Each child's output is its square, and the parent's branches each name a child.
    outputs = dict(children.values_list("id", "output"))
    by_branch = dict(branches.values_list("name", "child_run_id"))
    for n in range(CHILDREN):
        name = "child" if n == 0 else f"child#{n}"
        assert outputs[by_branch[name]] == n * n
