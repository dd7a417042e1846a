"""Optional integrations with the tools operators already watch, switched on in ``PIKKU``.

- :mod:`pikku_django.integrations.prometheus` (``PROMETHEUS_METRICS``): counters and
  histograms of runs, steps, lease losses and webhook requests, and gauges of queues and
  workers read from the database at scrape time, served by the ``metrics`` URL of
  ``pikku_django.urls``;
- :mod:`pikku_django.integrations.sentry` (``SENTRY``): each step's final failure (and,
  with ``SENTRY_EACH_ATTEMPT``, each failed attempt) reported to Sentry.

Both listen to :mod:`pikku_django.signals`; the app connects them at start-up when their
setting is on and their package is installed (a system check reports one missing).
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger(__name__)

#: The package each integration needs, and the extra that installs it.
PACKAGES = {
    "PROMETHEUS_METRICS": ("prometheus_client", "prometheus"),
    "SENTRY": ("sentry_sdk", "sentry"),
}


def missing_package(setting: str) -> str | None:
    """The module the integration switched on by ``setting`` needs and cannot import."""
    module, _ = PACKAGES[setting]
    return module if importlib.util.find_spec(module) is None else None


def install_configured() -> list[str]:
    """Connect the integrations that ``PIKKU`` switches on; the settings of those connected."""
    from pikku_django.conf import pikku_settings

    connected = []
    for setting in PACKAGES:
        if not getattr(pikku_settings, setting):
            continue
        if missing_package(setting) is not None:
            continue  # the system check says so, with the pip line
        if setting == "PROMETHEUS_METRICS":
            from pikku_django.integrations import prometheus

            prometheus.install()
        else:
            from pikku_django.integrations import sentry

            sentry.install()
        connected.append(setting)
    return connected
