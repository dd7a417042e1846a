"""System checks of the Prometheus and Sentry integrations' settings."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from django.core import checks

from pikku_django.integrations import PACKAGES, missing_package

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _missing(setting: str) -> list[checks.CheckMessage]:
    module = missing_package(setting)
    if module is None:
        return []
    _, extra = PACKAGES[setting]
    check_id = "pikku_django.E401" if setting == "PROMETHEUS_METRICS" else "pikku_django.E402"
    return [
        checks.Error(
            f"PIKKU[{setting!r}] is on, but {module} is not installed: nothing is reported.",
            hint=f"pip install 'pikku-django[{extra}]', or turn PIKKU[{setting!r}] off.",
            id=check_id,
        )
    ]


def _token_errors(token: object) -> list[checks.CheckMessage]:
    def good(value: object) -> bool:
        return isinstance(value, str) and bool(value.strip())

    if token is None or good(token):
        return []
    if isinstance(token, list | tuple) and token and all(good(t) for t in token):
        return []
    return [
        checks.Error(
            f"PIKKU['PROMETHEUS_TOKEN'] must be None, a non-empty string or a list of them, "
            f"not {token!r}.",
            hint="Read it from the environment: os.environ['PIKKU_METRICS_TOKEN'].",
            id="pikku_django.E403",
        )
    ]


def _multiproc_messages() -> list[checks.CheckMessage]:
    path = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())
    if not path:
        return [
            checks.Warning(
                f"PIKKU['PROMETHEUS_METRICS'] is on without {MULTIPROC_ENV}: the metrics "
                f"page shows only its own process's counts, none of pikku_worker's.",
                hint=f"Set {MULTIPROC_ENV} to one empty directory for the web and worker "
                f"processes of each host (see the 'Metrics and errors' operations page).",
                id="pikku_django.W401",
            )
        ]
    if not os.path.isdir(path) or not os.access(path, os.W_OK):
        return [
            checks.Error(
                f"{MULTIPROC_ENV} is {path!r}, which is not a writable directory.",
                hint="Create it (emptied at each deploy) before the processes start.",
                id="pikku_django.E404",
            )
        ]
    return []


def _route_clash() -> list[checks.CheckMessage]:
    from pikku_django.webhooks.sources import sources

    clashing = [s.name for s in sources() if (s.route or "").rstrip("/") == "metrics"]
    if not clashing:
        return []
    return [
        checks.Warning(
            f"Webhook source {clashing[0]!r} has the route 'metrics', which the metrics view "
            f"of pikku_django.urls answers first.",
            hint="Give the source another route.",
            id="pikku_django.W402",
        )
    ]


@checks.register(checks.Tags.compatibility)
def check_integrations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The packages the switched-on integrations need, and their settings."""
    from pikku_django.conf import pikku_settings

    # A value of the wrong type is reported once, by check_settings (conf.RULES).
    typed = pikku_settings.well_typed
    messages: list[checks.CheckMessage] = []
    if pikku_settings.PROMETHEUS_METRICS is True:
        messages += _missing("PROMETHEUS_METRICS")
        if typed("PROMETHEUS_TOKEN"):
            messages += _token_errors(pikku_settings.PROMETHEUS_TOKEN)
        permission = pikku_settings.PROMETHEUS_PERMISSION
        if typed("PROMETHEUS_PERMISSION") and "." not in permission:
            messages.append(
                checks.Error(
                    f"PIKKU['PROMETHEUS_PERMISSION'] must be 'app_label.codename', "
                    f"not {permission!r}.",
                    id="pikku_django.E405",
                )
            )
        messages += _multiproc_messages()
        messages += _route_clash()
    if pikku_settings.SENTRY is True:
        messages += _missing("SENTRY")
    base = pikku_settings.ADMIN_BASE_URL
    if base is not None and typed("ADMIN_BASE_URL"):
        parts = urlsplit(str(base)) if isinstance(base, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            messages.append(
                checks.Error(
                    f"PIKKU['ADMIN_BASE_URL'] must be an http(s) URL such as "
                    f"'https://ops.example.com', not {base!r}.",
                    id="pikku_django.E406",
                )
            )
    return messages
