"""Pause and Resume on the queues page: each button leads to a confirmation page, and
the change is made on its POST (CSRF-checked, as every admin view), only for users
with the runs' "change" permission (:meth:`QueuePausesMixin.has_pause_permission`).
Each change is logged with the user's name, which the pause records."""

from __future__ import annotations

import logging

from django import forms
from django.contrib import messages
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from pikku_django.admin._typing import AdminMixin
from pikku_django.admin.formatting import workflow_database
from pikku_django.models import QueuePause
from pikku_django.workflows.control.pauses import (
    QUEUE_NAME_MAX,
    PauseChange,
    pause_queue,
    resume_queue,
)

logger = logging.getLogger(__name__)


class PauseForm(forms.Form):
    """The queue to pause, and why."""

    queue = forms.CharField(max_length=QUEUE_NAME_MAX, widget=forms.HiddenInput)
    reason = forms.CharField(
        label=gettext_lazy("Reason"),
        required=False,
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text=gettext_lazy("Shown with the pause on the queues page and the dashboard."),
    )


class ResumeForm(forms.Form):
    """The queue to resume."""

    queue = forms.CharField(max_length=QUEUE_NAME_MAX, widget=forms.HiddenInput)


class QueuePausesMixin(AdminMixin):
    """Adds ``queues/pause/`` and ``queues/resume/`` (``?queue=NAME``) to the runs' admin."""

    queue_pause_template = "admin/pikku_django/queue_pause_confirm.html"

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        name = f"{opts.app_label}_{opts.model_name}_queues"
        pause = self.admin_site.admin_view(self.queue_pause_view)
        resume = self.admin_site.admin_view(self.queue_resume_view)
        return [
            path("queues/pause/", pause, name=f"{name}_pause"),
            path("queues/resume/", resume, name=f"{name}_resume"),
            *super().get_urls(),
        ]

    def has_pause_permission(self, request: HttpRequest) -> bool:
        """Pause and resume queues: the runs' "change" permission unless overridden."""
        opts = self.opts
        codename = get_permission_codename("change", opts)
        return bool(request.user.has_perm(f"{opts.app_label}.{codename}"))

    def _queues_url(self) -> str:
        opts = self.opts
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_queues", current_app=self.admin_site.name
        )

    def queue_pause_view(self, request: HttpRequest) -> HttpResponse:
        return self._confirm(request, pausing=True)

    def queue_resume_view(self, request: HttpRequest) -> HttpResponse:
        return self._confirm(request, pausing=False)

    def _confirm(self, request: HttpRequest, *, pausing: bool) -> HttpResponse:
        if not self.has_pause_permission(request):
            raise PermissionDenied
        back = self._queues_url()
        form_class = PauseForm if pausing else ResumeForm
        if request.method == "POST":
            form: forms.Form = form_class(request.POST)
        else:
            form = form_class(initial={"queue": request.GET.get("queue", "")})
        if request.method == "POST" and form.is_valid():
            queue = form.cleaned_data["queue"]
            using = workflow_database()
            if pausing:
                result = pause_queue(
                    queue,
                    reason=form.cleaned_data["reason"],
                    paused_by=request.user.get_username(),
                    using=using,
                )
            else:
                result = resume_queue(queue, using=using)
            logger.info("Queue %r %s from the admin by %s", queue, result.change, request.user)
            level = messages.SUCCESS
            if result.change in (PauseChange.ALREADY_PAUSED, PauseChange.NOT_PAUSED):
                level = messages.WARNING
            self.message_user(
                request,
                _("Queue %(queue)s: %(change)s.") % {"queue": queue, "change": result.change},
                level,
            )
            return HttpResponseRedirect(back)
        queue = str(form["queue"].value() or "")
        pause = None
        if not pausing:
            pause = QueuePause.objects.using(workflow_database()).filter(queue=queue).first()
        title = _("Pause queue %(queue)s?") if pausing else _("Resume queue %(queue)s?")
        context = {
            **self.admin_site.each_context(request),
            "title": title % {"queue": queue},
            "subtitle": None,
            "opts": self.opts,
            "queue": queue,
            "pausing": pausing,
            "pause": pause,
            "form": form,
            "back_url": back,
            "media": self.media + form.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.queue_pause_template, context)
