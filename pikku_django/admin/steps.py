"""Admin screens for workflow steps and step attempts: read-only, the engine owns them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy

from pikku_django.admin.formatting import (
    EMPTY,
    admin_database,
    admin_link,
    error_block,
    error_part,
    format_duration,
    format_time,
    json_block,
    status_badge,
    workflow_title,
)
from pikku_django.admin.run_page import format_lease_left, lease_left_ms
from pikku_django.dbclock import EpochMs
from pikku_django.models import StepAttempt, WorkflowStep

ADMIN_CSS = {"all": ("pikku_django/admin.css",)}


class WorkflowDatabaseMixin:
    """Reads from ``PIKKU['WORKFLOW_DATABASE']`` rather than the default database, and a
    page only shown from ``PIKKU['READ_DATABASE']`` when one is set (:func:`admin_database`):
    what an action or a posted form changes is read from the workflow database."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        found: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        return found.using(admin_database(request))


class RelatedValuesFilter(admin.AllValuesFieldListFilter):
    """Every value of a related model's field, read where the admin reads (Django's own
    filter reads a related model through the default database)."""

    def __init__(
        self,
        field: Any,
        request: HttpRequest,
        params: dict[str, Any],
        model: Any,
        model_admin: Any,
        field_path: str,
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        self.lookup_choices = self.lookup_choices.using(admin_database(request))


class ReadOnlyAdminMixin:
    """Nobody adds, changes or deletes these rows here: the engine owns them."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptColumnsMixin:
    """The columns an attempt is shown with, in a list and inline."""

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, obj: StepAttempt) -> SafeString:
        return status_badge(obj.status, obj.get_status_display())

    @admin.display(description=gettext_lazy("started"), ordering="started_at")
    def started(self, obj: StepAttempt) -> str:
        return format_time(obj.started_at)

    @admin.display(description=gettext_lazy("finished"), ordering="finished_at")
    def finished(self, obj: StepAttempt) -> str:
        return format_time(obj.finished_at)

    @admin.display(description=gettext_lazy("duration"))
    def duration(self, obj: StepAttempt) -> str:
        if obj.finished_at is None:
            return EMPTY
        return format_duration(obj.finished_at - obj.started_at)

    @admin.display(description=gettext_lazy("error type"))
    def error_type(self, obj: StepAttempt) -> str:
        return error_part(obj.error, "type")

    @admin.display(description=gettext_lazy("error message"))
    def error_message(self, obj: StepAttempt) -> str:
        return error_part(obj.error, "message")


class StepAttemptInline(
    AttemptColumnsMixin,
    ReadOnlyAdminMixin,
    WorkflowDatabaseMixin,
    admin.TabularInline,  # type: ignore[type-arg]
):
    """A step's attempts, oldest first."""

    model = StepAttempt
    extra = 0
    can_delete = False
    fields = (
        "attempt",
        "status_badge",
        "worker",
        "started",
        "finished",
        "duration",
        "error_type",
        "error_message",
    )
    readonly_fields = fields
    ordering = ("attempt",)


@admin.register(WorkflowStep)
class WorkflowStepAdmin(ReadOnlyAdminMixin, WorkflowDatabaseMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Steps of every run, read-only: edits would break the engine's fencing."""

    list_display = (
        "name",
        "run_link",
        "kind",
        "status_badge",
        "attempt_label",
        "queue",
        "available",
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
        "status_badge",
        "attempt_label",
        "queue",
        "transactional",
        "retry_delay",
        "backoff",
        "timeout",
        "available",
        "lease_left",
        "child_run_link",
        "created",
        "updated",
        "input_json",
        "result_json",
        "error_json",
    )
    readonly_fields = fields

    class Media:
        css = ADMIN_CSS

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowStep]:
        found: QuerySet[WorkflowStep] = super().get_queryset(request)
        return found.annotate(store_now=EpochMs())

    @admin.display(description=gettext_lazy("run"), ordering="run__created_at")
    def run_link(self, obj: WorkflowStep) -> SafeString:
        title = workflow_title(obj.run.workflow, obj.run.idempotency_key)
        return admin_link(obj.run, f"{title} {obj.run_id}")

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, obj: WorkflowStep) -> SafeString:
        return status_badge(obj.status, obj.get_status_display())

    @admin.display(description=gettext_lazy("attempt"), ordering="attempt")
    def attempt_label(self, obj: WorkflowStep) -> str:
        return f"{obj.attempt}/{obj.attempts_allowed}"

    @admin.display(description=gettext_lazy("available at"), ordering="available_at")
    def available(self, obj: WorkflowStep) -> str:
        return format_time(obj.available_at)

    @admin.display(description=gettext_lazy("created"), ordering="created_at")
    def created(self, obj: WorkflowStep) -> str:
        return format_time(obj.created_at)

    @admin.display(description=gettext_lazy("updated"), ordering="updated_at")
    def updated(self, obj: WorkflowStep) -> str:
        return format_time(obj.updated_at)

    @admin.display(description=gettext_lazy("lease left"), ordering="lease_expires_at")
    def lease_left(self, obj: WorkflowStep) -> str:
        return format_lease_left(lease_left_ms(obj, getattr(obj, "store_now", None)))

    @admin.display(description=gettext_lazy("child run"))
    def child_run_link(self, obj: WorkflowStep) -> SafeString | str:
        return admin_link(obj.child_run) if obj.child_run is not None else EMPTY

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
class StepAttemptAdmin(
    AttemptColumnsMixin,
    ReadOnlyAdminMixin,
    WorkflowDatabaseMixin,
    admin.ModelAdmin,  # type: ignore[type-arg]
):
    """Every attempt of every step, read-only: the history as it happened."""

    list_display = (
        "step_link",
        "attempt",
        "run_link",
        "workflow",
        "status_badge",
        "worker",
        "started",
        "finished",
        "duration",
        "error_type",
        "error_message",
    )
    list_display_links = ("attempt",)
    list_filter = ("status", ("step__run__workflow", RelatedValuesFilter))
    search_fields = ("worker", "step__name", "step__run__id")
    list_select_related = ("step", "step__run")
    fields = (
        "step_link",
        "run_link",
        "workflow",
        "attempt",
        "status_badge",
        "worker",
        "started",
        "finished",
        "duration",
        "result_json",
        "error_json",
    )
    readonly_fields = fields

    class Media:
        css = ADMIN_CSS

    @admin.display(description=gettext_lazy("step"), ordering="step__name")
    def step_link(self, obj: StepAttempt) -> SafeString:
        return admin_link(obj.step, obj.step.name)

    @admin.display(description=gettext_lazy("run"), ordering="step__run__created_at")
    def run_link(self, obj: StepAttempt) -> SafeString:
        return admin_link(obj.step.run, str(obj.step.run_id)[:8])

    @admin.display(description=gettext_lazy("workflow"), ordering="step__run__workflow")
    def workflow(self, obj: StepAttempt) -> str:
        run = obj.step.run
        return workflow_title(run.workflow, run.idempotency_key)

    @admin.display(description=gettext_lazy("result"))
    def result_json(self, obj: StepAttempt) -> SafeString | str:
        return json_block(obj.result)

    @admin.display(description=gettext_lazy("error"))
    def error_json(self, obj: StepAttempt) -> SafeString | str:
        return error_block(obj.error)
