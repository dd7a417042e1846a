"""``manage.py pikku_runs fork``: its help, the confirmation it asks for, the fork it
starts, its refusals, and user data escaped in what it prints."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from pikku_django.models import RunStatus, StepKind, StepStatus, WorkflowRun
from pikku_django.workflows.api import get_engine, reset_engine
from tests.factories import WorkflowRunFactory, WorkflowStepFactory
from tests.fork_defs import CALLS, ORDER


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    reset_engine()
    CALLS.clear()
    yield
    reset_engine()


def run_command(*args: str) -> str:
    out = io.StringIO()
    call_command("pikku_runs", *args, stdout=out)
    return out.getvalue()


def finished_order() -> WorkflowRun:
    engine = get_engine()
    run = engine.start(ORDER, {"n": 5})
    engine.run_until_idle()
    engine.events.send(run.id, "approve", {"by": "ada"})
    engine.run_until_idle()
    done = engine.get_run(run.id)
    assert done.status == RunStatus.COMPLETED, done.error
    return done


def test_help_says_what_runs_again(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        call_command("pikku_runs", "fork", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "--from-step NAME" in text
    assert "RUN AGAIN" in text
    assert "happen again" in text
    assert "not run again" in text
    assert "--yes" in text


@pytest.mark.django_db(transaction=True)
def test_fork_asks_first_then_starts_the_new_run() -> None:
    original = finished_order()
    runs = WorkflowRun.objects.filter(forked_from=original)

    out = io.StringIO()
    with pytest.raises(CommandError, match="Not forked: confirm with --yes"):
        call_command("pikku_runs", "fork", str(original.id)[:8], "--from-step", "child", stdout=out)
    plan = out.getvalue()
    assert "kept, not run again (3): charge, publish:charged, record" in plan
    assert "RUN AGAIN, their effects repeated (3): child, event:approve, ship" in plan
    assert not runs.exists()

    CALLS.clear()
    text = run_command("fork", str(original.id), "--from-step", "child", "--yes")
    fork = runs.get()
    assert text.strip() == (
        f"Forked run {original.id} at step 'child': new run {fork.id} (3 steps kept)."
    )
    engine = get_engine()
    engine.run_until_idle()
    engine.events.send(fork.id, "approve", {"by": "ada"})
    engine.run_until_idle()
    assert engine.get_run(fork.id).output == original.output
    assert dict(CALLS) == {"double": 1, "ship": 1}
    assert f"forked from  {original.id} at 'child'" in run_command("show", str(fork.id))

    data = json.loads(run_command("fork", str(original.id), "--at", "6", "--yes", "--json"))
    assert data["forked_from"] == str(original.id)
    assert data["forked_at_step"] == "ship"
    assert data["status"] == RunStatus.RUNNING


@pytest.mark.django_db(transaction=True)
def test_fork_refusals_are_command_errors() -> None:
    engine = get_engine()
    running = engine.start(ORDER, {"n": 1})
    engine.run_until_idle()
    with pytest.raises(CommandError, match=r"is running: only a completed.*Cancel it first"):
        run_command("fork", str(running.id), "--from-step", "charge", "--yes")
    engine.cancel(running.id)
    with pytest.raises(CommandError, match="has no step named 'refund'"):
        run_command("fork", str(running.id), "--from-step", "refund", "--yes")
    with pytest.raises(CommandError, match="no step at position 9"):
        run_command("fork", str(running.id), "--at", "9", "--yes")
    assert not WorkflowRun.objects.filter(forked_from=running).exists()


@pytest.mark.django_db(transaction=True)
def test_step_names_are_escaped_in_the_plan() -> None:
    run = WorkflowRunFactory(workflow=ORDER, status=RunStatus.FAILED, version="1")
    for name in ("charge\x1b[2J", "ship\nforged line"):
        WorkflowStepFactory(
            run=run, name=name, kind=StepKind.QUEUED, status=StepStatus.SUCCEEDED, attempt=1
        )
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("pikku_runs", "fork", str(run.id), "--at", "2", stdout=out)
    text = out.getvalue()
    assert "\x1b" not in text
    assert "charge\\x1b[2J" in text
    assert "ship\\nforged line" in text
