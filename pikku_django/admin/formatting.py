"""How the admin screens show values: JSON, errors, times, durations, statuses and links."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Model
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from pikku_django.models import RunStatus, StepStatus
from pikku_django.read_database import read_database
from pikku_django.workflows.api import get_engine

EMPTY = "-"

#: Every status a badge is drawn for (runs' and steps').
BADGE_STATUSES = tuple(dict.fromkeys([*RunStatus.values, *StepStatus.values]))

#: The workflow that runs a webhook handler, and the key prefix of its runs.
WEBHOOK_DISPATCH = "pikku.webhooks.dispatch"
WEBHOOK_KEY_PREFIX = "webhook:"


def workflow_database() -> str:
    """The alias that holds runs, steps and attempts."""
    return get_engine().using


#: The requests that only read: an admin page shown to a person.
READING_METHODS = ("GET", "HEAD")


def admin_database(request: HttpRequest) -> str:
    """Where an admin request reads runs, steps and attempts: ``PIKKU["READ_DATABASE"]``
    (if set) for a page that is only shown, the workflow database for a request that may
    act (an action, a steering button, a form posted)."""
    primary = workflow_database()
    return read_database(primary) if request.method in READING_METHODS else primary


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON text (escaped when rendered)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def json_block(value: Any) -> SafeString | str:
    """``value`` as escaped, indented JSON in a ``<pre>``; a dash when empty."""
    if value is None:
        return EMPTY
    return format_html('<pre class="pikku-json">{}</pre>', pretty_json(value))


def without_traceback(error: Any) -> Any:
    """A stored error without its (multi-line) traceback, which is shown as text."""
    if isinstance(error, dict):
        return {k: v for k, v in error.items() if k != "traceback"}
    return error


def error_block(error: Any) -> SafeString | str:
    """A stored error: its fields as JSON, then its traceback as text (both escaped)."""
    if not error:
        return EMPTY
    if not isinstance(error, dict):
        return json_block(error)
    fields = without_traceback(error)
    traceback = error.get("traceback")
    if not traceback:
        return json_block(fields)
    return format_html(
        '<pre class="pikku-json">{}</pre><pre class="pikku-traceback">{}</pre>',
        pretty_json(fields),
        str(traceback),
    )


def error_part(error: Any, key: str) -> str:
    """One field (``type`` or ``message``) of a stored error, or empty."""
    if isinstance(error, dict):
        return str(error.get(key) or "")
    return ""


def format_duration(delta: timedelta | None) -> str:
    """A short human duration: ``850 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 1 min``."""
    if delta is None:
        return EMPTY
    ms = max(0, round(delta.total_seconds() * 1000))
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def format_time(value: datetime | None) -> str:
    """A moment to the second in the current time zone: ``2026-12-01 17:04:09``."""
    if value is None:
        return EMPTY
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def status_badge(status: str, label: Any = None, *, element_id: str = "") -> SafeString:
    """A status as a coloured badge with its name as text."""
    css = "".join(ch for ch in str(status) if ch.isalnum() or ch in "-_")
    text = label if label is not None else status_label(status)
    if element_id:
        return format_html(
            '<span id="{}" class="pikku-badge pikku-badge-{}" data-status="{}">{}</span>',
            element_id,
            css,
            status,
            text,
        )
    return format_html(
        '<span class="pikku-badge pikku-badge-{}" data-status="{}">{}</span>', css, status, text
    )


def clipped(text: Any, *, sub: bool = False) -> SafeString:
    """``text`` on one line, cut with an ellipsis to its cell's width; whole in its tooltip.

    ``sub``: a second, quieter line of the cell."""
    css = "pikku-clip pikku-sub" if sub else "pikku-clip"
    return format_html('<span class="{}" title="{}">{}</span>', css, text, text)


def status_label(status: str) -> str:
    """The translated name of a run or step status."""
    if status in RunStatus.values:
        return str(RunStatus(status).label)
    if status in StepStatus.values:
        return str(StepStatus(status).label)
    return status


def admin_link(obj: Model, text: Any = None) -> SafeString:
    """A link to ``obj``'s admin change page."""
    opts = obj._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, obj if text is None else text)


def workflow_title(workflow: str, idempotency_key: str | None) -> str:
    """What a run is called: a webhook handler's run after its source and event."""
    if workflow == WEBHOOK_DISPATCH and (idempotency_key or "").startswith(WEBHOOK_KEY_PREFIX):
        parts = str(idempotency_key)[len(WEBHOOK_KEY_PREFIX) :].split(":", 2)
        if len(parts) == 3:
            return _("webhook %(source)s: %(event)s") % {"source": parts[0], "event": parts[1]}
    return workflow
