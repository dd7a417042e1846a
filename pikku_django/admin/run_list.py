"""The runs list's columns, laid out to fit a laptop's screen beside the admin's sidebars.

Seven columns, each at most one line of headline with quieter lines below it: the
workflow (and the parent a child run was started by), the status, the current step
(and what a suspended run waits for), when the run started (and how long it took),
its attempts, and its queue (and priority, concurrency key and start time, when set).
Names are cut with an ellipsis to the column's width (admin.css) and shown whole as
the cell's tooltip.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from pikku_django.admin._typing import AdminMixin
from pikku_django.admin.formatting import (
    EMPTY,
    clipped,
    format_duration,
    format_time,
    workflow_title,
)
from pikku_django.admin.queries import run_duration
from pikku_django.models import RunStatus, WorkflowRun


def lines(*parts: SafeString | None) -> SafeString:
    """A cell's lines: the headline and what is set of the quieter ones."""
    return format_html_join("", "{}", ((part,) for part in parts if part is not None))


class RunListMixin(AdminMixin):
    """The runs list's columns."""

    list_display = (
        "short_id",
        "workflow_cell",
        "status_badge",
        "step_cell",
        "started_cell",
        "attempts",
        "queue_cell",
    )
    list_display_links = ("short_id",)

    @admin.display(description=gettext_lazy("id"), ordering="id")
    def short_id(self, obj: WorkflowRun) -> SafeString:
        return format_html('<code title="{}">{}</code>', obj.pk, str(obj.pk)[:8])

    @admin.display(description=gettext_lazy("workflow"), ordering="workflow")
    def workflow_cell(self, obj: WorkflowRun) -> SafeString:
        parent_id = getattr(obj, "parent_run_id", None)
        parent = None
        if parent_id:
            url = reverse("admin:pikku_django_workflowrun_change", args=[parent_id])
            parent = format_html(
                '<span class="pikku-clip pikku-sub">{} '
                '<a href="{}" class="pikku-parent"><code>{}</code></a></span>',
                _("child of"),
                url,
                str(parent_id)[:8],
            )
        return lines(clipped(workflow_title(obj.workflow, obj.idempotency_key)), parent)

    @admin.display(description=gettext_lazy("current step"))
    def step_cell(self, obj: WorkflowRun) -> SafeString:
        reason = None
        if obj.status == RunStatus.SUSPENDED and obj.suspend_reason:
            reason = clipped(_("waits for: %(reason)s") % {"reason": obj.suspend_reason}, sub=True)
        return lines(clipped(getattr(obj, "current_step", None) or EMPTY), reason)

    @admin.display(description=gettext_lazy("started"), ordering="created_at")
    def started_cell(self, obj: WorkflowRun) -> SafeString:
        took = format_duration(run_duration(obj))
        if not obj.is_terminal:
            took = _("%(duration)s so far") % {"duration": took}
        return lines(
            format_html('<span class="pikku-line">{}</span>', format_time(obj.created_at)),
            format_html('<span class="pikku-line pikku-sub">{}</span>', took),
        )

    @admin.display(description=gettext_lazy("attempts"))
    def attempts(self, obj: WorkflowRun) -> int:
        return getattr(obj, "attempt_count", None) or 0

    @admin.display(description=gettext_lazy("queue"), ordering="queue")
    def queue_cell(self, obj: WorkflowRun) -> SafeString:
        priority = key = start = None
        if obj.priority:
            priority = clipped(_("priority %(n)s") % {"n": obj.priority}, sub=True)
        if obj.concurrency_key is not None:
            waiting = obj.key_waiting and obj.status == RunStatus.RUNNING
            text = _("key %(key)s (waiting)") if waiting else _("key %(key)s")
            key = clipped(text % {"key": obj.concurrency_key}, sub=True)
        if obj.start_at is not None:
            start = clipped(_("starts %(when)s") % {"when": format_time(obj.start_at)}, sub=True)
        return lines(clipped(obj.queue or _("(default)")), priority, key, start)


__all__ = ["RunListMixin", "lines"]
