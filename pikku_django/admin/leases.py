"""A read-only admin list of leases, showing which are live."""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from pikku_django.conf import pikku_settings
from pikku_django.leases.base import now_ms
from pikku_django.models import Lease
from pikku_django.read_database import read_database


class LiveFilter(admin.SimpleListFilter):
    """Filter leases by whether they are live now."""

    title = _("state")
    parameter_name = "live"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("live")), ("no", _("lapsed or released"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Lease]) -> QuerySet[Lease]:
        if self.value() == "yes":
            return queryset.filter(expires_at__gt=now_ms())
        if self.value() == "no":
            return queryset.filter(expires_at__lte=now_ms())
        return queryset


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Leases are written only by the lease service: this screen only shows them.

    Deleting a row would reset its fencing token, so nobody may.
    """

    list_display = ("key", "holder", "token", "live", "expires")
    list_filter = (LiveFilter,)
    search_fields = ("key", "holder")
    readonly_fields = ("key", "holder", "token", "expires_at", "expires")

    @admin.display(boolean=True, description=_("live"))
    def live(self, obj: Lease) -> bool:
        return obj.is_live

    @admin.display(description=_("expires"), ordering="expires_at")
    def expires(self, obj: Lease) -> datetime.datetime | str:
        if obj.expires_at <= 0:
            return str(_("released"))
        return datetime.datetime.fromtimestamp(obj.expires_at / 1000, tz=datetime.UTC).astimezone(
            timezone.get_current_timezone()
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lease]:
        """From the read database when it mirrors the leases' (``LEASE_DATABASE`` is
        ``WORKFLOW_DATABASE``): this screen only shows them."""
        found: QuerySet[Lease] = super().get_queryset(request)
        home = pikku_settings.LEASE_DATABASE
        reading = read_database(home)
        return found if reading == home else found.using(reading)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
