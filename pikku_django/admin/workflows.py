"""Admin screens for workflow runs: the list, the run page, and the operator's actions.

Runs are read-only: they are written by the engine, and an edit by hand would
break its invariants (fenced attempts, memoised results). Operators steer runs
instead, with Django's built-in "Can change workflow run" permission
(``pikku_django.change_workflowrun``); users without it are offered none of this
and are refused (403) if they post anyway:

- The run page's **Cancel**, **Resume** (with JSON data) and **Retry** buttons,
  each through a confirmation page (:mod:`pikku_django.admin.steering`).
- The list's bulk actions, the same operations run by run (resume with no data).
- Both write an admin log entry per run (who, what, the data): the run's History.
- **Delete** needs "Can delete workflow run" and is refused for runs that are still
  running or suspended (cancel them first): deleting a live run would strand
  the worker on its step, or a parent run waiting for it. Deleting a finished
  run deletes its steps and attempts with it.

The screens read the ``PIKKU['WORKFLOW_DATABASE']`` database. Steps and attempts
have their own (read-only) screens in :mod:`pikku_django.admin.steps`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.utils import NestedObjects
from django.contrib.auth import get_permission_codename
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponseBase
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from pikku_django.admin._bulk_actions import operate
from pikku_django.admin.dashboard import DashboardMixin
from pikku_django.admin.formatting import (
    admin_database,
    error_block,
    format_duration,
    format_time,
    json_block,
    pretty_json,
    status_badge,
    workflow_database,
    workflow_title,
)
from pikku_django.admin.queries import queues, run_duration, search_filter, with_list_columns
from pikku_django.admin.queues_page import QueuesPageMixin
from pikku_django.admin.run_events import events_table, published_block
from pikku_django.admin.run_forks import RunForkMixin
from pikku_django.admin.run_list import RunListMixin
from pikku_django.admin.run_live import RunLivePartsMixin
from pikku_django.admin.run_page import build_timeline, load_steps
from pikku_django.admin.steering import Operation
from pikku_django.admin.steps import (
    ADMIN_CSS,
    StepAttemptAdmin,
    WorkflowDatabaseMixin,
    WorkflowStepAdmin,
)
from pikku_django.models import StepAttempt, WorkflowRun
from pikku_django.models.workflows import WorkflowRunQuerySet
from pikku_django.workflows.store import store_for

logger = logging.getLogger(__name__)


def run_stream_url(run: WorkflowRun) -> str | None:
    """The run's live status stream, or None when the project did not include our URLs."""
    try:
        return reverse("pikku_django:run-stream", args=[run.pk])
    except NoReverseMatch:
        return None


# -- what a bulk action did -------------------------------------------------------------


# -- filters ------------------------------------------------------------------------------


class QueueFilter(admin.SimpleListFilter):
    """Runs with a step on the chosen queue."""

    title = gettext_lazy("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in queues(admin_database(request))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        queue = self.value()
        if not queue:
            return queryset
        return cast("WorkflowRunQuerySet[WorkflowRun]", queryset).with_step_on(queue)


# -- runs -----------------------------------------------------------------------------


@admin.register(WorkflowRun)
class WorkflowRunAdmin(
    QueuesPageMixin,
    DashboardMixin,
    RunLivePartsMixin,
    RunForkMixin,
    RunListMixin,
    WorkflowDatabaseMixin,
    admin.ModelAdmin,  # type: ignore[type-arg]
):
    """Runs, read-only, with their step timeline and tree; steered by buttons and actions."""

    list_filter = (
        "status",
        ("workflow", admin.AllValuesFieldListFilter),
        QueueFilter,
        "priority",
        "key_waiting",
        ("concurrency_key", admin.EmptyFieldListFilter),
        ("created_at", admin.DateFieldListFilter),
    )
    date_hierarchy = "created_at"
    search_fields = ("id", "idempotency_key")
    search_help_text = gettext_lazy(
        "Id, idempotency key or workflow; on PostgreSQL also the input's text."
    )
    actions = ("cancel_runs", "resume_runs", "retry_runs", "delete_selected")
    fieldsets = (
        (None, {"fields": ("id", "workflow_name", "version", "idempotency_key", "inline")}),
        (
            gettext_lazy("Timing"),
            {
                "fields": (
                    "started",
                    "last_change",
                    "duration",
                    "next_orchestration",
                    "deadline_at",
                    "wakes",
                )
            },
        ),
        (
            gettext_lazy("Scheduling"),
            {
                "fields": (
                    "queue_name",
                    "priority",
                    "start_at",
                    "concurrency_key",
                    "concurrency_limit",
                    "key_waiting",
                )
            },
        ),
        (gettext_lazy("Data"), {"fields": ("input_json",)}),
        (gettext_lazy("Events and published values"), {"fields": ("events", "published_json")}),
    )
    readonly_fields = (
        "id",
        "workflow_name",
        "idempotency_key",
        "inline",
        "started",
        "last_change",
        "duration",
        "next_orchestration",
        "deadline_at",
        "wakes",
        "input_json",
        "version",
        "events",
        "published_json",
        "queue_name",
        "priority",
        "start_at",
        "concurrency_key",
        "concurrency_limit",
        "key_waiting",
    )

    class Media:
        css = ADMIN_CSS

    # -- read-only, and who may do what ------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # fields are never edited; the actions check has_operate_permission

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Cancel, resume and retry: Django's "Can change workflow run" permission."""
        opts = self.opts
        codename = get_permission_codename("change", opts)
        return request.user.has_perm(f"{opts.app_label}.{codename}")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and not obj.is_terminal:
            return False  # cancel it first
        return super().has_delete_permission(request, obj)

    def get_deleted_objects(
        self, objs: Iterable[WorkflowRun], request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[str]]:
        """Runs take their steps and attempts with them; only the runs need the permission."""
        objs = list(objs)
        if not objs:
            return [], {}, set(), []
        collector = NestedObjects(using=workflow_database())
        collector.collect(objs)

        def describe(obj: Model) -> Any:
            if isinstance(obj, StepAttempt):
                return _("Attempt %(n)d (%(status)s)") % {"n": obj.attempt, "status": obj.status}
            return f"{capfirst(obj._meta.verbose_name)}: {obj}"

        to_delete = collector.nested(describe)
        model_count = {
            # django-stubs keys model_objs by str; Django keys it by model class.
            str(model._meta.verbose_name_plural): len(found)  # type: ignore[attr-defined]
            for model, found in collector.model_objs.items()
        }
        perms_needed: set[str] = set()
        if not all(self.has_delete_permission(request, run) for run in objs):
            perms_needed.add(str(self.opts.verbose_name))
        protected = [str(obj) for obj in collector.protected]
        return to_delete, model_count, perms_needed, protected

    def delete_model(self, request: HttpRequest, obj: WorkflowRun) -> None:
        """Delete the run (a finished one) through the workflow store."""
        store_for(obj._state.db or workflow_database()).delete_runs([obj.pk])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        """Delete the selected runs through the workflow store."""
        store_for(queryset.db).delete_runs(list(queryset.values_list("pk", flat=True)))

    # -- the list ----------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        return with_list_columns(super().get_queryset(request))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun], search_term: str
    ) -> tuple[QuerySet[WorkflowRun], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(search_filter(term, queryset.db)), False

    @admin.display(description=gettext_lazy("workflow"), ordering="workflow")
    def workflow_name(self, obj: WorkflowRun) -> str:
        return workflow_title(obj.workflow, obj.idempotency_key)

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, obj: WorkflowRun) -> SafeString:
        return status_badge(obj.status, obj.get_status_display())

    @admin.display(description=gettext_lazy("started"), ordering="created_at")
    def started(self, obj: WorkflowRun) -> str:
        return format_time(obj.created_at)

    @admin.display(description=gettext_lazy("last change"), ordering="updated_at")
    def last_change(self, obj: WorkflowRun) -> str:
        return format_time(obj.updated_at)

    @admin.display(description=gettext_lazy("duration"))
    def duration(self, obj: WorkflowRun) -> str:
        text = format_duration(run_duration(obj))
        return text if obj.is_terminal else _("%(duration)s so far") % {"duration": text}

    @admin.display(description=gettext_lazy("queue"), ordering="queue")
    def queue_name(self, obj: WorkflowRun) -> str:
        return obj.queue or _("(default)")

    @admin.display(description=gettext_lazy("next orchestration"))
    def next_orchestration(self, obj: WorkflowRun) -> str:
        return format_time(obj.wake_at)

    # -- actions ----------------------------------------------------------------------

    @admin.action(
        permissions=["operate"],
        description=gettext_lazy(
            "Cancel selected running or suspended runs (needs “Can change workflow run”)"
        ),
    )
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        operate(self, request, queryset, Operation.CANCEL)

    @admin.action(
        permissions=["operate"],
        description=gettext_lazy(
            "Resume selected suspended runs, with no data (needs “Can change workflow run”)"
        ),
    )
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        operate(self, request, queryset, Operation.RESUME)

    @admin.action(
        permissions=["operate"],
        description=gettext_lazy(
            "Retry selected failed runs from the failed step (needs “Can change workflow run”)"
        ),
    )
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        operate(self, request, queryset, Operation.RETRY)

    @admin.action(
        permissions=["delete"],
        description=gettext_lazy("Delete selected finished workflow runs"),
    )
    def delete_selected(
        self, request: HttpRequest, queryset: WorkflowRunQuerySet[WorkflowRun]
    ) -> HttpResponseBase | None:
        """Django's delete, refused while a selected run is still running or suspended."""
        live = queryset.active().count()
        if live:
            self.message_user(
                request,
                ngettext(
                    "Nothing was deleted: %(count)d selected run is still running or "
                    "suspended. Cancel it first.",
                    "Nothing was deleted: %(count)d selected runs are still running or "
                    "suspended. Cancel them first.",
                    live,
                )
                % {"count": live},
                messages.ERROR,
            )
            return None
        return django_delete_selected(self, request, queryset)

    # -- the run page ------------------------------------------------------------------

    @admin.display(description=gettext_lazy("input"))
    def input_json(self, obj: WorkflowRun) -> SafeString | str:
        return json_block(obj.input)

    @admin.display(description=gettext_lazy("events"))
    def events(self, obj: WorkflowRun) -> SafeString | str:
        return events_table(obj)

    @admin.display(description=gettext_lazy("published values"))
    def published_json(self, obj: WorkflowRun) -> SafeString | str:
        return published_block(obj)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: WorkflowRun | None = None,
    ) -> Any:
        if obj is not None:
            using = admin_database(request)
            steps = load_steps(obj, using)
            context["pikku_timeline"] = build_timeline(obj, using, steps)
            context["pikku_stream_url"] = run_stream_url(obj)
            context.update(self.live_parts_context(request, obj, steps))
            context.update(self.fork_context(request, obj))
            context["pikku_title"] = title = workflow_title(obj.workflow, obj.idempotency_key)
            context["subtitle"] = f"{title} {obj.pk}"  # the window's title: no status to go stale
            context["pikku_badge"] = status_badge(
                obj.status, obj.get_status_display(), element_id="pikku-run-status"
            )
            context["pikku_output"] = None if obj.output is None else pretty_json(obj.output)
            context["pikku_error"] = error_block(obj.error) if obj.error else None
            context["pikku_now"] = format_time(timezone.now())
        return super().render_change_form(request, context, add, change, form_url, obj)


__all__ = [
    "StepAttemptAdmin",
    "WorkflowRunAdmin",
    "WorkflowStepAdmin",
    "build_timeline",
    "json_block",
]
