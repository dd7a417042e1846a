"""Keeping the trigger-source table in step with the code and with each provider.

``sync`` records the declared sources; ``enable``/``disable`` switch one source and
register it with (or remove it from) its provider; ``reconcile`` re-checks every
enabled source. Only an enabled source is ever registered.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from pikku_django.models import TriggerSource
from pikku_django.webhooks.credentials import credential_values, set_credential
from pikku_django.webhooks.sources import ProviderContext, WebhookSource, get_source, sources
from pikku_django.workflows.errors import storable_text

logger = logging.getLogger(__name__)

#: The file (next to manage.py) where development registrations are kept.
DEV_REGISTRATIONS_FILE = ".pikku-dev-webhooks.json"


@dataclass(frozen=True)
class Outcome:
    """What one provider step did for one source."""

    source: str
    status: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.source}: {self.status}" + (f" ({self.detail})" if self.detail else "")


class SourceError(Exception):
    """A source cannot be switched as asked (unknown, or no address to register)."""


def provider_url(base_url: str, route: str) -> str:
    """Where the provider must send: base URL without trailing slash + the route."""
    return base_url.rstrip("/") + "/" + route.lstrip("/")


def dev_webhook_url() -> str | None:
    """``PIKKU_DEV_WEBHOOK_URL`` from the environment (development registration)."""
    return os.environ.get("PIKKU_DEV_WEBHOOK_URL") or None


def default_label_prefix() -> str:
    """``dev-<username>`` in development, else empty."""
    if dev_webhook_url():
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        return f"dev-{user}"
    return ""


def sync(declared: list[WebhookSource] | None = None) -> list[TriggerSource]:
    """Upsert the declared sources (keeping a known address) and mark the rest undeclared.

    Never touches ``enabled``.
    """
    declared = sources() if declared is None else declared
    names = {s.name for s in declared}
    with transaction.atomic():
        TriggerSource.objects.exclude(name__in=names).update(declared=False)
        for source in declared:
            row, created = TriggerSource.objects.get_or_create(
                name=source.name, defaults={"kind": "webhook", "declared": True}
            )
            if not created and not row.declared:
                row.declared = True
                row.save(update_fields=["declared", "updated_at"])
    return list(TriggerSource.objects.all())


def sync_after_migrate(**kwargs: Any) -> None:
    """post_migrate: record the declared sources once the table exists."""
    using = kwargs.get("using", "default")
    if using != "default":
        return
    try:
        sync()
    except Exception:  # a migration run must not fail because of a provider source
        logger.exception("Recording the declared webhook sources failed")


def _context(source: WebhookSource, row: TriggerSource) -> ProviderContext:
    label = f"{row.label_prefix}:{source.name}" if row.label_prefix else source.name
    return ProviderContext(
        source=source,
        url=provider_url(row.base_url, source.route or ""),
        label=label,
        events=list(source.events),
        state=row.state,
        secrets=credential_values(source.credential) if source.credential else [],
    )


def _record(row: TriggerSource, status: str, detail: str = "", state: Any = ...) -> Outcome:
    """Record a source's status and detail; the detail may quote a provider's error, so
    a NUL character in it is stored as U+FFFD (see ``storable_text``)."""
    detail = storable_text(detail)
    row.status = status
    row.detail = detail
    fields = ["status", "detail", "updated_at"]
    if state is not ...:
        row.state = state
        fields.append("state")
    row.save(update_fields=fields)
    return Outcome(row.name, status, detail)


def _register(source: WebhookSource, row: TriggerSource) -> Outcome:
    """check, then setup when not ok; record what happened."""
    if not row.base_url:
        return _record(row, "error", "no base URL to register: enable it with a base URL")
    ctx = _context(source, row)
    if source.setup is None and source.check is None:
        return _record(
            row,
            "manual",
            f"register {ctx.url} with the provider by hand, for events "
            f"{', '.join(ctx.events) or '(all)'}",
        )
    dev = _dev_registrations()
    saved = dev.get(source.name) if dev is not None else None
    if saved and saved.get("url") == ctx.url and saved.get("events") == ctx.events:
        if saved.get("secret") and source.credential and saved["secret"] not in ctx.secrets:
            set_credential(source.credential, saved["secret"], validate=False)
        return _record(row, "ok", "registered earlier in development", saved.get("state"))
    try:
        status = source.check(ctx) if source.check is not None else "missing"
    except Exception as exc:
        logger.exception("check of webhook source %s failed", source.name)
        return _record(row, "error", f"check failed: {exc}")
    if status == "ok":
        return _record(row, "ok", "already registered")
    if source.setup is None:
        return _record(row, "manual", f"{status}: register {ctx.url} with the provider by hand")
    try:
        state = source.setup(ctx)
    except Exception as exc:
        logger.exception("setup of webhook source %s failed", source.name)
        return _record(row, "error", f"setup failed: {exc}")
    if ctx.new_secret and source.credential:  # the provider issued it (the check reports it)
        set_credential(source.credential, ctx.new_secret, validate=False)
    if dev is not None:
        dev[source.name] = {
            "url": ctx.url,
            "events": ctx.events,
            "state": state,
            "secret": ctx.new_secret,
            "label": ctx.label,
        }
        _save_dev_registrations(dev)
    return _record(row, "ok", f"registered ({status})", state)


def enable(name: str, base_url: str | None = None, label_prefix: str | None = None) -> Outcome:
    """Switch a source on, then register it at the given or recorded address."""
    source = get_source(name)
    if source is None:
        raise SourceError(f"No webhook source {name!r} is declared")
    sync([*sources()])
    row = TriggerSource.objects.get(name=name)
    base_url = base_url or row.base_url or dev_webhook_url()
    if not base_url:
        raise SourceError(
            f"Source {name!r} has no address to register: pass a base URL (the address "
            "this app is served at) or set PIKKU_DEV_WEBHOOK_URL in development"
        )
    row.base_url = base_url
    if label_prefix is not None:
        row.label_prefix = label_prefix
    elif not row.label_prefix:
        row.label_prefix = default_label_prefix()
    row.enabled = True
    row.save(update_fields=["base_url", "label_prefix", "enabled", "updated_at"])
    return _register(source, row)


def disable(name: str) -> Outcome:
    """Switch a source off first (it stops receiving at once), then tear it down."""
    row = TriggerSource.objects.filter(name=name).first()
    if row is None:
        raise SourceError(f"No webhook source {name!r} is known")
    row.enabled = False
    row.save(update_fields=["enabled", "updated_at"])
    source = get_source(name)
    dev = _dev_registrations()
    # After a database reset, what development registered is known only from its file.
    state = row.state or ((dev or {}).get(name) or {}).get("state")
    if state and (source is None or source.teardown is None):
        why = "no longer declared" if source is None else "it declares no teardown"
        label = f"{row.label_prefix}:{name}" if row.label_prefix else name
        return _record(
            row,
            "disabled",
            f"{why}, so it cannot be torn down: remove {label} "
            f"({json.dumps(state, sort_keys=True)}) from the provider by hand",
            None,
        )
    if source is None or source.teardown is None or not state:
        return _record(row, "disabled", "", None)
    ctx = _context(source, row)
    ctx.state = state
    try:
        source.teardown(ctx)
    except Exception as exc:
        logger.exception("teardown of webhook source %s failed", name)
        return _record(row, "error", f"teardown failed: {exc}", state)
    if dev is not None and name in dev:
        del dev[name]
        _save_dev_registrations(dev)
    return _record(row, "disabled", "removed from the provider", None)


def reconcile(base_url: str | None = None, label_prefix: str | None = None) -> list[Outcome]:
    """Register every enabled source (skipping disabled ones) and record each result."""
    sync()
    outcomes = []
    for row in TriggerSource.objects.filter(enabled=True, declared=True):
        source = get_source(row.name)
        if source is None:
            continue
        changed = []
        if base_url:
            row.base_url = base_url
            changed.append("base_url")
        if label_prefix is not None:
            row.label_prefix = label_prefix
            changed.append("label_prefix")
        if changed:
            row.save(update_fields=[*changed, "updated_at"])
        outcomes.append(_register(source, row))
    return outcomes


def orphans() -> list[str]:
    """Registered sources whose declaration left the code (rows and dev registrations)."""
    names = {s.name for s in sources()}
    found = set(
        TriggerSource.objects.filter(declared=False)
        .filter(state__isnull=False)
        .values_list("name", flat=True)
    )
    dev = _dev_registrations()
    if dev:
        found |= {name for name in dev if name not in names}
    return sorted(found)


# -- development registrations ----------------------------------------------------------


def dev_registrations_path() -> Path:
    base = getattr(settings, "BASE_DIR", None)
    return Path(base or Path.cwd()) / DEV_REGISTRATIONS_FILE


def _dev_registrations() -> dict[str, Any] | None:
    """What development registered (None when not in development mode)."""
    if not dev_webhook_url():
        return None
    path = dev_registrations_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        logger.warning("Ignoring unreadable %s", path)
        return {}
    return data if isinstance(data, dict) else {}


def _save_dev_registrations(data: dict[str, Any]) -> None:
    """Write the file whole, readable by its owner only from the moment it exists (it
    holds signing secrets): a new file made 0600 replaces the old one at once."""
    path = dev_registrations_path()
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:  # mkstemp makes it 0600
            file.write(json.dumps(data, indent=2, sort_keys=True))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
