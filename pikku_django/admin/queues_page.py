"""The queues page: per queue what runs, what waits, its limits and whether it is
paused; per concurrency key its runs in progress and waiting.

It lives at ``<admin>/pikku_django/workflowrun/queues/`` (linked from the runs list
and the dashboard) for users who may view workflow runs; its Pause and Resume
buttons (see :mod:`pikku_django.admin.queue_pauses`) are for those who may change them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Count, Min, Q
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.translation import gettext as _

from pikku_django.admin.dashboard import changelist
from pikku_django.admin.formatting import EMPTY, admin_database, format_duration
from pikku_django.admin.queue_pauses import QueuePausesMixin
from pikku_django.dbclock import store_now_ms
from pikku_django.models import StepStatus, WorkflowRun, WorkflowStep
from pikku_django.models.workflows import WAITING_STEP_STATUSES
from pikku_django.workflows.config import engine_config
from pikku_django.workflows.control._rates import recent_claims
from pikku_django.workflows.control.pauses import PausedQueue, paused_queues
from pikku_django.workflows.store import store_for

#: The most concurrency keys the page lists (those waiting longest first).
KEYS_SHOWN = 50


@dataclass(frozen=True)
class QueueRow:
    """One queue on the page."""

    queue: str
    running: int
    waiting: int
    oldest_wait: str
    concurrency: str
    rate: str
    lease: str
    running_url: str
    waiting_url: str
    #: The queue's pause, or None while it is not paused.
    pause: PausedQueue | None = None

    @property
    def paused_since(self) -> str:
        """How long the queue has been paused (empty when it is not)."""
        if self.pause is None:
            return ""
        return format_duration(timezone.now() - self.pause.paused_at)


@dataclass(frozen=True)
class KeyRow:
    """One concurrency key with runs waiting or in progress."""

    key: str
    in_progress: int
    waiting: int
    limit: int
    url: str


def queue_rows(using: str) -> list[QueueRow]:
    """Every declared queue and every queue with a step running or waiting."""
    now = timezone.now()
    now_ms = store_now_ms(using)
    config = engine_config()
    store = store_for(using)
    open_steps = WorkflowStep.objects.using(using).open_queued()
    ready = Q(status__in=WAITING_STEP_STATUSES, available_at__lte=now)
    counted = {
        row["queue"]: row
        for row in open_steps.order_by()
        .values("queue")
        .annotate(
            running=Count("id", filter=Q(status=StepStatus.RUNNING, lease_expires_at__gte=now_ms)),
            waiting=Count("id", filter=ready),
            oldest=Min("available_at", filter=ready),
        )
    }
    pauses = {pause.queue: pause for pause in paused_queues(using)}
    rows = []
    for name in sorted(set(counted) | set(config.queues) | set(pauses)):
        found: Mapping[str, Any] = counted.get(name, {})
        declared = config.queues.get(name)
        rate = declared.rate if declared is not None else None
        oldest = found.get("oldest")
        rate_text = EMPTY
        if rate is not None:
            rate_text = _("%(used)d of %(count)d per %(period)s") % {
                "used": recent_claims(store, name, rate),
                "count": rate.count,
                "period": format_duration(timedelta(seconds=rate.per_seconds)),
            }
        concurrency = config.concurrency_of(name)
        rows.append(
            QueueRow(
                queue=name,
                running=found.get("running", 0),
                waiting=found.get("waiting", 0),
                oldest_wait=format_duration(now - oldest) if oldest else EMPTY,
                concurrency=str(concurrency) if concurrency is not None else _("no limit"),
                rate=rate_text if rate is not None else _("no limit"),
                lease=format_duration(timedelta(milliseconds=config.lease_ms_for_queue(name))),
                running_url=changelist("workflowstep", queue=name, status__exact="running"),
                waiting_url=changelist("workflowstep", queue=name, status__exact="scheduled"),
                pause=pauses.get(name),
            )
        )
    return rows


def key_rows(using: str) -> list[KeyRow]:
    """Concurrency keys with runs waiting or in progress, those waiting longest first."""
    live = WorkflowRun.objects.using(using).active().filter(concurrency_key__isnull=False)
    rows = (
        live.order_by()
        .values("concurrency_key")
        .annotate(
            waiting=Count("id", filter=Q(key_waiting=True)),
            in_progress=Count("id", filter=Q(key_waiting=False)),
            limit=Min("concurrency_limit"),
            first=Min("created_at"),
        )
        .order_by("-waiting", "first")[:KEYS_SHOWN]
    )
    return [
        KeyRow(
            key=str(row["concurrency_key"]),  # never null: filtered above
            in_progress=row["in_progress"],
            waiting=row["waiting"],
            limit=row["limit"],
            url=changelist("workflowrun", concurrency_key=str(row["concurrency_key"])),
        )
        for row in rows
    ]


class QueuesPageMixin(QueuePausesMixin):
    """Adds the queues page to the runs' admin."""

    queues_template = "admin/pikku_django/queues.html"

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        view = self.admin_site.admin_view(self.queues_view)
        return [
            path("queues/", view, name=f"{opts.app_label}_{opts.model_name}_queues"),
            *super().get_urls(),
        ]

    def queues_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        using = admin_database(request)
        request.current_app = self.admin_site.name
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": _("Queues and limits"),
            "subtitle": None,
            "opts": self.opts,
            "media": self.media,
            "pikku_queues": queue_rows(using),
            "pikku_keys": key_rows(using),
            "pikku_keys_shown": KEYS_SHOWN,
            "pikku_can_pause": self.has_pause_permission(request),
        }
        return TemplateResponse(request, self.queues_template, context)
