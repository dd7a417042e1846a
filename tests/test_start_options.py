"""One list of start options: ``start_workflow``, ``astart_workflow`` and
``WorkflowEngine.start`` take every key of ``StartOptions`` and refuse any other,
on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings
from django.utils import timezone

from pikku_django.models import RunStatus
from pikku_django.workflows import (
    StartOptions,
    WorkflowContext,
    WorkflowEngine,
    astart_workflow,
    start_workflow,
    workflow,
)
from pikku_django.workflows.api import reset_engine
from tests.conftest import database_alias, on_databases


@workflow(name="tests.start_options")
def started(ctx: WorkflowContext, input: Any) -> Any:
    return input


@pytest.fixture
def alias(vendor: str) -> Iterator[str]:
    alias = database_alias(vendor)
    with override_settings(PIKKU={"WORKFLOW_DATABASE": alias}):
        reset_engine()
        yield alias
    reset_engine()


def _every_option(key: str) -> StartOptions:
    return {
        "idempotency_key": key,
        "inline": False,
        "priority": 7,
        "queue": "mail",
        "start_at": None,
        "delay": "1h",
        "concurrency_key": f"customer-{key}",
        "concurrency_limit": 2,
        "deadline": None,
        "timeout": "2h",
        "debounce": None,
    }


def test_the_options_are_the_ones_start_workflow_documents() -> None:
    doc = start_workflow.__doc__ or ""
    assert StartOptions.__optional_keys__ == set(StartOptions.__annotations__)
    for key in StartOptions.__annotations__:
        assert f"``{key}``" in doc or f"``{key}=" in doc, key


@on_databases("sqlite", "postgres", "mariadb")
def test_each_entry_point_takes_every_start_option(alias: str) -> None:
    before = timezone.now()
    runs = [
        start_workflow(started, {"n": 1}, **_every_option("sync")),
        async_to_sync(astart_workflow)(started, {"n": 2}, **_every_option("async")),
        WorkflowEngine(alias).start(started, {"n": 3}, **_every_option("engine")),
    ]
    for run, key in zip(runs, ("sync", "async", "engine"), strict=True):
        run.refresh_from_db(using=alias)
        assert run._state.db == alias
        assert (run.idempotency_key, run.priority, run.queue) == (key, 7, "mail")
        assert (run.concurrency_key, run.concurrency_limit) == (f"customer-{key}", 2)
        assert run.start_at is not None
        assert run.start_at >= before + timedelta(minutes=59)
        assert run.deadline_at is not None
        assert run.deadline_at >= before + timedelta(hours=2)
        assert run.status == RunStatus.RUNNING


@on_databases("sqlite", "postgres", "mariadb")
def test_an_option_no_start_takes_is_refused_and_starts_nothing(alias: str) -> None:
    engine = WorkflowEngine(alias)
    options: dict[str, Any] = {"idempotency_key": "k", "prority": 5}
    with pytest.raises(TypeError, match="'prority'"):
        start_workflow(started, None, **options)
    with pytest.raises(TypeError, match="'prority'"):
        async_to_sync(astart_workflow)(started, None, **options)
    with pytest.raises(TypeError, match="'prority'"):
        engine.start(started, None, **options)
    assert not engine.runs().exists()
