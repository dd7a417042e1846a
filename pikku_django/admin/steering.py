"""Steering one run from its admin page: Cancel, Resume (with data) and Retry.

Each button leads to a confirmation page; the operation runs on its POST, only
for users with "Can change workflow run" (others get 403, whatever they send),
and writes an admin ``LogEntry`` (who, what, the data) that the run's History
shows. The list's bulk actions write the same entries.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from pikku_django.admin._typing import AdminMixin
from pikku_django.admin.formatting import status_badge, workflow_title
from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.workflows import cancel_workflow, resume_workflow, retry_workflow
from pikku_django.workflows.errors import WorkflowError

logger = logging.getLogger(__name__)


class Operation(enum.StrEnum):
    """What an operator can do to a run."""

    CANCEL = "cancel"
    RESUME = "resume"
    RETRY = "retry"


@dataclass(frozen=True)
class RunOperation:
    """One operation: which runs it applies to, what it calls, and how it is told."""

    operation: Operation
    button: Any  # the button's text
    done: Any  # "Cancelled", as in "Cancelled 2 runs"
    past: Any  # "cancelled", as in "could not be cancelled"
    allowed: tuple[str, ...]
    call: Callable[[WorkflowRun, Any], WorkflowRun]
    takes_data: bool = False

    def applies_to(self, run: WorkflowRun) -> bool:
        return run.status in self.allowed

    def log_message(self, data: Any = None) -> str:
        """The text of the admin log entry for this operation."""
        if self.takes_data:
            return _("%(done)s from the admin with data: %(data)s") % {
                "done": self.done,
                "data": json.dumps(data, sort_keys=True, ensure_ascii=False),
            }
        return _("%(done)s from the admin") % {"done": self.done}


OPERATIONS: dict[str, RunOperation] = {
    op.operation: op
    for op in (
        RunOperation(
            Operation.CANCEL,
            gettext_lazy("Cancel"),
            gettext_lazy("Cancelled"),
            gettext_lazy("cancelled"),
            (RunStatus.RUNNING, RunStatus.SUSPENDED),
            lambda run, data: cancel_workflow(run.id),
        ),
        RunOperation(
            Operation.RESUME,
            gettext_lazy("Resume"),
            gettext_lazy("Resumed"),
            gettext_lazy("resumed"),
            (RunStatus.SUSPENDED,),
            lambda run, data: resume_workflow(run.id, data),
            takes_data=True,
        ),
        RunOperation(
            Operation.RETRY,
            gettext_lazy("Retry"),
            gettext_lazy("Retried"),
            gettext_lazy("retried"),
            (RunStatus.FAILED,),
            lambda run, data: retry_workflow(run.id),
        ),
    )
}


class ConfirmForm(forms.Form):
    """Cancel and retry ask for nothing but the confirmation."""


class ResumeForm(forms.Form):
    """Resume hands the suspended run a JSON value (empty: ``null``)."""

    # A field named ``data``: the form's metaclass moves it into ``base_fields``, so
    # it never shadows the bound data, ``BaseForm.data`` (which the stubs see).
    data = forms.JSONField(  # type: ignore[assignment]
        label=gettext_lazy("Data"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 60, "spellcheck": "false"}),
        help_text=gettext_lazy(
            'JSON that the run\'s ctx.suspend() returns, e.g. {"approved": true}. '
            "Leave empty for null."
        ),
    )


def log_operation(
    modeladmin: admin.ModelAdmin[Any], request: HttpRequest, run: WorkflowRun, message: str
) -> None:
    """Record in the admin log (the run's History) who did what to ``run``."""
    modeladmin.log_change(request, run, message)


class RunSteeringMixin(AdminMixin):
    """Adds ``<run>/steer/<operation>/`` to a run admin: confirm, then operate and log."""

    steer_template = "admin/pikku_django/workflowrun/steer_confirm.html"

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        view = self.admin_site.admin_view(self.steer_view)
        name = f"{opts.app_label}_{opts.model_name}_steer"
        return [
            path("<path:object_id>/steer/<str:operation>/", view, name=name),
            *super().get_urls(),
        ]

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Cancel, resume and retry: the model's "change" permission unless overridden."""
        opts = self.opts
        codename = get_permission_codename("change", opts)
        return bool(request.user.has_perm(f"{opts.app_label}.{codename}"))

    def steer_url(self, run: WorkflowRun, operation: str) -> str:
        opts = self.opts
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_steer",
            args=[run.pk, operation],
            current_app=self.admin_site.name,
        )

    def offered_operations(
        self, request: HttpRequest, run: WorkflowRun
    ) -> Sequence[tuple[RunOperation, str]]:
        """The operations the run page shows as buttons to this user, with their URLs."""
        if not self.has_operate_permission(request):
            return []
        return [
            (op, self.steer_url(run, name)) for name, op in OPERATIONS.items() if op.applies_to(run)
        ]

    def steer_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        op = OPERATIONS.get(operation)
        if op is None:
            raise Http404(f"No run operation {operation!r}")
        run = self.get_object(request, object_id)
        if run is None:
            raise Http404("No such workflow run")
        if not self.has_operate_permission(request):
            raise PermissionDenied
        opts = self.opts
        back = reverse(
            f"admin:{opts.app_label}_{opts.model_name}_change",
            args=[run.pk],
            current_app=self.admin_site.name,
        )
        if not op.applies_to(run):
            self.message_user(
                request,
                _("This run is %(status)s: it cannot be %(past)s.")
                % {"status": run.get_status_display(), "past": op.past},
                messages.ERROR,
            )
            return HttpResponseRedirect(back)
        form_class = ResumeForm if op.takes_data else ConfirmForm
        form = form_class(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data.get("data")
            try:
                op.call(run, data)
            except WorkflowError as exc:
                self.message_user(
                    request,
                    _("The run could not be %(past)s: %(error)s") % {"past": op.past, "error": exc},
                    messages.ERROR,
                )
                return HttpResponseRedirect(back)
            log_operation(self, request, run, op.log_message(data))
            logger.info(
                "%s run %s (%s) from the admin as %s", op.done, run.id, run.workflow, request.user
            )
            self.message_user(
                request,
                _("%(done)s run %(run)s.") % {"done": op.done, "run": run.id},
                messages.SUCCESS,
            )
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "title": _("%(button)s this run?") % {"button": op.button},
            "subtitle": None,
            "opts": opts,
            "original": run,
            "run_title": workflow_title(run.workflow, run.idempotency_key),
            "status_badge": status_badge(run.status),
            "operation": op,
            "form": form,
            "back_url": back,
            "media": self.media + form.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.steer_template, context)
