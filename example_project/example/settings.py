"""Settings of the pikku_django example project.

A development setup on SQLite: the database is ``db.sqlite3`` next to
``manage.py``. Set ``DATABASE_URL`` (e.g. ``postgres://user@localhost/pikku``)
to use another database; that needs ``pip install dj-database-url``.
"""

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

# Development only: never run with this key or with DEBUG on in production.
SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "django-insecure-pikku-example-project-not-for-production"
)
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pikku_django",
    "shop",
    "deploys",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example.urls"
WSGI_APPLICATION = "example.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
    }
}
# The lease service and pikku_worker's threads write through connections of their
# own: WAL lets them read while another writes, IMMEDIATE transactions take the
# write lock up front (so two writers queue instead of failing), and the timeout
# makes a busy writer wait instead of failing at once.
SQLITE_OPTIONS = {
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL;",
    "transaction_mode": "IMMEDIATE",
}
if os.environ.get("DATABASE_URL"):
    try:
        import dj_database_url
    except ImportError as exc:
        raise ImproperlyConfigured(
            "DATABASE_URL is set but dj-database-url is not installed: "
            "pip install dj-database-url, or unset DATABASE_URL to use db.sqlite3."
        ) from exc
    DATABASES["default"] = dj_database_url.parse(os.environ["DATABASE_URL"])
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = SQLITE_OPTIONS

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# pikku_django's settings. Every key is optional; these are the defaults
# (pikku_django/conf.py), so deleting a line changes nothing.
PIKKU = {
    # Where leases live: "database", "redis", "memory", or the dotted path of a
    # LeaseService subclass (built with no arguments).
    "LEASE_BACKEND": "database",
    # The DATABASES alias the database backend writes its leases through.
    "LEASE_DATABASE": "default",
    # The CACHES alias of a django-redis cache; required by the "redis" backend.
    "LEASE_CACHE": None,
    # Prefix of the Redis keys the "redis" backend writes.
    "LEASE_KEY_PREFIX": "pikku:lease:",
    # Default length of a lease held with hold_lease(), in milliseconds;
    # it is renewed in the background every third of that.
    "LEASE_TTL_MS": 30_000,
}

# pikku_django logs under the "pikku_django" logger (e.g. a warning when
# hold_lease() loses its lease); show its INFO and above on the console.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "console": {"format": "{levelname} {name}: {message}", "style": "{"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "console"},
    },
    "loggers": {
        "pikku_django": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
