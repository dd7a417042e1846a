"""The run status endpoint and its live stream, under WSGI and ASGI."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import Permission
from django.db import connections
from django.test import AsyncClient, Client
from django.urls import reverse

from pikku_django.leases import InMemoryLeaseService
from pikku_django.workflows import FakeClock, WorkflowEngine, step, workflow
from tests.conftest import database_alias, on_databases

pytestmark = pytest.mark.django_db(transaction=True)


@step(name="stream.finish")
def finish(data: Any) -> str:
    return f"done with {data}"


@workflow(name="stream.story")
def story(ctx: Any, input: Any) -> Any:
    ctx.sleep("nap", 60)
    approval = ctx.suspend("needs approval")
    return ctx.do("finish", finish, approval)


def parse(chunk: bytes) -> tuple[str, Any]:
    lines = dict(line.split(": ", 1) for line in chunk.decode().strip().split("\n") if ": " in line)
    return lines["event"], json.loads(lines["data"])


def frames(response: Any) -> Iterator[tuple[str, Any]]:
    for chunk in response.streaming_content:
        if chunk.startswith(b":"):
            continue
        yield parse(chunk)


@pytest.fixture
def viewer(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user("viewer", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def fast_stream(settings: Any) -> None:
    settings.PIKKU = {"STREAM_POLL_INTERVAL": 0.02, "STREAM_HEARTBEAT": 60}


def engine() -> WorkflowEngine:
    return WorkflowEngine("default", leases=InMemoryLeaseService(), clock=FakeClock())


def test_frames_in_order_for_a_run_that_sleeps_suspends_resumes_and_completes(
    viewer: Client, fast_stream: None
) -> None:
    wf = engine()
    run = wf.start("stream.story")
    response = viewer.get(reverse("pikku_django:run-stream", args=[run.id]))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    it = frames(response)

    event, data = next(it)
    assert event == "init"
    assert (data["status"], data["steps"]) == ("running", [])

    wf.run_until_idle()
    event, data = next(it)
    assert event == "update"
    assert data["steps"] == [{"name": "nap", "status": "scheduled", "attempt": 0}]

    wf.clock.advance(61)
    wf.run_until_idle()
    event, data = next(it)
    assert (event, data["status"]) == ("update", "suspended")
    event, data = next(it)
    assert (event, data["reason"]) == ("suspended", "needs approval")

    wf.resume(run.id, "alice")
    event, data = next(it)
    assert (event, data["status"]) == ("update", "running")

    wf.run_until_idle()
    seen = list(it)
    assert [e for e, _ in seen][-1] == "done"
    assert seen[-1][1]["status"] == "completed"
    assert seen[-1][1]["output"] == "done with alice"
    updates = [d for e, d in seen if e == "update"]
    assert all(a != b for a, b in itertools.pairwise(updates))


def test_a_settled_run_streams_init_then_done(viewer: Client, fast_stream: None) -> None:
    wf = engine()
    run = wf.start("stream.story")
    wf.cancel(run.id)
    response = viewer.get(reverse("pikku_django:run-stream", args=[run.id]))
    assert [e for e, _ in frames(response)] == ["init", "done"]


@on_databases("postgres")
def test_client_going_away_leaks_no_connection_or_thread(
    vendor: str, django_user_model: Any, settings: Any
) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {
        "WORKFLOW_DATABASE": alias,
        "STREAM_POLL_INTERVAL": 0.02,
        "STREAM_HEARTBEAT": 60,
    }
    user = django_user_model.objects.create_user("su", password="pw", is_superuser=True)
    client = Client()
    client.force_login(user)
    wf = WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())
    run = wf.start("stream.story")
    threads_before = threading.active_count()
    response = client.get(reverse("pikku_django:run-stream", args=[run.id]))
    it = frames(response)
    assert next(it)[0] == "init"
    listener_threads = threading.active_count() - threads_before  # one LISTEN per process
    assert listener_threads <= 1
    response.close()  # the client went away
    assert connections[alias].connection is None, "the stream left its connection open"
    assert threading.active_count() <= threads_before + listener_threads


def test_status_json(viewer: Client) -> None:
    wf = engine()
    run = wf.start("stream.story")
    wf.run_until_idle()
    data = viewer.get(reverse("pikku_django:run-status", args=[run.id])).json()
    assert data["status"] == "running"
    assert data["steps"][0]["name"] == "nap"


@pytest.mark.parametrize("name", ["run-status", "run-stream"])
def test_only_users_allowed_to_view_the_run(name: str, django_user_model: Any) -> None:
    run = engine().start("stream.story")
    url = reverse(f"pikku_django:{name}", args=[run.id])
    assert Client().get(url).status_code == 403
    user = django_user_model.objects.create_user("nobody", password="pw")
    client = Client()
    client.force_login(user)
    assert client.get(url).status_code == 403
    unknown = reverse(f"pikku_django:{name}", args=["00000000-0000-0000-0000-000000000000"])
    assert client.get(unknown).status_code == 404


def allow_everyone(request: Any, run: Any) -> bool:
    return run.workflow == "stream.story"


def test_a_project_check_replaces_the_permission(settings: Any) -> None:
    settings.PIKKU = {"RUN_VIEW_PERMISSION": "tests.test_run_stream.allow_everyone"}
    run = engine().start("stream.story")
    assert Client().get(reverse("pikku_django:run-status", args=[run.id])).status_code == 200


def test_stream_under_asgi_and_a_cancelled_client(django_user_model: Any, settings: Any) -> None:
    settings.PIKKU = {"STREAM_POLL_INTERVAL": 0.02, "STREAM_HEARTBEAT": 60}
    async_to_sync(_asgi_story)(django_user_model)


async def _asgi_story(django_user_model: Any) -> None:
    user = await sync_to_async(django_user_model.objects.create_user)(
        "async", password="pw", is_superuser=True
    )
    client = AsyncClient()
    await client.aforce_login(user)
    wf = engine()
    run = await sync_to_async(wf.start)("stream.story")
    response = await client.get(reverse("pikku_django:run-stream", args=[run.id]))
    stream = response.streaming_content.__aiter__()
    event, _ = parse(await asyncio.wait_for(stream.__anext__(), 60))
    assert event == "init"
    await sync_to_async(wf.cancel)(run.id)
    event, data = parse(await asyncio.wait_for(stream.__anext__(), 60))
    assert (event, data["status"]) == ("update", "cancelled")
    event, _ = parse(await asyncio.wait_for(stream.__anext__(), 60))
    assert event == "done"

    second = await sync_to_async(wf.start)("stream.story")
    response = await client.get(reverse("pikku_django:run-stream", args=[second.id]))
    stream = response.streaming_content.__aiter__()
    assert parse(await asyncio.wait_for(stream.__anext__(), 60))[0] == "init"
    await stream.aclose()  # the client went away mid-stream
