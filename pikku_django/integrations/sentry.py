"""Step failures reported to Sentry (``pip install 'pikku-django[sentry]'``,
``PIKKU["SENTRY"] = True``, and ``sentry_sdk.init()`` as Sentry's Django guide says).

A step's final failure (no attempt left) is captured once, with the exception it raised
and its traceback; with ``PIKKU["SENTRY_EACH_ATTEMPT"]`` every failed attempt is, those
that will be retried at level ``warning``. Each event carries:

- the tags ``pikku.workflow``, ``pikku.run_id``, ``pikku.step``, ``pikku.attempt`` and
  ``pikku.queue``;
- the context ``pikku_run``: those values, the worker, the attempt's duration, whether
  it will be retried, and ``admin_url``, the run's admin page (absolute when
  ``PIKKU["ADMIN_BASE_URL"]`` names the site);
- a breadcrumb for each attempt of the step so far, from the database (so attempts
  made by other workers are there too), and none of the thread's earlier work.

It listens to :data:`pikku_django.signals.step_attempt_failed`, which is sent only once
the failure is stored under the attempt's own lease: an attempt that lost its lease to
a later one (superseded) is never reported.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

try:
    import sentry_sdk
except ImportError as exc:  # pragma: no cover - said to the user at import
    raise ImportError(
        "pikku_django.integrations.sentry needs sentry-sdk: pip install 'pikku-django[sentry]'"
    ) from exc

from pikku_django import signals
from pikku_django.conf import pikku_settings

logger = logging.getLogger(__name__)

#: The most attempts one event lists as breadcrumbs (the latest ones).
MAX_BREADCRUMBS = 50
_UID = "pikku_django.integrations.sentry"
_lock = threading.Lock()


def admin_url(run_id: Any) -> str | None:
    """The run's admin change page (absolute with ``ADMIN_BASE_URL``); None without the
    admin site."""
    from django.urls import NoReverseMatch, reverse

    try:
        path = reverse("admin:pikku_django_workflowrun_change", args=[run_id])
    except NoReverseMatch:
        return None
    base = pikku_settings.ADMIN_BASE_URL
    return f"{str(base).rstrip('/')}{path}" if base else path


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def attempt_breadcrumbs(using: str, run_id: Any, step: str) -> list[dict[str, Any]]:
    """A breadcrumb for each stored attempt of the run's step, oldest first."""
    from pikku_django.models import StepAttempt

    rows = list(
        StepAttempt.objects.using(using)
        .of_step_named(run_id, step)
        .order_by("-attempt")
        .values("attempt", "status", "worker", "started_at", "finished_at", "error")[
            :MAX_BREADCRUMBS
        ]
    )
    crumbs = []
    for row in reversed(rows):
        error = row["error"] if isinstance(row["error"], dict) else {}
        what = f"attempt {row['attempt']} {row['status']}"
        if error:
            what += f": {error.get('type', 'Exception')}: {error.get('message', '')}".rstrip(": ")
        crumbs.append(
            {
                "category": "pikku.step",
                "type": "default",
                "level": "error" if error else "info",
                "message": what,
                "timestamp": row["started_at"],
                "data": {
                    "attempt": row["attempt"],
                    "status": row["status"],
                    "worker": row["worker"],
                    "started_at": _iso(row["started_at"]),
                    "finished_at": _iso(row["finished_at"]),
                },
            }
        )
    return crumbs


def on_step_attempt_failed(
    sender: Any, *, run_id: Any, workflow: str, step: str, attempt: int, **kw: Any
) -> None:
    """Report a final failure (or, with ``SENTRY_EACH_ATTEMPT``, any failed attempt)."""
    will_retry = bool(kw.get("will_retry"))
    if will_retry and not pikku_settings.SENTRY_EACH_ATTEMPT:
        return
    if not sentry_sdk.get_client().is_active():
        return
    using = str(getattr(sender, "using", None) or pikku_settings.WORKFLOW_DATABASE)
    queue = str(kw.get("queue") or "")
    tags = {
        "pikku.workflow": workflow,
        "pikku.run_id": str(run_id),
        "pikku.step": step,
        "pikku.attempt": str(attempt),
        "pikku.queue": queue,
    }
    try:
        crumbs = attempt_breadcrumbs(using, run_id, step)
    except Exception:
        logger.warning("Could not read the attempts of step %s for Sentry", step, exc_info=True)
        crumbs = []
    with sentry_sdk.isolation_scope() as scope:
        scope.clear_breadcrumbs()
        for crumb in crumbs:
            scope.add_breadcrumb(crumb)
        scope.set_tags(tags)
        scope.set_context(
            "pikku_run",
            {
                "run_id": str(run_id),
                "workflow": workflow,
                "step": step,
                "attempt": attempt,
                "queue": queue,
                "worker": kw.get("worker"),
                "duration": kw.get("duration"),
                "will_retry": will_retry,
                "admin_url": admin_url(run_id),
            },
        )
        scope.set_transaction_name(f"{workflow} / {step}")
        scope.set_level("warning" if will_retry else "error")
        exception = kw.get("exception")
        if isinstance(exception, BaseException):
            sentry_sdk.capture_exception(exception)
        else:  # a sender that gave the error's type and message alone
            message = f"{kw.get('error_type') or 'Exception'}: {kw.get('error_message') or ''}"
            sentry_sdk.capture_message(message.rstrip(": "))


def install() -> None:
    """Report step failures to Sentry from now on (idempotent)."""
    with _lock:
        signals.step_attempt_failed.connect(on_step_attempt_failed, weak=False, dispatch_uid=_UID)


def uninstall() -> None:
    """Stop reporting."""
    with _lock:
        signals.step_attempt_failed.disconnect(dispatch_uid=_UID)


__all__ = ["admin_url", "attempt_breadcrumbs", "install", "on_step_attempt_failed", "uninstall"]
