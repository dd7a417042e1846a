"""Parallel steps and child runs: ``ctx.parallel`` and ``group.join``.

On SQLite, PostgreSQL and MariaDB: branches are started once each and joined in
start order, replay gives the same answers pass after pass, a fail-fast join
raises the first failure and cancels the rest, a collecting join returns every
outcome, and a fan-out's children wake their parent once, not once each.
"""

from __future__ import annotations

from typing import Any

import pytest

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, StepKind, WorkflowRun, WorkflowStep
from pikku_django.workflows import (
    FakeClock,
    JoinPolicy,
    NonDeterministicWorkflowError,
    Outcome,
    StepFailedError,
    WorkflowContext,
    WorkflowEngine,
    step,
    workflow,
)
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")
CALLS: list[str] = []


@step(name="par_double", retries=0)
def par_double(n: int) -> int:
    CALLS.append(f"double:{n}")
    return n * 2


@step(name="par_boom", retries=0)
def par_boom(n: int) -> int:
    CALLS.append(f"boom:{n}")
    raise ValueError(f"boom {n}")


@step(name="par_flaky", retries=3, retry_delay=3600)
def par_flaky(n: int) -> int:
    CALLS.append(f"flaky:{n}")
    raise ValueError("not yet")


@workflow(name="par_kid")
def par_kid(ctx: WorkflowContext, n: int) -> int:
    return int(ctx.do("double", par_double, n)) + 1


@workflow(name="par_kid_fails")
def par_kid_fails(ctx: WorkflowContext, n: int) -> int:
    return int(ctx.do("boom", par_boom, n))


@workflow(name="par_kid_waits")
def par_kid_waits(ctx: WorkflowContext, n: int) -> Any:
    return ctx.suspend("held until resumed")


@workflow(name="par_mixed")
def par_mixed(ctx: WorkflowContext, n: int) -> Any:
    before = ctx.do("before", par_double, n)
    group = ctx.parallel("fan")
    for i in range(n):
        group.do("kid", par_kid, i)
        group.do("double", par_double, 10 + i)
    results = group.join()
    after = ctx.do("after", par_double, len(results))
    return {"before": before, "results": results, "after": after}


@workflow(name="par_fail_fast")
def par_fail_fast(ctx: WorkflowContext, n: int) -> Any:
    group = ctx.parallel("fan")
    waiting = [group.do("waits", par_kid_waits, i) for i in range(n)]
    group.do("fails", par_kid_fails, 7)
    group.do("queued_waits", par_flaky, 1)
    try:
        group.join()
    except StepFailedError as failed:
        return {"failed": failed.step, "waiting": [b.name for b in waiting]}
    return "joined"


@workflow(name="par_collect")
def par_collect(ctx: WorkflowContext, n: int) -> Any:
    group = ctx.parallel("fan")
    group.do("ok", par_kid, 1)
    group.do("bad", par_kid_fails, 2)
    group.do("step_ok", par_double, 3)
    group.do("step_bad", par_boom, 4)
    outcomes = group.join(JoinPolicy.COLLECT)
    assert all(isinstance(o, Outcome) for o in outcomes)
    return [[o.step, o.ok, o.result, (o.error or {}).get("message")] for o in outcomes]


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def engine(alias: str) -> WorkflowEngine:
    CALLS.clear()
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())


def _finish(engine: WorkflowEngine, run: WorkflowRun) -> WorkflowRun:
    engine.run_until_idle()
    run.refresh_from_db()
    return run


def test_branches_run_once_each_and_join_in_start_order(alias: str, engine: WorkflowEngine) -> None:
    run = _finish(engine, engine.start(par_mixed, 3))
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"before": 6, "results": [1, 20, 3, 22, 5, 24], "after": 12}
    assert sorted(CALLS) == sorted(
        [
            "double:3",
            "double:0",
            "double:1",
            "double:2",
            "double:10",
            "double:11",
            "double:12",
            "double:6",
        ]
    )
    steps = WorkflowStep.objects.using(alias).filter(run_id=run.id)
    group = steps.get(name="fan")
    assert group.kind == StepKind.PARALLEL
    assert group.status == "succeeded"
    assert group.open_branches == 0
    assert set(steps.filter(group=group).values_list("name", flat=True)) == {
        "kid",
        "double",
        "kid#1",
        "double#1",
        "kid#2",
        "double#2",
    }
    kids = WorkflowRun.objects.using(alias).filter(workflow="par_kid")
    assert kids.count() == 3
    assert set(kids.values_list("status", flat=True)) == {"completed"}


def test_replay_after_the_join_answers_the_same_and_runs_nothing_again(
    alias: str, engine: WorkflowEngine
) -> None:
    run = _finish(engine, engine.start(par_mixed, 2))
    assert run.status == RunStatus.COMPLETED, run.error
    rows = WorkflowStep.objects.using(alias).count()
    calls = list(CALLS)
    # Replay the finished run's function again over its recorded steps, as a pass would.
    for _ in range(2):
        WorkflowRun.objects.using(alias).filter(id=run.id).update(status=RunStatus.RUNNING)
        engine.orchestrate(run.id)
        again = WorkflowRun.objects.using(alias).get(id=run.id)
        assert again.status == RunStatus.COMPLETED
        assert again.output == run.output
    assert calls == CALLS
    assert WorkflowStep.objects.using(alias).count() == rows


def test_each_pass_before_the_join_creates_nothing_twice(
    alias: str, engine: WorkflowEngine
) -> None:
    run = engine.start(par_mixed, 3)
    engine.orchestrate(run.id)  # "before" is queued: stored
    (before,) = engine.claim_due_steps(limit=1)
    engine.execute_step(before, wake=False)
    for _ in range(3):
        engine.orchestrate(run.id)
    runs = WorkflowRun.objects.using(alias).filter(workflow="par_kid")
    assert runs.count() == 3
    group = WorkflowStep.objects.using(alias).get(run_id=run.id, name="fan")
    assert WorkflowStep.objects.using(alias).filter(group=group).count() == 6
    run = _finish(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output["results"] == [1, 20, 3, 22, 5, 24]


def test_fail_fast_raises_the_first_failure_and_cancels_the_rest(
    alias: str, engine: WorkflowEngine
) -> None:
    run = _finish(engine, engine.start(par_fail_fast, 3))
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"failed": "fails", "waiting": ["waits", "waits#1", "waits#2"]}
    waiting = WorkflowRun.objects.using(alias).filter(workflow="par_kid_waits")
    assert waiting.count() == 3
    assert set(waiting.values_list("status", flat=True)) == {RunStatus.CANCELLED}
    steps = WorkflowStep.objects.using(alias).filter(run_id=run.id)
    queued = steps.get(name="queued_waits")
    assert queued.status == "failed"
    assert queued.error["code"] == "BRANCH_CANCELLED"
    assert steps.get(name="fan").status == "failed"
    assert {s.status for s in steps.filter(name__startswith="waits")} == {"failed"}


def test_collect_returns_every_outcome(alias: str, engine: WorkflowEngine) -> None:
    run = _finish(engine, engine.start(par_collect, 0))
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == [
        ["ok", True, 3, None],
        ["bad", False, None, "Step 'boom' failed: ValueError: boom 2"],
        ["step_ok", True, 6, None],
        ["step_bad", False, None, "boom 4"],
    ]


@pytest.mark.django_db
def test_the_run_page_shows_a_groups_branches_side_by_side(admin_client: Any) -> None:
    from django.urls import reverse

    from pikku_django.workflows.api import reset_engine

    reset_engine()
    engine = WorkflowEngine("default", leases=InMemoryLeaseService(), clock=FakeClock())
    run = _finish(engine, engine.start(par_collect, 0))
    page = admin_client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    group = WorkflowStep.objects.get(run_id=run.id, name="fan")
    assert f'id="pikku-parallel-{group.pk}"' in html
    assert "4 branches, side by side" in html
    for branch in WorkflowStep.objects.filter(group=group):
        # Each branch is a lane of its group, not a row of the timeline.
        assert f'id="pikku-lane-{branch.pk}"' in html
        assert f'id="pikku-step-{branch.pk}"' not in html
    lanes = html[html.index('class="pikku-lanes"') :]
    assert lanes.index("ok") < lanes.index("bad") < lanes.index("step_ok")
    assert "boom 4" in lanes


@workflow(name="par_fan")
def par_fan(ctx: WorkflowContext, n: int) -> Any:
    group = ctx.parallel("fan")
    for i in range(n):
        group.do("kid", par_kid, i)
    return group.join()


def test_the_children_wake_their_parent_once_the_last_one_ends(
    alias: str, engine: WorkflowEngine
) -> None:
    run = engine.start(par_fan, 30)
    engine.orchestrate(run.id)
    run.refresh_from_db()
    assert run.wake_at is None  # parked on the join
    wakes = run.wakes
    kids = list(WorkflowRun.objects.using(alias).filter(workflow="par_kid").order_by("created_at"))
    assert len(kids) == 30
    group = WorkflowStep.objects.using(alias).get(run_id=run.id, name="fan")
    assert group.open_branches == 30
    for n, kid in enumerate(kids):
        engine.orchestrate(kid.id)  # the kid's step is queued: claimed and run below
        (claimed,) = engine.claim_due_steps(limit=1)
        engine.execute_step(claimed)
        engine.orchestrate(kid.id)
        kid.refresh_from_db()
        assert kid.status == RunStatus.COMPLETED, kid.error
        run.refresh_from_db()
        if n < len(kids) - 1:
            assert (run.wakes, run.wake_at) == (wakes, None), f"woken by child {n}"
    assert run.wakes == wakes + 1
    assert run.wake_at is not None
    group.refresh_from_db()
    assert group.open_branches == 0
    engine.orchestrate(run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == [2 * i + 1 for i in range(30)]


def test_a_failed_child_wakes_its_parent_at_once(alias: str, engine: WorkflowEngine) -> None:
    run = engine.start(par_fail_fast, 2)
    engine.orchestrate(run.id)
    run.refresh_from_db()
    wakes = run.wakes
    (failing,) = WorkflowRun.objects.using(alias).filter(workflow="par_kid_fails")
    engine.orchestrate(failing.id)
    (claimed,) = [c for c in engine.claim_due_steps(limit=10) if c.run_id == failing.id]
    engine.execute_step(claimed)
    engine.orchestrate(failing.id)
    failing.refresh_from_db()
    assert failing.status == RunStatus.FAILED
    run.refresh_from_db()
    assert run.wakes > wakes
    assert run.wake_at is not None


def test_bad_branches_are_clear_errors_and_store_nothing(
    alias: str, engine: WorkflowEngine
) -> None:
    @workflow(name="par_bad_inline")
    def bad_inline(ctx: WorkflowContext, n: int) -> Any:
        ctx.parallel("fan").do("inline", lambda x: x, n)

    run = _finish(engine, engine.start(bad_inline, 1))
    assert run.status == RunStatus.FAILED
    assert "must be a registered step function" in run.error["message"]
    assert not WorkflowStep.objects.using(alias).filter(run_id=run.id, name="inline").exists()


def test_joining_again_with_another_policy_is_nondeterministic(
    alias: str, engine: WorkflowEngine
) -> None:
    policies = [JoinPolicy.COLLECT]

    @workflow(name="par_flip")
    def flip(ctx: WorkflowContext, n: int) -> Any:
        group = ctx.parallel("fan")
        group.do("kid", par_kid, n)
        group.join(policies[0])
        return ctx.do("after", par_double, n)

    run = engine.start(flip, 1)
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    WorkflowRun.objects.using(alias).filter(id=run.id).update(status=RunStatus.RUNNING)
    policies[0] = JoinPolicy.FAIL_FAST
    engine.orchestrate(run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.error["type"].endswith(NonDeterministicWorkflowError.__name__)


def test_an_inline_run_drives_its_branches_in_this_process(
    alias: str, engine: WorkflowEngine
) -> None:
    run = engine.start(par_mixed, 2, inline=True)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"before": 4, "results": [1, 20, 3, 22], "after": 8}
    kids = WorkflowRun.objects.using(alias).filter(workflow="par_kid")
    assert set(kids.values_list("inline", "status")) == {(True, RunStatus.COMPLETED)}


def test_cancelling_the_parent_cancels_every_child_branch(
    alias: str, engine: WorkflowEngine
) -> None:
    run = engine.start(par_fail_fast, 3)
    engine.orchestrate(run.id)  # stores the branches; nothing has run yet
    engine.cancel(run.id)
    kids = WorkflowRun.objects.using(alias).exclude(id=run.id)
    assert kids.count() == 4
    assert set(kids.values_list("status", flat=True)) == {RunStatus.CANCELLED}
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


@workflow(name="par_fail_fast_uncaught")
def par_fail_fast_uncaught(ctx: WorkflowContext, n: int) -> Any:
    group = ctx.parallel("fan")
    group.do("fails", par_kid_fails, 7)
    group.do("waits", par_kid_waits, n)
    return group.join()


def test_a_run_failed_by_a_fail_fast_join_is_not_retried(
    alias: str, engine: WorkflowEngine
) -> None:
    from pikku_django.workflows import WorkflowRunStateError

    run = _finish(engine, engine.start(par_fail_fast_uncaught, 1))
    assert run.status == RunStatus.FAILED
    assert "Step 'fails' failed" in run.error["message"]
    with pytest.raises(WorkflowRunStateError, match=r"parallel group 'fan'.*start a new run"):
        engine.retry(run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
