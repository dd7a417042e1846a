"""A run's status as JSON, and as a live server-sent-event stream.

Frames: ``init`` (the run and the steps it has so far), ``update`` (only when the
run's or a step's status changed), ``suspended`` (with the reason; the stream
stays open for the resume) and ``done`` (then the stream ends).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    JsonResponse,
    StreamingHttpResponse,
)
from django.utils.encoding import escape_uri_path
from django.utils.module_loading import import_string
from django.views.decorators.http import require_GET

from pikku_django.conf import pikku_settings
from pikku_django.read_database import read_database
from pikku_django.views._aio import ChangeWaiter, read_snapshot, release_request_thread
from pikku_django.workflows.runs.status import RunSnapshot, notifications, snapshot

logger = logging.getLogger(__name__)


def _permission_check() -> Callable[[HttpRequest, RunSnapshot], bool]:
    check = pikku_settings.RUN_VIEW_PERMISSION
    if check is None:
        return lambda request, run: bool(
            request.user.is_authenticated and request.user.has_perm("pikku_django.view_workflowrun")
        )
    found: Callable[[HttpRequest, RunSnapshot], bool] = (
        import_string(check) if isinstance(check, str) else check
    )
    return found


def _visible_run(request: HttpRequest, run_id: uuid.UUID, using: str) -> RunSnapshot:
    snap = snapshot(run_id, using)
    if snap is None:
        raise Http404("No such workflow run")
    if not _permission_check()(request, snap):
        raise PermissionDenied("You may not see this workflow run")
    return snap


@require_GET
def run_status(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """The run's status and its steps' as JSON, read from ``PIKKU["READ_DATABASE"]``
    when one is set (it shows a replica's lag)."""
    return JsonResponse(_visible_run(request, run_id, read_database()).as_dict())


def frame(event: str, data: Any, frame_id: int) -> bytes:
    payload = json.dumps(data, separators=(",", ":"), default=str)
    return f"id: {frame_id}\nevent: {event}\ndata: {payload}\n\n".encode()


class _Frames:
    """Decides which frames a new snapshot calls for."""

    def __init__(self) -> None:
        self.last: RunSnapshot | None = None
        self.told_suspended = False
        self.count = 0

    def next(self, snap: RunSnapshot) -> tuple[list[bytes], bool]:
        out: list[bytes] = []
        if self.last is None:
            out.append(self._frame("init", snap.as_dict()))
        elif snap.changes_from(self.last):
            out.append(self._frame("update", snap.as_dict()))
        self.last = snap
        if snap.suspended and not self.told_suspended:
            out.append(
                self._frame("suspended", {"run": snap.run_id, "reason": snap.suspend_reason})
            )
        self.told_suspended = snap.suspended
        if snap.terminal:
            out.append(self._frame("done", snap.as_dict()))
            return out, True
        return out, False

    def _frame(self, event: str, data: Any) -> bytes:
        self.count += 1
        return frame(event, data, self.count)


def _sync_frames(run_id: str, using: str) -> Iterator[bytes]:
    state = _Frames()
    poll = float(pikku_settings.STREAM_POLL_INTERVAL)
    heartbeat = float(pikku_settings.STREAM_HEARTBEAT)
    deadline = time.monotonic() + float(pikku_settings.STREAM_MAX_SECONDS)
    last_sent = time.monotonic()
    try:
        while time.monotonic() < deadline:
            snap = snapshot(run_id, using)
            if snap is None:
                return
            frames, done = state.next(snap)
            yield from frames
            if frames:
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent >= heartbeat:
                yield b": keep-alive\n\n"
                last_sent = time.monotonic()
            if done:
                return
            notifications(using).wait(poll)
    finally:
        close_old_connections()


async def _async_frames(run_id: str, using: str) -> AsyncIterator[bytes]:
    release_request_thread()
    state = _Frames()
    poll = float(pikku_settings.STREAM_POLL_INTERVAL)
    heartbeat = float(pikku_settings.STREAM_HEARTBEAT)
    deadline = time.monotonic() + float(pikku_settings.STREAM_MAX_SECONDS)
    last_sent = time.monotonic()
    changes = ChangeWaiter(using)
    try:
        while time.monotonic() < deadline:
            snap = await read_snapshot(run_id, using)
            if snap is None:
                return
            frames, done = state.next(snap)
            for chunk in frames:
                yield chunk
            if frames:
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent >= heartbeat:
                yield b": keep-alive\n\n"
                last_sent = time.monotonic()
            if done:
                return
            await changes.wait(poll)
    except asyncio.CancelledError:
        logger.debug("Stream of run %s closed by the client", run_id)
        raise
    finally:
        changes.close()


@require_GET
def run_stream(request: HttpRequest, run_id: uuid.UUID) -> StreamingHttpResponse:
    """Follow a run live as server-sent events (WSGI and ASGI), read from the workflow
    database, whose notifications say when to look again."""
    using = pikku_settings.WORKFLOW_DATABASE
    snap = _visible_run(request, run_id, using)
    content: Any = (
        _async_frames(snap.run_id, using)
        if isinstance(request, ASGIRequest)
        else _sync_frames(snap.run_id, using)
    )
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def run_url_fallback(request: HttpRequest, value: str, view: str) -> HttpResponse:
    """A run's status or stream URL the run views do not match: 404 ``not a run id``
    for an id that is not a UUID; for one written another way (capitals, no dashes, a
    trailing slash) a GET is redirected to the run's URL and another method told it."""
    try:
        run_id = uuid.UUID(value)
    except ValueError:
        shown = value if len(value) <= 100 else f"{value[:100]}..."
        return JsonResponse(
            {"error": f"{shown!r} is not a run id (a UUID such as {uuid.UUID(int=0)})"},
            status=404,
        )
    prefix = request.path[: request.path.rindex(f"runs/{value}/{view}")]
    url = escape_uri_path(f"{prefix}runs/{run_id}/{view}")
    if request.method in ("GET", "HEAD"):
        return HttpResponsePermanentRedirect(url)
    return JsonResponse(
        {"error": f"this is not the run's URL: it is {request.build_absolute_uri(url)}"},
        status=404,
    )
