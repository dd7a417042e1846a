"""Admin screen for worker heartbeats: read-only, each worker writes its own row."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from pikku_django.admin.formatting import format_duration, format_time, status_badge
from pikku_django.admin.steps import ADMIN_CSS, ReadOnlyAdminMixin, WorkflowDatabaseMixin
from pikku_django.heartbeats import is_alive
from pikku_django.models import WorkerHeartbeat


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdminMixin, WorkflowDatabaseMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """The workers that recorded a heartbeat, most recently seen first."""

    list_display = (
        "worker_id",
        "state",
        "hostname",
        "queue_names",
        "running",
        "concurrency",
        "version",
        "started",
        "seen",
    )
    search_fields = ("worker_id", "hostname")
    list_filter = ("hostname",)

    class Media:
        css = ADMIN_CSS

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # A worker long gone may be removed; a live one writes its row again.
        return admin.ModelAdmin.has_delete_permission(self, request, obj)

    @admin.display(description=gettext_lazy("state"))
    def state(self, obj: WorkerHeartbeat) -> SafeString:
        if obj.stopped_at is not None:
            return status_badge("cancelled", _("stopped"))
        if is_alive(obj):
            return status_badge("completed", _("alive"))
        return status_badge("failed", _("silent"))

    @admin.display(description=gettext_lazy("queues"))
    def queue_names(self, obj: WorkerHeartbeat) -> str:
        return ", ".join(obj.queues or []) or "-"

    @admin.display(description=gettext_lazy("started"), ordering="started_at")
    def started(self, obj: WorkerHeartbeat) -> str:
        return format_time(obj.started_at)

    @admin.display(description=gettext_lazy("last seen"), ordering="seen_at")
    def seen(self, obj: WorkerHeartbeat) -> str:
        ago = format_duration(timezone.now() - obj.seen_at)
        return _("%(time)s (%(ago)s ago)") % {"time": format_time(obj.seen_at), "ago": ago}
