"""Enable and Disable buttons on a webhook source's admin page, through a confirmation.

Only users with "Can change trigger source" see the buttons; others are refused
(403) whatever they post. Each switch writes an admin ``LogEntry`` (who, what,
the provider step's outcome) that the source's History shows.
"""

from __future__ import annotations

import enum
import logging
from typing import Any
from urllib.parse import urlsplit

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils.translation import gettext as _

from pikku_django.admin._typing import AdminMixin
from pikku_django.models import TriggerSource
from pikku_django.webhooks import lifecycle
from pikku_django.webhooks.lifecycle import SourceError
from pikku_django.webhooks.sources import WebhookSource, get_source

logger = logging.getLogger(__name__)

#: The field of the "which base URL" question (named so it cannot clash with the changelist).
BASE_URL_FIELD = "pikku_base_url"


class Switch(enum.StrEnum):
    """Which way a source is switched."""

    ENABLE = "enable"
    DISABLE = "disable"


def suggested_base_url(request: HttpRequest, source: WebhookSource | None) -> str:
    """This site's address where ``pikku_django.urls`` is mounted, as ``request`` sees it."""
    root = request.build_absolute_uri("/")
    if source is None or not source.route:
        return root
    try:
        path_ = reverse("pikku_django:webhook", kwargs={"route": source.route})
    except NoReverseMatch:
        return root
    if not path_.endswith(source.route):
        return root
    return request.build_absolute_uri(path_[: len(path_) - len(source.route)] or "/")


def valid_base_url(value: str) -> bool:
    """An http(s) URL with a host (an intranet name like ``http://app:8000/`` too)."""
    parts = urlsplit(value)
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and not any(c.isspace() for c in value)
    )


class SourceSwitchMixin(AdminMixin):
    """Adds ``<source>/switch/<enable|disable>/`` to the trigger sources' admin."""

    switch_template = "admin/pikku_django/triggersource/switch_confirm.html"

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        view = self.admin_site.admin_view(self.switch_view)
        name = f"{opts.app_label}_{opts.model_name}_switch"
        return [
            path("<path:object_id>/switch/<str:switch>/", view, name=name),
            *super().get_urls(),
        ]

    def has_switch_permission(self, request: HttpRequest) -> bool:
        """Enable and disable: the model's "change" permission unless overridden."""
        opts = self.opts
        codename = get_permission_codename("change", opts)
        return bool(request.user.has_perm(f"{opts.app_label}.{codename}"))

    def tell(self, request: HttpRequest, verb: str, outcome: Any) -> None:
        """Tell the user what a switch did (one message; admins may say more)."""
        self.message_user(request, f"{verb}: {outcome}")

    def switch_url(self, row: TriggerSource, switch: Switch) -> str:
        opts = self.opts
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_switch", args=[quote(row.pk), switch]
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra = dict(extra_context or {})
        row = TriggerSource.objects.filter(pk=unquote(object_id)).first()
        if row is not None and self.has_switch_permission(request):
            switch = Switch.DISABLE if row.enabled else Switch.ENABLE
            extra["pikku_switch"] = {
                "switch": switch,
                "url": self.switch_url(row, switch),
                "label": _("Disable") if row.enabled else _("Enable"),
            }
        response: HttpResponse = super().change_view(request, object_id, form_url, extra)
        return response

    def switch_view(self, request: HttpRequest, object_id: str, switch: str) -> HttpResponse:
        if switch not in Switch.__members__.values():
            raise Http404(f"No switch {switch!r}")
        row = self.get_object(request, unquote(object_id))
        if row is None:
            raise Http404("No such trigger source")
        if not self.has_switch_permission(request):
            raise PermissionDenied
        opts = self.opts
        back = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(row.pk)])
        source = get_source(row.name)
        enable = switch == Switch.ENABLE
        needs_url = enable and not row.base_url and not lifecycle.dev_webhook_url()
        base_url = request.POST.get(BASE_URL_FIELD, "").strip() if needs_url else ""
        error = ""
        if request.method == "POST":
            if needs_url and not valid_base_url(base_url):
                error = _("%(url)r is not an http(s) URL.") % {"url": base_url}
            else:
                return self._switch(request, row, enable, base_url or None, back)
        context = {
            **self.admin_site.each_context(request),
            "title": (_("Enable %(name)s?") if enable else _("Disable %(name)s?"))
            % {"name": row.name},
            "subtitle": None,
            "opts": opts,
            "original": row,
            "enable": enable,
            "needs_url": needs_url,
            "base_url": base_url or suggested_base_url(request, source),
            "base_url_field": BASE_URL_FIELD,
            "error": error,
            "route": "/" + (source.route or "") if source else "",
            "back_url": back,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.switch_template, context)

    def _switch(
        self,
        request: HttpRequest,
        row: TriggerSource,
        enable: bool,
        base_url: str | None,
        back: str,
    ) -> HttpResponse:
        try:
            if enable:
                outcome = lifecycle.enable(row.name, base_url=base_url)
            else:
                outcome = lifecycle.disable(row.name)
        except SourceError as exc:
            self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
            return HttpResponseRedirect(back)
        verb = _("enabled") if enable else _("disabled")
        self.tell(request, verb, outcome)
        detail = f" ({outcome.detail})" if outcome.detail else ""
        message = _("%(verb)s from the admin; provider step: %(status)s%(detail)s") % {
            "verb": (_("Enabled") if enable else _("Disabled")),
            "status": outcome.status,
            "detail": detail,
        }
        if base_url:
            message += " " + _("(base URL %(url)s)") % {"url": base_url}
        row.refresh_from_db()
        self.log_change(request, row, message)
        logger.info("Source %s %s from the admin by %s", row.name, verb, request.user)
        return HttpResponseRedirect(back)
