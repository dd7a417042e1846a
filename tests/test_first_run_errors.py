"""Errors and checks that tell a new user what to do: migrate first, the key they meant,
the staticfiles app and the URLs they left out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError

from pikku_django import checks, schema
from pikku_django.schema import pikku_databases, require_migrated

ROOT = Path(__file__).resolve().parent.parent

FRESH_SETTINGS = """
SECRET_KEY = "fresh-project"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pikku_django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {{
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {{
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        }},
    }}
]
STATIC_URL = "static/"
ROOT_URLCONF = "fresh_urls"
DATABASES = {{
    "default": {{
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": {name!r},
        "OPTIONS": {{"transaction_mode": "IMMEDIATE", "timeout": 20}},
    }}
}}
"""

FRESH_URLS = """
from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls), path("pikku/", include("pikku_django.urls"))]
"""


@pytest.fixture
def fresh_project(tmp_path: Path) -> Path:
    """A project whose SQLite database has never been migrated."""
    (tmp_path / "fresh_settings.py").write_text(
        FRESH_SETTINGS.format(name=str(tmp_path / "db.sqlite3"))
    )
    (tmp_path / "fresh_urls.py").write_text(FRESH_URLS)
    return tmp_path


def manage(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "fresh_settings",
        "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)]),
    }
    env.pop("PIKKU_DEV_WEBHOOK_URL", None)
    return subprocess.run(  # noqa: S603
        [sys.executable, "-m", "django", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


#: A way to start each management command, more than one where a subcommand reads
#: the tables on another path.
COMMANDS_BEFORE_MIGRATE = [
    ["pikku_worker", "--until-idle"],
    ["pikku_sources", "list"],
    ["pikku_credentials", "list"],
    ["pikku_prune", "--older-than", "30d"],
    ["pikku_runs", "list"],
    ["pikku_runs", "show", "0123456789abcdef"],
    ["pikku_schedules", "list"],
    ["pikku_schedules", "trigger", "nightly"],
    ["pikku_queues", "list"],
]


def test_every_management_command_is_started_before_migrate_below() -> None:
    folder = ROOT / "pikku_django" / "management" / "commands"
    commands = {path.stem for path in folder.glob("pikku_*.py")}
    assert commands == {command[0] for command in COMMANDS_BEFORE_MIGRATE}


@pytest.mark.parametrize("command", COMMANDS_BEFORE_MIGRATE, ids=" ".join)
def test_a_command_before_migrate_says_to_migrate_in_one_line(
    fresh_project: Path, command: list[str]
) -> None:
    done = manage(fresh_project, *command)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("CommandError")]
    assert len(errors) == 1, done.stderr
    assert re.fullmatch(
        r"CommandError: pikku_django's tables are not set up on database 'default' "
        r"\(\d+ migration\(s\) not applied\): run `python manage\.py migrate` first\.",
        errors[0],
    ), errors[0]


def test_check_reports_unapplied_migrations_without_database_flag(fresh_project: Path) -> None:
    before = manage(fresh_project, "check")
    assert "pikku_django.W007" in before.stderr, before.stderr
    assert "python manage.py migrate" in before.stderr
    flagged = manage(fresh_project, "check", "--database", "default")
    assert flagged.stderr.count("pikku_django.W007") == 1, flagged.stderr  # not twice
    migrated = manage(fresh_project, "migrate", "--no-input", "-v", "0")
    assert migrated.returncode == 0, migrated.stderr
    after = manage(fresh_project, "check")
    assert after.returncode == 0
    assert "pikku_django" not in after.stdout + after.stderr
    assert (
        manage(fresh_project, "pikku_worker", "--until-idle", "--idle-grace", "0").returncode == 0
    )


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_the_check_reads_an_sqlite_file_that_is_not_there_without_creating_it(
    settings: Any, tmp_path: Path
) -> None:
    missing = tmp_path / "new.sqlite3"
    settings.DATABASES = {
        **settings.DATABASES,
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(missing)},
    }
    (message,) = checks.check_migrations_applied()
    assert message.id == "pikku_django.W007"
    assert message.hint == "Run: python manage.py migrate"
    assert not missing.exists()


def test_the_check_never_connects_to_a_database_server(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[str] = []
    monkeypatch.setattr(schema, "pending_migrations", lambda alias: read.append(alias) or [])
    settings.PIKKU = {"WORKFLOW_DATABASE": "postgres", "LEASE_DATABASE": "mariadb"}
    assert checks.check_migrations_applied() == []
    assert read == []  # left to `check --database` and to the commands


@pytest.mark.django_db
def test_require_migrated_passes_on_a_migrated_database() -> None:
    require_migrated()
    require_migrated("default")


def test_require_migrated_names_an_unknown_alias() -> None:
    with pytest.raises(CommandError, match="There is no database 'nowhere' in DATABASES"):
        require_migrated("nowhere")


def test_lease_database_is_checked_too(settings: Any) -> None:
    settings.PIKKU = {"LEASE_DATABASE": "postgres", "WORKFLOW_DATABASE": "default"}
    assert pikku_databases() == ["default", "postgres"]
    settings.PIKKU = {"LEASE_BACKEND": "memory"}
    assert pikku_databases("mariadb") == ["mariadb"]


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("LEASE_BAKEND", "LEASE_BACKEND"),
        ("worker_concurrency", "WORKER_CONCURRENCY"),
        ("STEP_RETRY", "STEP_RETRIES"),
        ("WEBHOOK_MAX_BODY_SIZE", "WEBHOOK_MAX_BODY"),
    ],
)
def test_a_misspelt_key_names_the_closest_real_one(settings: Any, typo: str, meant: str) -> None:
    settings.PIKKU = {typo: 1}
    (message,) = checks.check_settings()
    assert message.id == "pikku_django.W001"
    assert message.hint == f"Did you mean {meant!r}?"


def test_a_key_like_no_other_is_not_given_a_guess(settings: Any) -> None:
    settings.PIKKU = {"COLOUR": "blue"}
    (message,) = checks.check_settings()
    assert "Did you mean" not in message.hint
    assert "settings reference" in message.hint


def test_missing_staticfiles_is_a_warning(settings: Any) -> None:
    apps = [a for a in settings.INSTALLED_APPS if a != "django.contrib.staticfiles"]
    settings.INSTALLED_APPS = apps
    (message,) = checks.check_staticfiles()
    assert message.id == "pikku_django.W009"
    assert "django.contrib.staticfiles" in message.hint
    settings.INSTALLED_APPS = [*apps, "django.contrib.staticfiles"]
    assert checks.check_staticfiles() == []


def test_missing_urls_include_is_a_warning(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_without_pikku"
    (message,) = checks.check_urls_included()
    assert message.id == "pikku_django.W004"
    assert 'include("pikku_django.urls")' in message.hint
