"""Admin screens for webhook trigger sources, their credentials and accepted events.

- **Trigger sources** are read-only: a source's switch is flipped only by the
  **Enable** and **Disable** actions, which call :func:`lifecycle.enable` and
  :func:`lifecycle.disable` source by source and report what the provider step
  did. They need Django's "Can change trigger source" permission
  (``pikku_django.change_triggersource``); users without it are not offered
  them. The webhook view reads the switch on every request, so it takes effect
  at once. Enabling a source that has no recorded address offers this site's
  own address (where ``pikku_django.urls`` is mounted) before registering.
- **Credential values** are added through a password field and stored encrypted
  (:func:`set_credential`); a stored value is never shown again, only its last
  characters. A value can afterwards only be retired or made active again.
- **Webhook receipts** are a read-only record of accepted events. A receipt a worker
  set aside (its input cannot be read back, or its run could not be created) says
  why, and is the only kind that may be deleted (Django's "Can delete webhook
  receipt" permission): the others stop a redelivery being dispatched twice.
"""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth import get_permission_codename
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from pikku_django.admin.formatting import EMPTY, admin_database, admin_link, json_block
from pikku_django.admin.source_switch import (
    SourceSwitchMixin,
    suggested_base_url,
    valid_base_url,
)
from pikku_django.models import CredentialValue, TriggerSource, WebhookReceipt, WorkflowRun
from pikku_django.models.fields import UnreadableJSON
from pikku_django.models.webhooks import WebhookReceiptQuerySet
from pikku_django.webhooks import lifecycle
from pikku_django.webhooks.credentials import set_credential
from pikku_django.webhooks.lifecycle import Outcome, SourceError
from pikku_django.webhooks.secret_checks import InvalidSecretError, check_secret
from pikku_django.webhooks.sources import get_source, sources

#: The field of the "which base URL" page (named so it cannot clash with the changelist).
BASE_URL_FIELD = "pikku_base_url"

OUTCOME_LEVELS = {"error": messages.ERROR, "manual": messages.WARNING}


# -- trigger sources ------------------------------------------------------------------


@admin.register(TriggerSource)
class TriggerSourceAdmin(SourceSwitchMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Declared sources, their switch and their provider registration; read-only."""

    list_display = ("name", "enabled", "declared", "status", "short_detail", "updated_at")
    list_filter = ("enabled", "declared", "status")
    search_fields = ("name",)
    actions = ("enable_sources", "disable_sources")
    fieldsets = (
        (None, {"fields": ("name", "kind", "enabled", "declared", "status", "detail")}),
        (
            gettext_lazy("Provider registration"),
            {"fields": ("base_url", "label_prefix", "provider_url", "label", "state_json")},
        ),
        (gettext_lazy("Declaration"), {"fields": ("events", "credential", "updated_at")}),
    )
    readonly_fields = (
        "name",
        "kind",
        "enabled",
        "declared",
        "status",
        "detail",
        "base_url",
        "label_prefix",
        "provider_url",
        "label",
        "state_json",
        "events",
        "credential",
        "updated_at",
    )

    # -- who may do what --------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sources are declared in code and recorded by sync

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # fields are never edited; the actions check has_switch_permission

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a row holds the provider ids needed to tear a registration down

    def has_switch_permission(self, request: HttpRequest) -> bool:
        """Enable and disable: Django's "Can change trigger source" permission."""
        codename = get_permission_codename("change", self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    # -- columns and fields -----------------------------------------------------------

    @admin.display(description=gettext_lazy("detail"))
    def short_detail(self, obj: TriggerSource) -> str:
        return Truncator(obj.detail).chars(120) if obj.detail else EMPTY

    @admin.display(description=gettext_lazy("provider URL"))
    def provider_url(self, obj: TriggerSource) -> str:
        source = get_source(obj.name)
        if source is None or not obj.base_url:
            return EMPTY
        return lifecycle.provider_url(obj.base_url, source.route or "")

    @admin.display(description=gettext_lazy("label"))
    def label(self, obj: TriggerSource) -> str:
        return f"{obj.label_prefix}:{obj.name}" if obj.label_prefix else obj.name

    @admin.display(description=gettext_lazy("provider state"))
    def state_json(self, obj: TriggerSource) -> SafeString | str:
        return json_block(obj.state)

    @admin.display(description=gettext_lazy("events"))
    def events(self, obj: TriggerSource) -> str:
        source = get_source(obj.name)
        if source is None:
            return _("(no longer declared)")
        return ", ".join(source.events) or EMPTY

    @admin.display(description=gettext_lazy("credential"))
    def credential(self, obj: TriggerSource) -> str:
        source = get_source(obj.name)
        return (source.credential if source else None) or EMPTY

    # -- actions ----------------------------------------------------------------------

    def tell(self, request: HttpRequest, verb: str, outcome: Outcome) -> None:
        """One message per source: what was switched and what the provider step did."""
        detail = f" ({outcome.detail})" if outcome.detail else ""
        self.message_user(
            request,
            _("%(name)s: %(verb)s; provider step: %(status)s%(detail)s")
            % {"name": outcome.source, "verb": verb, "status": outcome.status, "detail": detail},
            OUTCOME_LEVELS.get(outcome.status, messages.SUCCESS),
        )

    @admin.action(
        permissions=["switch"],
        description=gettext_lazy(
            "Enable selected sources and register them with their provider "
            "(needs “Can change trigger source”)"
        ),
    )
    def enable_sources(
        self, request: HttpRequest, queryset: QuerySet[TriggerSource]
    ) -> TemplateResponse | None:
        base_url = None
        if BASE_URL_FIELD in request.POST:  # sent by the "which base URL" page
            base_url = request.POST[BASE_URL_FIELD].strip()
            if not valid_base_url(base_url):
                self.message_user(
                    request,
                    _("%(url)r is not an http(s) URL: nothing was enabled.") % {"url": base_url},
                    messages.ERROR,
                )
                return self.ask_base_url(request, list(queryset), base_url)
        without_address = []
        for row in queryset:
            try:
                outcome = lifecycle.enable(row.name, base_url=base_url)
            except SourceError as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
                if get_source(row.name) is not None:
                    row.refresh_from_db()
                    if not row.base_url and not lifecycle.dev_webhook_url():
                        without_address.append(row)
                continue
            self.tell(request, _("enabled"), outcome)
        if without_address:
            return self.ask_base_url(request, without_address, None)
        return None

    def ask_base_url(
        self, request: HttpRequest, rows: list[TriggerSource], base_url: str | None
    ) -> TemplateResponse:
        """A page that offers this site's address as the base URL to register at."""
        first = get_source(rows[0].name) if rows else None
        listed = [
            {"pk": row.pk, "name": row.name, "route": "/" + (source.route or "")}
            for row in rows
            if (source := get_source(row.name)) is not None
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": _("Where are these sources served?"),
            "opts": self.opts,
            "sources": listed,
            "base_url": base_url or suggested_base_url(request, first),
            "action": "enable_sources",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/pikku_django/triggersource/enable_base_url.html", context
        )

    @admin.action(
        permissions=["switch"],
        description=gettext_lazy(
            "Disable selected sources and remove them from their provider "
            "(needs “Can change trigger source”)"
        ),
    )
    def disable_sources(self, request: HttpRequest, queryset: QuerySet[TriggerSource]) -> None:
        for row in queryset:
            try:
                outcome = lifecycle.disable(row.name)
            except SourceError as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
                continue
            self.tell(request, _("disabled"), outcome)


# -- credential values ----------------------------------------------------------------


def declared_credentials() -> list[str]:
    return sorted({s.credential for s in sources() if s.credential})


class CredentialAddForm(forms.ModelForm):  # type: ignore[type-arg]
    """A new value for a credential: typed into a password field, stored encrypted."""

    value = forms.CharField(
        label=gettext_lazy("value"),
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text=gettext_lazy("Stored encrypted; only its last characters are shown again."),
    )
    replace = forms.BooleanField(
        label=gettext_lazy("retire the other values"),
        required=False,
        help_text=gettext_lazy(
            "Leave unticked while rotating, so requests signed with an older value still "
            "pass until you retire it."
        ),
    )

    class Meta:
        model = CredentialValue
        fields = ("credential",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = declared_credentials()
        if names:
            self.fields["credential"].help_text = _("Declared by the sources: %(names)s") % {
                "names": ", ".join(names)
            }

    def clean(self) -> dict[str, Any]:
        """Refuse a value a source using the credential cannot verify with."""
        cleaned = super().clean() or {}
        if cleaned.get("credential") and cleaned.get("value"):
            try:
                check_secret(cleaned["credential"], cleaned["value"])
            except InvalidSecretError as exc:
                self.add_error("value", str(exc))
        return cleaned


@admin.register(CredentialValue)
class CredentialValueAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Credential values: added through a password field, then only retired or restored."""

    add_form = CredentialAddForm
    list_display = ("credential", "hint_display", "active", "created_at")
    list_filter = ("active", "credential")
    search_fields = ("credential",)
    actions = ("retire_values",)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = self.add_form
        return super().get_form(request, obj, change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ("credential", "value", "replace")
        return ("credential", "hint_display", "active", "created_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        return ["credential", "hint_display", "created_at"]

    @admin.display(description=gettext_lazy("hint"))
    def hint_display(self, obj: CredentialValue) -> str:
        return f"…{obj.hint}" if obj.hint else _("(too short to hint)")

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=["active"])
            return
        created = set_credential(
            form.cleaned_data["credential"],
            form.cleaned_data["value"],
            replace=form.cleaned_data.get("replace", False),
        )
        obj.pk = created.pk
        obj.ciphertext = created.ciphertext
        obj.hint = created.hint
        obj.active = created.active
        obj.created_at = created.created_at
        obj._state.adding = False
        obj._state.db = created._state.db

    @admin.action(
        permissions=["change"],
        description=gettext_lazy("Retire selected values (requests signed with them fail)"),
    )
    def retire_values(self, request: HttpRequest, queryset: QuerySet[CredentialValue]) -> None:
        count = queryset.filter(active=True).update(active=False)
        self.message_user(
            request,
            ngettext("Retired %(count)d value.", "Retired %(count)d values.", count)
            % {"count": count},
            messages.SUCCESS,
        )


# -- webhook receipts -----------------------------------------------------------------


class ReceiptStateFilter(admin.SimpleListFilter):
    """Receipts by where their event stands: waiting, started or set aside."""

    title = gettext_lazy("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("waiting", gettext_lazy("waiting for a worker")),
            ("started", gettext_lazy("run started")),
            ("set_aside", gettext_lazy("set aside")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        receipts = cast(WebhookReceiptQuerySet, queryset)
        if self.value() == "waiting":
            return receipts.waiting()
        if self.value() == "started":
            return queryset.filter(run__isnull=False)
        if self.value() == "set_aside":
            return receipts.set_aside()
        return queryset


@admin.register(WebhookReceipt)
class WebhookReceiptAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Accepted events, once each per (source, event, provider id); read-only, and only
    those set aside may be deleted."""

    list_display = ("source", "event", "provider_id", "received_at", "run_link")
    list_filter = (ReceiptStateFilter, "source", "event")
    search_fields = ("provider_id", "source", "event")
    date_hierarchy = "received_at"
    list_select_related = ("run",)
    fields = ("source", "event", "provider_id", "received_at", "run_link", "set_aside", "data_json")
    readonly_fields = fields
    actions = ("delete_set_aside",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookReceipt]:
        return super().get_queryset(request).using(admin_database(request))  # with the runs

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A receipt is what stops a redelivery being dispatched twice; one set aside
        # waits for nothing, and may go.
        if obj is None or not obj.set_aside:
            return False
        return super().has_delete_permission(request, obj)

    def has_delete_set_aside_permission(self, request: HttpRequest) -> bool:
        """The action: Django's "Can delete webhook receipt" permission."""
        return super().has_delete_permission(request)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions show (``action_location``); 5.2 does not.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)  # type: ignore[call-arg]
        actions.pop("delete_selected", None)  # receipts go only through delete_set_aside
        return actions

    @admin.action(
        permissions=["delete_set_aside"],
        description=gettext_lazy("Delete the selected receipts that were set aside"),
    )
    def delete_set_aside(self, request: HttpRequest, queryset: WebhookReceiptQuerySet) -> None:
        count, _deleted = queryset.set_aside().delete()
        self.message_user(
            request,
            ngettext(
                "Deleted %(count)d receipt set aside.",
                "Deleted %(count)d receipts set aside.",
                count,
            )
            % {"count": count},
            messages.SUCCESS,
        )

    @admin.display(description=gettext_lazy("dispatch run"), ordering="run")
    def run_link(self, obj: WebhookReceipt) -> SafeString | str:
        if obj.run_id is None:
            if obj.set_aside:
                return _("set aside: %(reason)s") % {"reason": Truncator(obj.set_aside).chars(120)}
            return _("waiting for a worker") if obj.input is not None else EMPTY
        run = _run_of(obj)
        if run is None:
            return format_html("{} ({})", obj.run_id, _("pruned"))
        return admin_link(run, format_html("{} ({})", obj.run_id, run.status))

    @admin.display(description=gettext_lazy("data"))
    def data_json(self, obj: WebhookReceipt) -> SafeString | str:
        """The event's data: in the receipt until its run starts, then in the run."""
        if isinstance(obj.input, UnreadableJSON):
            return format_html(
                '<p>{}</p><pre class="pikku-json">{}</pre>',
                _("Python cannot read this input back (%(reason)s); its stored text:")
                % {"reason": obj.input.reason},
                Truncator(obj.input.text).chars(RAW_TEXT_SHOWN),
            )
        if obj.input is not None:
            event = obj.input
        else:
            run = _run_of(obj)
            if run is None:
                return EMPTY
            event = run.input
        if not isinstance(event, dict):
            return EMPTY
        if "handler" in event:  # a function handler's run wraps the event
            event = event.get("event")
        return json_block(event.get("data") if isinstance(event, dict) else None)


#: How much of an unreadable input's stored text the receipt page shows.
RAW_TEXT_SHOWN = 20_000


def _run_of(receipt: WebhookReceipt) -> WorkflowRun | None:
    """The receipt's run, or None when it has none or it was pruned since."""
    if receipt.run_id is None:
        return None
    try:
        return receipt.run
    except WorkflowRun.DoesNotExist:
        return None
