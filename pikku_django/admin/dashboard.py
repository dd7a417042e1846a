"""The operator's dashboard: one admin page with what runs, waits, fails and works now.

It lives at ``<admin>/pikku_django/workflowrun/dashboard/`` (linked from the runs
list) for users who may view workflow runs, and refreshes itself: the page
fetches its own panel again every ``?refresh=`` seconds (default 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from pikku_django.admin._typing import AdminMixin
from pikku_django.admin.charts import line_chart
from pikku_django.admin.formatting import (
    admin_database,
    format_duration,
    format_time,
    status_badge,
    status_label,
    workflow_title,
)
from pikku_django.admin.stats import Figures, collect
from pikku_django.heartbeats import is_alive
from pikku_django.models import RunStatus, StepStatus

DEFAULT_REFRESH = 10


def changelist(model: str, **params: str) -> str:
    """The admin list of ``model`` (workflowrun, workflowstep, stepattempt) filtered by params."""
    url = reverse(f"admin:pikku_django_{model}_changelist")
    return f"{url}?{urlencode(params)}" if params else url


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    total: int
    url: str
    svg: SafeString


def charts(figures: Figures) -> list[Chart]:
    since = timezone.localtime(figures.since)
    until = timezone.localtime(figures.now)
    started_since = figures.since.isoformat(sep=" ", timespec="seconds")
    specs = (
        ("started", _("Runs started"), changelist("workflowrun", created_at__gte=started_since)),
        ("completed", _("Runs completed"), changelist("workflowrun", status__exact="completed")),
        ("failed", _("Runs failed"), changelist("workflowrun", status__exact="failed")),
        ("step_failures", _("Step failures"), changelist("stepattempt", status__exact="failed")),
    )
    out = []
    for key, title, url in specs:
        series = figures.series[key]
        css = "pikku-chart-bad" if key in ("failed", "step_failures") else "pikku-chart-line"
        label = _("%(title)s per minute, last 24 hours") % {"title": title}
        svg = line_chart(series.counts, since=since, until=until, title=label, css=css)
        out.append(Chart(key, str(title), series.total, url, svg))
    return out


def panel_context(figures: Figures) -> dict[str, Any]:
    """What the dashboard's panel template shows, with a link for each figure."""
    now = figures.now
    return {
        "pikku_generated": format_time(now),
        "pikku_statuses": [
            {
                "status": status,
                "badge": status_badge(status),
                "count": figures.by_status.get(status, 0),
                "url": changelist("workflowrun", status__exact=status),
            }
            for status in RunStatus.values
        ],
        "pikku_total": sum(figures.by_status.values()),
        "pikku_workflows": [
            {
                "name": workflow_title(w.workflow, None)
                if w.workflow != "pikku.webhooks.dispatch"
                else _("webhook handlers"),
                "workflow": w.workflow,
                "total": w.total,
                "url": changelist("workflowrun", workflow=w.workflow),
                "cells": [
                    {
                        "count": w.by_status.get(status, 0),
                        "url": changelist("workflowrun", workflow=w.workflow, status__exact=status),
                    }
                    for status in RunStatus.values
                ],
            }
            for w in figures.by_workflow
        ],
        "pikku_status_names": [status_label(s) for s in RunStatus.values],
        "pikku_charts": charts(figures),
        "pikku_queues": [
            {
                "queue": q.queue,
                "running": q.running,
                "waiting": q.waiting,
                "oldest_wait": format_duration(q.oldest_wait(now)) if q.oldest_ready else "-",
                "pause": figures.pauses.get(q.queue),
                "paused_since": format_duration(now - figures.pauses[q.queue].paused_at)
                if q.queue in figures.pauses
                else "",
                "running_url": changelist(
                    "workflowstep", queue=q.queue, status__exact=StepStatus.RUNNING
                ),
                "waiting_url": changelist(
                    "workflowstep",
                    queue=q.queue,
                    status__in=f"{StepStatus.PENDING},{StepStatus.SCHEDULED}",
                ),
            }
            for q in figures.queues
        ],
        "pikku_workers": [
            {
                "worker": w.worker_id,
                "host": w.hostname,
                "queues": ", ".join(w.queues or []) or "-",
                "concurrency": w.concurrency,
                "running": w.running,
                "version": w.version,
                "started": format_time(w.started_at),
                "seen": _("%(ago)s ago") % {"ago": format_duration(now - w.seen_at)},
                "alive": is_alive(w, now=now),
                "stopped": w.stopped_at is not None,
                "url": changelist("stepattempt", q=w.worker_id),
            }
            for w in figures.workers
        ],
        "pikku_stuck": [
            {
                "run": run,
                "title": workflow_title(run.workflow, run.idempotency_key),
                "badge": status_badge(run.status),
                "since": format_time(run.updated_at),
                "for": format_duration(now - run.updated_at),
                "url": reverse("admin:pikku_django_workflowrun_change", args=[run.pk]),
            }
            for run in figures.stuck
        ],
    }


class DashboardMixin(AdminMixin):
    """Adds the dashboard page to the runs' admin."""

    dashboard_template = "admin/pikku_django/dashboard.html"
    dashboard_panel_template = "admin/pikku_django/dashboard_panel.html"

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        view = self.admin_site.admin_view(self.dashboard_view)
        return [
            path("dashboard/", view, name=f"{opts.app_label}_{opts.model_name}_dashboard"),
            *super().get_urls(),
        ]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            refresh = int(request.GET.get("refresh", DEFAULT_REFRESH))
        except ValueError:
            refresh = DEFAULT_REFRESH
        refresh = min(max(refresh, 1), 3600)
        context = panel_context(collect(admin_database(request)))
        request.current_app = self.admin_site.name
        if request.GET.get("panel"):
            return TemplateResponse(request, self.dashboard_panel_template, context)
        opts = self.opts
        context.update(
            {
                **self.admin_site.each_context(request),
                "title": _("Workflow dashboard"),
                "subtitle": None,
                "opts": opts,
                "pikku_refresh": refresh,
                "pikku_panel_url": f"{request.path}?{urlencode({'panel': 1})}",
                "media": self.media,
            }
        )
        return TemplateResponse(request, self.dashboard_template, context)
