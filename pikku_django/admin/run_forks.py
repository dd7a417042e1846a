"""Re-running a run from one of its steps, from the run's admin page.

Each step of a finished run offers "Re-run from this step", which leads to a
confirmation page saying which steps are kept and which run again (their effects
repeated); the fork is started on its POST, only for users with "Can change
workflow run" (others get 403), and written to the original run's History.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _

from pikku_django.admin._typing import AdminMixin
from pikku_django.admin.formatting import (
    admin_database,
    admin_link,
    status_badge,
    workflow_database,
    workflow_title,
)
from pikku_django.admin.run_page import fork_links
from pikku_django.admin.steering import ConfirmForm
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows.runs.forks import ForkRefusedError, fork_run, preview_fork

logger = logging.getLogger(__name__)


class RunForkMixin(AdminMixin):
    """Adds ``<run>/fork/<step id>/`` to a run admin: confirm, then fork and log."""

    fork_template = "admin/pikku_django/workflowrun/fork_confirm.html"

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        view = self.admin_site.admin_view(self.fork_view)
        name = f"{opts.app_label}_{opts.model_name}_fork"
        return [path("<path:object_id>/fork/<int:step_id>/", view, name=name), *super().get_urls()]

    def has_fork_permission(self, request: HttpRequest) -> bool:
        """Who may fork: those who may cancel, resume and retry runs."""
        return bool(self.has_operate_permission(request))  # type: ignore[attr-defined]

    def fork_context(self, request: HttpRequest, run: WorkflowRun) -> dict[str, Any]:
        """What the run page draws of forks: the per-step action (for this user, on a
        finished run), the run it was forked from and its own forks."""
        links = fork_links(run, admin_database(request))  # only shown: the read database
        return {
            "pikku_can_fork": run.is_terminal and self.has_fork_permission(request),
            "pikku_forked_from": links.forked_from,
            "pikku_forks": links.forks,
            "pikku_kept_steps": links.kept,
        }

    def _change_url(self, run_id: Any) -> str:
        opts = self.opts
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_change",
            args=[run_id],
            current_app=self.admin_site.name,
        )

    def fork_view(self, request: HttpRequest, object_id: str, step_id: int) -> HttpResponse:
        run = self.get_object(request, object_id)
        if run is None:
            raise Http404("No such workflow run")
        if not self.has_fork_permission(request):
            raise PermissionDenied
        using = workflow_database()
        step = WorkflowStep.objects.using(using).filter(run_id=run.pk, pk=step_id).first()
        if step is None:
            raise Http404("No such step of this run")
        back = self._change_url(run.pk)
        try:
            point = preview_fork(run.id, step.name, using=using)
        except ForkRefusedError as exc:
            self.message_user(
                request, _("This run cannot be forked: %(error)s") % {"error": exc}, messages.ERROR
            )
            return HttpResponseRedirect(back)
        form = ConfirmForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            try:
                fork = fork_run(run.id, step.name, using=using)
            except ForkRefusedError as exc:
                self.message_user(
                    request,
                    _("This run cannot be forked: %(error)s") % {"error": exc},
                    messages.ERROR,
                )
                return HttpResponseRedirect(back)
            self.log_change(
                request,
                run,
                _("Forked from the admin at step %(step)s as run %(fork)s")
                % {"step": step.name, "fork": fork.id},
            )
            logger.info("Forked run %s as %s from the admin as %s", run.id, fork.id, request.user)
            self.message_user(
                request,
                format_html(
                    "{} {}",
                    _("Started a new run from step “%(step)s”:") % {"step": step.name},
                    admin_link(fork, format_html("<code>{}</code>", fork.pk)),
                ),
                messages.SUCCESS,
            )
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Re-run this run from step “%(step)s”?") % {"step": step.name},
            "subtitle": None,
            "opts": self.opts,
            "original": run,
            "run_title": workflow_title(run.workflow, run.idempotency_key),
            "status_badge": status_badge(run.status),
            "step": step,
            "kept": point.kept,
            "again": point.again,
            "form": form,
            "back_url": back,
            "media": self.media + form.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.fork_template, context)


__all__ = ["RunForkMixin"]
