"""Text no database stores (a NUL character, a surrogate) in an error is stored with
U+FFFD in its place on every database, and in a value it is refused on every database:
neither leaves a run or a step going round."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import AttemptStatus, RunStatus, StepStatus, TriggerSource, WorkflowRun
from pikku_django.webhooks import lifecycle
from pikku_django.workflows import (
    FakeClock,
    NotSerializableError,
    WorkflowContext,
    WorkflowEngine,
    step,
    workflow,
)
from pikku_django.workflows.errors import (
    WorkflowDefinitionError,
    serialize_error,
    storable_error,
    storable_text,
)
from tests.conftest import database_alias, on_databases

VENDORS = ("sqlite", "postgres", "mariadb")
NUL_TEXT = "a\x00b"
STORED = "a\ufffdb"
#: A file name with a byte that is not UTF-8, as os.fsdecode gives it (a lone surrogate).
UNDECODABLE = os.fsdecode(b"/no/such/dir/\xff.txt")
CALLS: list[str] = []


class NulNamedError(ValueError):
    """An exception whose very name, as stored, holds a NUL."""


NulNamedError.__qualname__ = "Nul\x00NamedError"


def nul_error() -> ValueError:
    """An exception with a NUL in its message, its type's name, a note and its cause."""
    try:
        raise RuntimeError("cause\x00text")
    except RuntimeError as cause:
        exc = NulNamedError(NUL_TEXT)
        exc.add_note("note\x00text")
        exc.__cause__ = cause
        return exc


@step(name="nul_raises")
def raises_nul() -> str:
    CALLS.append("queued")
    raise nul_error()


@step(name="nul_returns_undecodable")
def returns_undecodable() -> str:
    return UNDECODABLE


@workflow(name="nul_errors")
def nul_errors(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    """Raises, or makes, text with a NUL where ``inp["where"]`` says."""
    where = inp["where"]
    if where == "body":
        raise nul_error()
    if where == "undecodable":
        raise OSError(f"cannot read {UNDECODABLE}")
    if where == "queued":
        return ctx.do("step", "nul_raises", retries=1, retry_delay="10s")
    if where == "inline":

        def inline() -> str:
            CALLS.append("inline")
            raise nul_error()

        return ctx.do("step", inline, retries=1, retry_delay="10s")
    if where == "queued-undecodable":
        return ctx.do("step", "nul_returns_undecodable", retries=3)
    if where == "publish":
        ctx.set_event("value", {"text": NUL_TEXT})
        return "published"
    if where == "suspend":
        return ctx.suspend(NUL_TEXT)
    if where == "step-name":
        return ctx.do(NUL_TEXT, lambda: "ran")
    return ctx.wait_for_event("ev")


def _engine(vendor: str) -> tuple[WorkflowEngine, FakeClock]:
    clock = FakeClock()
    return WorkflowEngine(database_alias(vendor), leases=InMemoryLeaseService(), clock=clock), clock


def _one_pass(engine: WorkflowEngine, run: WorkflowRun) -> WorkflowRun:
    """The run after a single orchestration pass (which must not raise)."""
    assert engine.claim_due_runs(1) == [run.id]
    engine.orchestrate(run.id)
    return engine.get_run(run.id)


def _holds_unstorable(stored: Any) -> bool:
    text = json.dumps(stored, ensure_ascii=False)
    return "\x00" in text or "\\u0000" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _assert_escaped(error: dict[str, Any]) -> None:
    """``error`` is the stored nul_error(): every text in it kept, NUL as U+FFFD."""
    assert not _holds_unstorable(error)
    assert error["message"] == STORED
    assert error["type"].endswith("Nul\ufffdNamedError")
    for text in ("cause\ufffdtext", "note\ufffdtext", f"Nul\ufffdNamedError: {STORED}"):
        assert text in error["traceback"]


# -- what is stored -------------------------------------------------------------------


def test_storable_text_replaces_only_nul_and_surrogates() -> None:
    kept = "plain, ünïcödé, 😀, a backslash \\0 and \\x00, tabs\tand\nlines"
    assert storable_text(kept) == kept
    assert storable_text("\x00a\x00\x00") == "\ufffda\ufffd\ufffd"
    assert storable_text("x\udcffy\ud83d") == "x\ufffdy\ufffd"
    assert storable_error({"k\x00": ["v\x00", 1, None, {"n": "\x00"}]}) == {
        "k\ufffd": ["v\ufffd", 1, None, {"n": "\ufffd"}]
    }


def test_serialize_error_escapes_every_text_an_exception_carries() -> None:
    _assert_escaped(serialize_error(nul_error()))

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    broken = serialize_error(Unprintable())
    assert broken["message"] == "<exception str() failed>"
    assert "Unprintable" in broken["traceback"]


# -- errors a run meets ---------------------------------------------------------------


@on_databases(*VENDORS)
def test_a_body_raising_a_nul_fails_its_run_in_one_pass(vendor: str) -> None:
    engine, _ = _engine(vendor)
    run = _one_pass(engine, engine.start(nul_errors, {"where": "body"}))
    assert (run.status, run.pass_errors) == (RunStatus.FAILED, 0)
    _assert_escaped(run.error)


@on_databases(*VENDORS)
def test_an_error_quoting_an_undecodable_name_fails_its_run_in_one_pass(vendor: str) -> None:
    engine, _ = _engine(vendor)
    run = _one_pass(engine, engine.start(nul_errors, {"where": "undecodable"}))
    assert (run.status, run.pass_errors) == (RunStatus.FAILED, 0)
    assert run.error["type"] == "OSError"
    assert run.error["message"] == "cannot read /no/such/dir/\ufffd.txt"
    assert not _holds_unstorable(run.error)


@pytest.mark.parametrize("where", ["queued", "inline"])
@on_databases(*VENDORS)
def test_a_step_raising_a_nul_is_retried_then_failed(vendor: str, where: str) -> None:
    engine, clock = _engine(vendor)
    CALLS.clear()
    run = engine.start(nul_errors, {"where": where})
    engine.run_until_idle()
    made = engine.steps().get(run_id=run.id)
    assert (made.status, made.attempt) == (StepStatus.FAILED, 1)  # a retry is due
    assert engine.get_run(run.id).status == RunStatus.RUNNING
    clock.advance(11)
    engine.run_until_idle()
    made = engine.steps().get(run_id=run.id)
    assert (made.status, made.attempt) == (StepStatus.FAILED, 2)
    _assert_escaped(made.error)
    attempts = list(engine.attempts().filter(step_id=made.id).order_by("attempt"))
    assert [a.status for a in attempts] == [AttemptStatus.FAILED, AttemptStatus.FAILED]
    for attempt in attempts:
        _assert_escaped(attempt.error)
    assert [where, where] == CALLS
    run = engine.get_run(run.id)
    assert (run.status, run.pass_errors) == (RunStatus.FAILED, 0)
    assert run.error["code"] == "STEP_FAILED"
    assert STORED in run.error["message"]
    assert not _holds_unstorable(run.error)


@on_databases(*VENDORS)
def test_an_error_given_as_a_dict_is_stored_escaped(vendor: str) -> None:
    engine, _ = _engine(vendor)
    run = engine.start(nul_errors, {"where": "queued"})
    engine.orchestrate(run.id)
    made = engine.steps().get(run_id=run.id)
    claimed = engine.claim_step(made.id)
    assert claimed is not None
    given = {"type": "Remote\x00Error", "message": NUL_TEXT, "detail": ["x\x00"]}
    assert engine.set_step_error(made.id, given, claimed.attempt, final=True) is True
    made.refresh_from_db()
    assert made.status == StepStatus.FAILED
    assert made.error == {"type": "Remote\ufffdError", "message": STORED, "detail": ["x\ufffd"]}


@on_databases(*VENDORS)
def test_a_provider_error_with_a_nul_is_recorded_escaped(vendor: str) -> None:
    alias = database_alias(vendor)
    row = TriggerSource.objects.using(alias).create(name="nul-source")
    outcome = lifecycle._record(row, "error", f"setup failed: {NUL_TEXT}")
    stored = TriggerSource.objects.using(alias).get(name="nul-source")
    assert stored.detail == outcome.detail == f"setup failed: {STORED}"


# -- values a run makes or is given ----------------------------------------------------


@on_databases(*VENDORS)
def test_event_data_with_a_nul_is_refused(vendor: str) -> None:
    engine, _ = _engine(vendor)
    run = _one_pass(engine, engine.start(nul_errors, {"where": "event"}))
    assert run.status == RunStatus.RUNNING  # waiting for "ev"
    with pytest.raises(NotSerializableError, match="NUL"):
        engine.events.send(run.id, "ev", {"nested": [NUL_TEXT]})
    with pytest.raises(NotSerializableError, match="surrogate"):
        engine.events.send(run.id, "ev", UNDECODABLE)
    with pytest.raises(WorkflowDefinitionError, match="NUL"):
        engine.events.send(run.id, "e\x00v", "data")
    with pytest.raises(ValueError, match="NUL"):
        engine.events.send(run.id, "ev", "data", event_id="id\x00")
    assert not engine.events.waits.events().filter(run_id=run.id).exists()
    sent = engine.events.send(run.id, "ev", "plain")
    assert sent.outcome == "delivered"
    engine.run_until_idle()
    assert engine.get_run(run.id).output == "plain"


@pytest.mark.parametrize(
    ("where", "refused"),
    [
        ("publish", "The published value 'value' holds a NUL"),
        ("suspend", "The reason of suspension 'suspend' holds a NUL"),
        ("queued-undecodable", "holds a surrogate"),
        ("step-name", "A step name must be a non-empty str without NUL"),
    ],
)
@on_databases(*VENDORS)
def test_a_value_with_a_nul_made_by_a_run_fails_it_in_one_pass(
    vendor: str, where: str, refused: str
) -> None:
    engine, _ = _engine(vendor)
    run = engine.start(nul_errors, {"where": where})
    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert (run.status, run.pass_errors) == (RunStatus.FAILED, 0)
    assert refused in run.error["message"]
    assert engine.events.published_values(run.id) == {}
    if where == "queued-undecodable":
        made = engine.steps().get(run_id=run.id)
        assert (made.status, made.attempt) == (StepStatus.FAILED, 1)  # not retried
    else:
        assert not engine.steps().filter(run_id=run.id).exists()


@on_databases(*VENDORS)
def test_input_and_resume_data_with_a_surrogate_are_refused(vendor: str) -> None:
    engine, _ = _engine(vendor)
    with pytest.raises(NotSerializableError, match="surrogate"):
        engine.start(nul_errors, {"where": "body", "file": UNDECODABLE})
    assert not engine.runs().exists()
    run = _one_pass(engine, engine.start(nul_errors, {"where": "event"}))
    engine.runs().filter(id=run.id).update(status=RunStatus.SUSPENDED)
    with pytest.raises(NotSerializableError, match="surrogate"):
        engine.resume(run.id, {UNDECODABLE: 1})
    assert engine.get_run(run.id).status == RunStatus.SUSPENDED
