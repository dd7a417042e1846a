"""The parts of a run's page that follow its state, drawn by the server alone.

The run page's buttons (Cancel, Resume, Retry), its Delete link, its tree of parent
and child runs and its timeline of steps depend on the run's state and on what the
user may do. The page draws
them from :meth:`RunLivePartsMixin.live_parts_context`, and so does
``<run>/live/``, which run_live.js fetches each time the status stream reports a
change and swaps in: which parts a run in a given state offers is decided here, in
Python, once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.contrib.admin.options import IS_POPUP_VAR
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_GET

from pikku_django.admin.formatting import admin_database
from pikku_django.admin.run_page import family, load_steps, timeline_chart
from pikku_django.admin.steering import RunSteeringMixin
from pikku_django.models import WorkflowRun, WorkflowStep

logger = logging.getLogger(__name__)


class RunLivePartsMixin(RunSteeringMixin):
    """Adds ``<run>/live/``: the run page's state-dependent parts, as HTML to swap in."""

    live_parts_template = "admin/pikku_django/workflowrun/live_parts.html"

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        view = self.admin_site.admin_view(require_GET(self.live_parts_view))
        name = f"{opts.app_label}_{opts.model_name}_live"
        return [path("<path:object_id>/live/", view, name=name), *super().get_urls()]

    def live_parts_url(self, run: WorkflowRun) -> str:
        opts = self.opts
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_live",
            args=[run.pk],
            current_app=self.admin_site.name,
        )

    def live_parts_context(
        self,
        request: HttpRequest,
        run: WorkflowRun,
        steps: Sequence[WorkflowStep] | None = None,
    ) -> dict[str, Any]:
        """What the run page's state-dependent parts are drawn from, for this user
        (``steps``: the run's, as :func:`load_steps` read them, if the page did already)."""
        using = admin_database(request)
        tree = family(run, using)
        if steps is None:
            steps = load_steps(run, using)
        return {
            "opts": self.opts,
            "original": run,
            "pikku_operations": self.offered_operations(request, run),
            "pikku_can_delete": self.has_delete_permission(request, run),
            "pikku_tree": tree.html,
            "pikku_tree_live": tree.live,
            "pikku_chart": timeline_chart(run, steps),
            "pikku_live_parts_url": self.live_parts_url(run),
        }

    def live_parts_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The parts as the run page would draw them now (403 without "view")."""
        run = self.get_object(request, object_id)
        if run is None:
            raise Http404("No such workflow run")
        if not self.has_view_permission(request, run):
            raise PermissionDenied
        context = {
            **self.live_parts_context(request, run),
            "is_popup": IS_POPUP_VAR in request.GET,
            "preserved_filters": self.get_preserved_filters(request),
        }
        request.current_app = self.admin_site.name
        response = TemplateResponse(request, self.live_parts_template, context)
        response["Cache-Control"] = "no-store"
        return response


__all__ = ["RunLivePartsMixin"]
