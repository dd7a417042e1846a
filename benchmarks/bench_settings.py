"""Settings for ``benchmarks/throughput.py``, ``benchmarks/chaos.py`` and their workers.

Import it with ``benchmarks/`` on ``sys.path`` (the scripts do, and set
``PYTHONPATH`` for the ``pikku_worker`` processes they start). The environment
picks the database and the timings; every PIKKU key not named here keeps its
documented default:

    PIKKU_BENCH_WORKFLOWS_URL     default postgres://postgres@127.0.0.1:5432/pikku_bench_workflows
                                  (mysql://... for MariaDB, sqlite:////path for SQLite)
    PIKKU_BENCH_CONN_MAX_AGE      default 60     (DATABASES CONN_MAX_AGE, seconds)
    PIKKU_BENCH_CARRY             default 1      (0: the build's setting that turns carrying
                                  runs off, when it has one; see CARRY_SETTING)
    PIKKU_BENCH_STEP_LEASE_MS     default 60000  (PIKKU["STEP_LEASE_MS"])
    PIKKU_BENCH_RUN_LEASE_MS      default 30000  (PIKKU["RUN_LEASE_MS"])
    PIKKU_BENCH_RUN_PASS_TIMEOUT  default 300    (PIKKU["RUN_PASS_TIMEOUT"], seconds)
    PIKKU_BENCH_POLL              default 1.0    (PIKKU["WORKER_POLL_INTERVAL"], seconds)
    PIKKU_BENCH_RECOVERY_INTERVAL default 30     (PIKKU["RECOVERY_INTERVAL"], seconds)
    PIKKU_BENCH_STALLED_RUN_AFTER default 300    (PIKKU["STALLED_RUN_AFTER"], seconds)
    PIKKU_BENCH_LOG_LEVEL         default WARNING (the pikku_django logger)
    PIKKU_BENCH_POOLING           default unset  (PIKKU["DATABASE_POOLING"] of "default",
                                  with WORKER_NOTIFY off: throughput.py --pooler)
    PIKKU_BENCH_LISTEN_URL        default unset  (with PIKKU_BENCH_POOLING: an alias
                                  "listen" on this URL, the database reached directly, in
                                  PIKKU["LISTEN_DATABASES"], and WORKER_NOTIFY left on)
    PIKKU_BENCH_PREPARED          default 1      (0: PIKKU["PREPARED_STATEMENTS"] and
                                  LEASE_PREPARED_STATEMENTS off, as behind a transaction
                                  pooler: throughput.py --pooler)
    PIKKU_BENCH_INTEGRATIONS      default 0      (1: PIKKU["PROMETHEUS_METRICS"] and
                                  PIKKU["SENTRY"] on, with sentry_sdk.init() as below;
                                  the worker sets PROMETHEUS_MULTIPROC_DIR)

A database of its own, not ``pikku_bench``: a worker gives a pass to every
running run in its database, and suspends runs of workflows it does not know
(WORKFLOW_NOT_FOUND), so benchmarks sharing one database would take each
other's runs.
"""

from __future__ import annotations

import os

import dj_database_url

from pikku_django.conf import DEFAULTS

POSTGRES_URL = os.environ.get(
    "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_workflows"
)

#: The PIKKU key that turns a worker thread's carrying of a run off, if this build has one.
CARRY_SETTING = next(
    (key for key in ("CARRY_RUNS", "WORKER_CARRY_RUNS", "WORKER_CARRY") if key in DEFAULTS), None
)

SECRET_KEY = "pikku-bench-not-secret"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["pikku_django", "bench_app"]
DATABASES = {
    "default": dj_database_url.parse(
        POSTGRES_URL, conn_max_age=int(os.environ.get("PIKKU_BENCH_CONN_MAX_AGE", "60"))
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # What the README asks of a SQLite database that workers share.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL;",
    }
elif DATABASES["default"]["ENGINE"].endswith("mysql"):
    DATABASES["default"]["OPTIONS"] = {"connect_timeout": 5, "charset": "utf8mb4"}
else:
    DATABASES["default"]["OPTIONS"] = {"connect_timeout": 5}
PIKKU = {
    "LEASE_BACKEND": "database",
    "STEP_LEASE_MS": int(os.environ.get("PIKKU_BENCH_STEP_LEASE_MS", "60000")),
    "RUN_LEASE_MS": int(os.environ.get("PIKKU_BENCH_RUN_LEASE_MS", "30000")),
    "RUN_PASS_TIMEOUT": float(os.environ.get("PIKKU_BENCH_RUN_PASS_TIMEOUT", "300")),
    "WORKER_POLL_INTERVAL": float(os.environ.get("PIKKU_BENCH_POLL", "1.0")),
    "RECOVERY_INTERVAL": float(os.environ.get("PIKKU_BENCH_RECOVERY_INTERVAL", "30")),
    "STALLED_RUN_AFTER": float(os.environ.get("PIKKU_BENCH_STALLED_RUN_AFTER", "300")),
}
if os.environ.get("PIKKU_BENCH_POOLING"):
    # throughput.py --pooler: the workers reach PostgreSQL through a PgBouncer in that
    # mode, stated as the settings reference says (no LISTEN there: workers poll).
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    PIKKU["DATABASE_POOLING"] = {"default": os.environ["PIKKU_BENCH_POOLING"]}
    if os.environ.get("PIKKU_BENCH_LISTEN_URL"):
        # The operations guide's best: workers LISTEN over a direct alias of the same
        # database, everything else goes through the pooler.
        DATABASES["listen"] = dj_database_url.parse(os.environ["PIKKU_BENCH_LISTEN_URL"])
        DATABASES["listen"]["OPTIONS"] = {"connect_timeout": 5}
        PIKKU["LISTEN_DATABASES"] = {"default": "listen"}
    else:
        PIKKU["WORKER_NOTIFY"] = False
if os.environ.get("PIKKU_BENCH_PREPARED", "1") == "0":
    PIKKU["PREPARED_STATEMENTS"] = PIKKU["LEASE_PREPARED_STATEMENTS"] = False
if CARRY_SETTING is not None and os.environ.get("PIKKU_BENCH_CARRY", "1") == "0":
    PIKKU[CARRY_SETTING] = False
if os.environ.get("PIKKU_BENCH_INTEGRATIONS") == "1":
    # throughput.py --integrations: the Prometheus metrics and Sentry's step reports, with
    # the SDK set up as a project would (its default integrations; no framework
    # integration, which a project has with or without pikku's) and a transport that
    # drops what it is given, so nothing leaves the machine.
    import sentry_sdk
    from sentry_sdk.envelope import Envelope
    from sentry_sdk.transport import Transport

    class _Dropped(Transport):
        def capture_envelope(self, envelope: Envelope) -> None:
            pass

    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=_Dropped(),
        auto_enabling_integrations=False,
    )
    PIKKU["PROMETHEUS_METRICS"] = True
    PIKKU["SENTRY"] = True
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
    "loggers": {
        "pikku_django": {
            "handlers": ["console"],
            "level": os.environ.get("PIKKU_BENCH_LOG_LEVEL", "WARNING"),
        },
        # The worker's start line and its stop, without a line per run or step.
        "pikku_django.worker": {"level": "INFO"},
        "pikku_django.workflows.worker.loop": {"level": "INFO"},
    },
}
