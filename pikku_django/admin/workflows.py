"""Admin screens for workflow runs, their steps and step attempts, with operator actions.

Everything here is read-only: runs, steps and attempts are written by the engine,
and an edit by hand would break its invariants (fenced attempts, memoised
results). Operators steer runs with actions instead:

- **Cancel**, **Resume** and **Retry** call the engine (``cancel``, ``resume`` with
  no data, ``retry``) run by run and report what they did. They need Django's
  built-in "Can change workflow run" permission (``pikku_django.change_workflowrun``);
  users without it are not offered them. An inline run (``inline=True``) is
  resumed or retried inline, within the request, as ``resume_workflow`` does.
- **Delete** needs "Can delete workflow run" and is refused for runs that are still
  running or suspended (cancel them first): deleting a live run would strand
  the worker on its step, or a parent run waiting for it. Deleting a finished
  run deletes its steps and attempts with it. Steps and attempts are never
  deleted on their own.

The screens read the ``PIKKU['WORKFLOW_DATABASE']`` database.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.utils import NestedObjects
from django.contrib.auth import get_permission_codename
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponseBase
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from pikku_django.dbclock import EpochMs, store_now_ms
from pikku_django.models import (
    TERMINAL_RUN_STATUSES,
    RunStatus,
    StepAttempt,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows.api import get_engine
from pikku_django.workflows.engine import WorkflowEngine
from pikku_django.workflows.errors import WorkflowRunStateError

logger = logging.getLogger(__name__)

EMPTY = "-"


# -- formatting -----------------------------------------------------------------------


def workflow_database() -> str:
    """The alias that holds runs, steps and attempts."""
    return get_engine().using


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON text (escaped when rendered)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def json_block(value: Any) -> SafeString | str:
    """``value`` as escaped, indented JSON in a ``<pre>``; a dash when empty."""
    if value is None:
        return EMPTY
    return format_html('<pre class="pikku-json">{}</pre>', pretty_json(value))


def without_traceback(error: Any) -> Any:
    """A stored error without its (multi-line) traceback, which is shown as text."""
    if isinstance(error, dict):
        return {k: v for k, v in error.items() if k != "traceback"}
    return error


def error_block(error: Any) -> SafeString | str:
    """A stored error: its fields as JSON, then its traceback as text (both escaped)."""
    if not error:
        return EMPTY
    if not isinstance(error, dict):
        return json_block(error)
    fields = without_traceback(error)
    traceback = error.get("traceback")
    if not traceback:
        return json_block(fields)
    return format_html(
        '<pre class="pikku-json">{}</pre><pre class="pikku-traceback">{}</pre>',
        pretty_json(fields),
        str(traceback),
    )


def error_part(error: Any, key: str) -> str:
    """One field (``type`` or ``message``) of a stored error, or empty."""
    if isinstance(error, dict):
        return str(error.get(key) or "")
    return ""


def format_duration(delta: timedelta | None) -> str:
    """A short human duration: ``850 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 1 min``."""
    if delta is None:
        return EMPTY
    ms = max(0, round(delta.total_seconds() * 1000))
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def lease_left_ms(step: WorkflowStep, now_ms: int | None) -> int | None:
    """Milliseconds left on the step's lease (negative once lapsed); None without one."""
    if step.lease_expires_at is None or now_ms is None:
        return None
    return int(step.lease_expires_at) - int(now_ms)


def format_lease_left(left: int | None) -> str:
    if left is None:
        return EMPTY
    if left > 0:
        return _("%(ms)s ms") % {"ms": f"{left:,}"}
    return _("lapsed %(ms)s ms ago") % {"ms": f"{-left:,}"}


def run_stream_url(run: WorkflowRun) -> str | None:
    """The run's live status stream, or None when the project did not include our URLs."""
    try:
        return reverse("pikku_django:run-stream", args=[run.pk])
    except NoReverseMatch:
        return None


def admin_link(obj: Model, text: Any = None) -> SafeString:
    """A link to ``obj``'s admin change page."""
    opts = obj._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, obj if text is None else text)


# -- what an action did ---------------------------------------------------------------


@dataclass
class ActionReport:
    """What an action did, run by run, told to the user in at most two messages."""

    verb: str  # e.g. "Cancelled"
    done: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    def tell(self, modeladmin: admin.ModelAdmin, request: HttpRequest, infinitive: str) -> None:
        parts = [
            ngettext("%(verb)s %(count)d run", "%(verb)s %(count)d runs", self.done)
            % {"verb": self.verb, "count": self.done}
        ]
        parts += [
            ngettext("%(count)d was %(reason)s", "%(count)d were %(reason)s", n)
            % {"count": n, "reason": reason}
            for reason, n in sorted(self.skipped.items())
        ]
        level = messages.SUCCESS if self.done and not self.skipped else messages.WARNING
        if self.done or self.skipped:
            modeladmin.message_user(request, "; ".join(parts) + ".", level)
        if self.failed:
            n = len(self.failed)
            modeladmin.message_user(
                request,
                ngettext(
                    "%(count)d run could not be %(what)s: %(errors)s",
                    "%(count)d runs could not be %(what)s: %(errors)s",
                    n,
                )
                % {"count": n, "what": infinitive, "errors": "; ".join(self.failed)},
                messages.ERROR,
            )


def status_label(status: str) -> str:
    """The translated name of a run status."""
    return str(RunStatus(status).label) if status in RunStatus.values else status


def cancel_skip_reason(status: str) -> str:
    if status in TERMINAL_RUN_STATUSES:
        return _("already %(status)s") % {"status": status_label(status)}
    return status_label(status)


def not_status_reason(wanted: str) -> Callable[[str], str]:
    """Why a run in another status than ``wanted`` was skipped: "running, not suspended"."""

    def reason(status: str) -> str:
        return _("%(status)s, not %(wanted)s") % {
            "status": status_label(status),
            "wanted": status_label(wanted),
        }

    return reason


def operate(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[WorkflowRun],
    *,
    verb: str,
    infinitive: str,
    allowed: Sequence[str],
    skip_reason: Callable[[str], str],
    call: Callable[[WorkflowEngine, WorkflowRun], Any],
) -> None:
    """Apply ``call`` to each selected run in an ``allowed`` status, and report."""
    engine = get_engine()
    report = ActionReport(verb)
    for run in queryset.order_by("created_at"):
        if run.status not in allowed:
            report.skip(skip_reason(run.status))
            continue
        try:
            call(engine, run)
        except WorkflowRunStateError as exc:
            current = engine.runs().filter(id=run.id).values_list("status", flat=True).first()
            if current in allowed:
                report.failed.append(f"{run.id} ({exc})")  # refused for another reason
            else:
                # It moved on since the list was shown: say where it is now.
                report.skip(skip_reason(current) if current else _("deleted"))
        except Exception as exc:
            logger.exception("Admin action %s failed on workflow run %s", infinitive, run.id)
            report.failed.append(f"{run.id} ({type(exc).__name__}: {exc})")
        else:
            report.done += 1
    report.tell(modeladmin, request, infinitive)


# -- runs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEntry:
    """One step of a run as the run page shows it."""

    step: WorkflowStep
    attempts: list[StepAttempt]
    attempts_label: str
    duration: str
    lease_left: str
    lease_live: bool
    error_type: str
    error_message: str
    input_json: str | None
    result_json: str | None
    error_json: str | None
    error_traceback: str
    child_link: SafeString | None


def build_timeline(run: WorkflowRun, using: str) -> list[TimelineEntry]:
    """The run's steps in the order the workflow reached them, each with its attempts."""
    steps = list(
        WorkflowStep.objects.using(using)
        .filter(run_id=run.pk)
        .select_related("child_run")
        .prefetch_related("attempts")
        .order_by("id")
    )
    now = store_now_ms(using) if any(s.lease_expires_at is not None for s in steps) else None
    entries = []
    for step in steps:
        left = lease_left_ms(step, now)
        entries.append(
            TimelineEntry(
                step=step,
                attempts=sorted(step.attempts.all(), key=lambda a: a.attempt),
                attempts_label=f"{step.attempt}/{step.attempts_allowed}",
                duration=format_duration(step.updated_at - step.created_at),
                lease_left=format_lease_left(left),
                lease_live=left is not None and left > 0,
                error_type=error_part(step.error, "type"),
                error_message=error_part(step.error, "message"),
                input_json=None if step.input is None else pretty_json(step.input),
                result_json=None if step.result is None else pretty_json(step.result),
                error_json=None
                if step.error is None
                else pretty_json(without_traceback(step.error)),
                error_traceback=error_part(step.error, "traceback"),
                child_link=admin_link(step.child_run) if step.child_run is not None else None,
            )
        )
    return entries


class WorkflowDatabaseMixin:
    """Reads from ``PIKKU['WORKFLOW_DATABASE']`` rather than the default database."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(workflow_database())  # type: ignore[misc]


@admin.register(WorkflowRun)
class WorkflowRunAdmin(WorkflowDatabaseMixin, admin.ModelAdmin):
    """Runs, read-only, with their step timeline; steered by the cancel/resume/retry actions."""

    list_display = ("id", "workflow", "status", "created_at", "updated_at", "inline")
    list_filter = (
        "status",
        ("workflow", admin.AllValuesFieldListFilter),
        ("created_at", admin.DateFieldListFilter),
    )
    date_hierarchy = "created_at"
    search_fields = ("id", "idempotency_key")
    actions = ("cancel_runs", "resume_runs", "retry_runs", "delete_selected")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "workflow",
                    "status",
                    "suspend_reason",
                    "idempotency_key",
                    "inline",
                    "parent_runs",
                )
            },
        ),
        (
            gettext_lazy("Timing"),
            {"fields": ("created_at", "updated_at", "wake_at", "wakes")},
        ),
        (
            gettext_lazy("Data"),
            {"fields": ("input_json", "output_json", "error_json")},
        ),
    )
    readonly_fields = (
        "id",
        "workflow",
        "status",
        "suspend_reason",
        "idempotency_key",
        "inline",
        "parent_runs",
        "created_at",
        "updated_at",
        "wake_at",
        "wakes",
        "input_json",
        "output_json",
        "error_json",
    )

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
            str(model._meta.verbose_name_plural): len(found)
            for model, found in collector.model_objs.items()
        }
        perms_needed: set[str] = set()
        if not all(self.has_delete_permission(request, run) for run in objs):
            perms_needed.add(str(self.opts.verbose_name))
        protected = [str(obj) for obj in collector.protected]
        return to_delete, model_count, perms_needed, protected

    # -- actions ----------------------------------------------------------------------

    @admin.action(
        permissions=["operate"],
        description=gettext_lazy(
            "Cancel selected running or suspended runs (needs “Can change workflow run”)"
        ),
    )
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        operate(
            self,
            request,
            queryset,
            verb=_("Cancelled"),
            infinitive=_("cancelled"),
            allowed=(RunStatus.RUNNING, RunStatus.SUSPENDED),
            skip_reason=cancel_skip_reason,
            call=lambda engine, run: engine.cancel(run.id),
        )

    @admin.action(
        permissions=["operate"],
        description=gettext_lazy(
            "Resume selected suspended runs, with no data (needs “Can change workflow run”)"
        ),
    )
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        operate(
            self,
            request,
            queryset,
            verb=_("Resumed"),
            infinitive=_("resumed"),
            allowed=(RunStatus.SUSPENDED,),
            skip_reason=not_status_reason(RunStatus.SUSPENDED),
            call=lambda engine, run: engine.resume(run.id),
        )

    @admin.action(
        permissions=["operate"],
        description=gettext_lazy(
            "Retry selected failed runs from the failed step (needs “Can change workflow run”)"
        ),
    )
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        operate(
            self,
            request,
            queryset,
            verb=_("Retried"),
            infinitive=_("retried"),
            allowed=(RunStatus.FAILED,),
            skip_reason=not_status_reason(RunStatus.FAILED),
            call=lambda engine, run: engine.retry(run.id),
        )

    @admin.action(
        permissions=["delete"],
        description=gettext_lazy("Delete selected finished workflow runs"),
    )
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun]
    ) -> HttpResponseBase | None:
        """Django's delete, refused while a selected run is still running or suspended."""
        live = queryset.exclude(status__in=TERMINAL_RUN_STATUSES).count()
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

    @admin.display(description=gettext_lazy("output"))
    def output_json(self, obj: WorkflowRun) -> SafeString | str:
        return json_block(obj.output)

    @admin.display(description=gettext_lazy("error"))
    def error_json(self, obj: WorkflowRun) -> SafeString | str:
        return error_block(obj.error)

    @admin.display(description=gettext_lazy("parent run"))
    def parent_runs(self, obj: WorkflowRun) -> SafeString | str:
        parents = (
            WorkflowStep.objects.using(workflow_database())
            .filter(child_run_id=obj.pk)
            .select_related("run")
        )
        rows = [(admin_link(step.run), _("step"), step.name) for step in parents]
        if not rows:
            return EMPTY
        return format_html_join(mark_safe("<br>"), "{} ({} {})", rows)

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
            context["pikku_timeline"] = build_timeline(obj, workflow_database())
            context["pikku_stream_url"] = run_stream_url(obj)
        return super().render_change_form(request, context, add, change, form_url, obj)


# -- steps and attempts ---------------------------------------------------------------


class ReadOnlyAdminMixin:
    """Nobody adds, changes or deletes these rows here: the engine owns them."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepAttemptInline(ReadOnlyAdminMixin, WorkflowDatabaseMixin, admin.TabularInline):
    """A step's attempts, oldest first."""

    model = StepAttempt
    extra = 0
    can_delete = False
    fields = ("attempt", "status", "worker", "started_at", "finished_at", "error_type", "message")
    readonly_fields = fields
    ordering = ("attempt",)

    @admin.display(description=gettext_lazy("error type"))
    def error_type(self, obj: StepAttempt) -> str:
        return error_part(obj.error, "type")

    @admin.display(description=gettext_lazy("error message"))
    def message(self, obj: StepAttempt) -> str:
        return error_part(obj.error, "message")


@admin.register(WorkflowStep)
class WorkflowStepAdmin(ReadOnlyAdminMixin, WorkflowDatabaseMixin, admin.ModelAdmin):
    """Steps of every run, read-only: edits would break the engine's fencing."""

    list_display = (
        "name",
        "run_link",
        "kind",
        "status",
        "attempt_label",
        "queue",
        "available_at",
        "lease_left",
    )
    list_filter = ("status", "kind", ("queue", admin.AllValuesFieldListFilter))
    search_fields = ("name", "function", "run__id")
    list_select_related = ("run",)
    inlines = (StepAttemptInline,)
    fields = (
        "run_link",
        "name",
        "kind",
        "function",
        "status",
        "attempt_label",
        "queue",
        "transactional",
        "retry_delay",
        "backoff",
        "available_at",
        "lease_left",
        "child_run_link",
        "created_at",
        "updated_at",
        "input_json",
        "result_json",
        "error_json",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowStep]:
        return super().get_queryset(request).annotate(store_now=EpochMs())

    @admin.display(description=gettext_lazy("run"), ordering="run__created_at")
    def run_link(self, obj: WorkflowStep) -> SafeString:
        return admin_link(obj.run, f"{obj.run.workflow} {obj.run_id}")

    @admin.display(description=gettext_lazy("attempt"), ordering="attempt")
    def attempt_label(self, obj: WorkflowStep) -> str:
        return f"{obj.attempt}/{obj.attempts_allowed}"

    @admin.display(description=gettext_lazy("lease left"), ordering="lease_expires_at")
    def lease_left(self, obj: WorkflowStep) -> str:
        return format_lease_left(lease_left_ms(obj, getattr(obj, "store_now", None)))

    @admin.display(description=gettext_lazy("child run"))
    def child_run_link(self, obj: WorkflowStep) -> SafeString | str:
        return admin_link(obj.child_run) if obj.child_run_id else EMPTY

    @admin.display(description=gettext_lazy("input"))
    def input_json(self, obj: WorkflowStep) -> SafeString | str:
        return json_block(obj.input)

    @admin.display(description=gettext_lazy("result"))
    def result_json(self, obj: WorkflowStep) -> SafeString | str:
        return json_block(obj.result)

    @admin.display(description=gettext_lazy("error"))
    def error_json(self, obj: WorkflowStep) -> SafeString | str:
        return error_block(obj.error)


@admin.register(StepAttempt)
class StepAttemptAdmin(ReadOnlyAdminMixin, WorkflowDatabaseMixin, admin.ModelAdmin):
    """Every attempt of every step, read-only: the history as it happened."""

    list_display = (
        "step_link",
        "attempt",
        "status",
        "worker",
        "started_at",
        "finished_at",
        "error_type",
        "error_message",
    )
    list_display_links = ("attempt",)
    list_filter = ("status",)
    search_fields = ("worker", "step__name", "step__run__id")
    list_select_related = ("step",)
    fields = (
        "step_link",
        "attempt",
        "status",
        "worker",
        "started_at",
        "finished_at",
        "result_json",
        "error_json",
    )
    readonly_fields = fields

    @admin.display(description=gettext_lazy("step"), ordering="step__name")
    def step_link(self, obj: StepAttempt) -> SafeString:
        return admin_link(obj.step, obj.step.name)

    @admin.display(description=gettext_lazy("error type"))
    def error_type(self, obj: StepAttempt) -> str:
        return error_part(obj.error, "type")

    @admin.display(description=gettext_lazy("error message"))
    def error_message(self, obj: StepAttempt) -> str:
        return error_part(obj.error, "message")

    @admin.display(description=gettext_lazy("result"))
    def result_json(self, obj: StepAttempt) -> SafeString | str:
        return json_block(obj.result)

    @admin.display(description=gettext_lazy("error"))
    def error_json(self, obj: StepAttempt) -> SafeString | str:
        return error_block(obj.error)


__all__ = [
    "StepAttemptAdmin",
    "WorkflowRunAdmin",
    "WorkflowStepAdmin",
    "build_timeline",
]
