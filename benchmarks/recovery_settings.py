"""Settings for ``benchmarks/recovery.py`` and the ``pikku_worker`` processes it starts.

Import it with ``benchmarks/`` on ``sys.path`` (the script does, and sets
``PYTHONPATH`` for its workers). The environment picks the database and the
timings:

    PIKKU_BENCH_POSTGRES_URL  default postgres://postgres@127.0.0.1:5432/pikku_bench
    PIKKU_BENCH_STEP_LEASE_MS default 5000   (PIKKU["STEP_LEASE_MS"])
    PIKKU_BENCH_POLL          default 0.1    (PIKKU["WORKER_POLL_INTERVAL"], seconds)
"""

from __future__ import annotations

import os

import dj_database_url

POSTGRES_URL = os.environ.get(
    "PIKKU_BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench"
)

SECRET_KEY = "pikku-bench-not-secret"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["pikku_django", "recovery_app"]
DATABASES = {"default": dj_database_url.parse(POSTGRES_URL)}
DATABASES["default"]["OPTIONS"] = {"connect_timeout": 5}
PIKKU = {
    "LEASE_BACKEND": "database",
    "STEP_LEASE_MS": int(os.environ.get("PIKKU_BENCH_STEP_LEASE_MS", "5000")),
    "WORKER_POLL_INTERVAL": float(os.environ.get("PIKKU_BENCH_POLL", "0.1")),
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "stamped": {
            "format": "%(asctime)s.%(msecs)03d %(name)s %(message)s",
            "datefmt": "%H:%M:%S",
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "stamped"}},
    "loggers": {"pikku_django": {"handlers": ["console"], "level": "INFO"}},
}
