"""Settings for pikku_django's own test suite.

SQLite is always on. PostgreSQL, MariaDB and Redis are added when reachable at
the URLs below (override them with the environment variables named here):

    PIKKU_TEST_POSTGRES_URL  default postgres://postgres@127.0.0.1:5432/postgres
    PIKKU_TEST_MARIADB_URL   default mysql://root@127.0.0.1:3306/test
    PIKKU_TEST_REDIS_URL     default redis://127.0.0.1:6379/15

Set a URL to "off" to leave that service out on purpose.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "pikku-tests-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "pikku_django",
    "tests.testapp",
    "tests.chaosapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

SERVICE_URLS = {
    "postgres": os.environ.get(
        "PIKKU_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"
    ),
    "mariadb": os.environ.get("PIKKU_TEST_MARIADB_URL", "mysql://root@127.0.0.1:3306/test"),
    "redis": os.environ.get("PIKKU_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
}
ENV_VARS = {
    "postgres": "PIKKU_TEST_POSTGRES_URL",
    "mariadb": "PIKKU_TEST_MARIADB_URL",
    "redis": "PIKKU_TEST_REDIS_URL",
}

#: Why each service that is not in this run was left out.
UNAVAILABLE: dict[str, str] = {}


def _reachable(name: str, url: str, default_port: int) -> bool:
    if url.strip().lower() == "off":
        UNAVAILABLE[name] = f"{ENV_VARS[name]} is 'off'"
        return False
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError as exc:
        UNAVAILABLE[name] = (
            f"{name} is not reachable at {host}:{port} ({exc}). Start it, or point "
            f"{ENV_VARS[name]} at a running server, to run these tests."
        )
        return False


#: What names this test process's databases: its pytest-xdist worker ("gw0", "gw1"...,
#: or "main" without xdist) and its pid, so parallel workers and runs side by side
#: (other checkouts, the two Django jobs) never share one. A process a test spawns
#: inherits the worker id and is given its test's database names explicitly.
TEST_RUN_TAG = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"

# A file, not memory: lease connections and worker processes share it.
_sqlite_dir = Path(os.environ.get("PIKKU_TEST_SQLITE_DIR", tempfile.gettempdir()))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(_sqlite_dir / "pikku_tests.sqlite3"),
        "OPTIONS": {
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL;",
            "transaction_mode": "IMMEDIATE",
        },
        "TEST": {"NAME": str(_sqlite_dir / f"pikku_tests_{TEST_RUN_TAG}.sqlite3")},
    }
}
if _reachable("postgres", SERVICE_URLS["postgres"], 5432):
    DATABASES["postgres"] = dj_database_url.parse(SERVICE_URLS["postgres"])
    DATABASES["postgres"]["TEST"] = {"NAME": f"test_pikku_{TEST_RUN_TAG}"}
    # The same database under another alias, as Django's test mirror: the alias that
    # PIKKU["LISTEN_DATABASES"] names to reach it without a pooler (tests/test_wakeups.py).
    DATABASES["postgres_direct"] = {**DATABASES["postgres"], "TEST": {"MIRROR": "postgres"}}
if _reachable("mariadb", SERVICE_URLS["mariadb"], 3306):
    DATABASES["mariadb"] = dj_database_url.parse(SERVICE_URLS["mariadb"])
    DATABASES["mariadb"]["OPTIONS"] = {"charset": "utf8mb4"}
    DATABASES["mariadb"]["TEST"] = {
        "NAME": f"test_pikku_{TEST_RUN_TAG}",
        "CHARSET": "utf8mb4",
        "COLLATION": "utf8mb4_bin",
    }

# Replicas for PIKKU["READ_DATABASE"] (tests/test_read_database.py): each database again
# under another alias, as Django's test mirrors, so a query through a replica is told
# apart from one through its primary.
READ_REPLICAS = {"default": "replica", "postgres": "postgres_replica", "mariadb": "mariadb_replica"}
for _primary, _replica in READ_REPLICAS.items():
    if _primary in DATABASES:
        DATABASES[_replica] = {**DATABASES[_primary], "TEST": {"MIRROR": _primary}}

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if _reachable("redis", SERVICE_URLS["redis"], 6379):
    CACHES["redis"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": SERVICE_URLS["redis"],
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }

PIKKU: dict[str, object] = {}

# django.tasks (or its backport) through pikku_django.tasks; tests/test_tasks.py.
TASKS = {
    "default": {
        "BACKEND": "pikku_django.tasks.PikkuBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"retries": 1, "retry_delay": 0},
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pikku_django": {"handlers": ["console"], "level": "WARNING"}},
}
