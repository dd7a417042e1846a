"""Fixtures that put the suite on each real service, and CI's no-skip rule."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core import checks
from django.db import connections

from pikku_django.leases.database import (
    DatabaseLeaseService,
    close_database_lease_connections,
)
from tests.pgbouncer import pooled, poolers  # noqa: F401 (fixtures: the tests through PgBouncer)

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

#: Database aliases of tests/settings.py, by the vendor name tests use.
DATABASE_ALIASES = {"sqlite": "default", "postgres": "postgres", "mariadb": "mariadb"}


def skip_unless_ci(reason: str) -> None:
    """Skip with ``reason`` (how to enable the test); under CI, fail instead."""
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def require_service(name: str) -> None:
    """Skip (or, under CI, fail) unless ``name`` is part of this run."""
    reason = settings.UNAVAILABLE.get(name)
    if reason is not None:
        skip_unless_ci(reason)


def database_alias(vendor: str) -> str:
    """The DATABASES alias for ``vendor``, skipping if the service is not up."""
    if vendor != "sqlite":
        require_service(vendor)
    return DATABASE_ALIASES[vendor]


def db_mark(vendor: str, *, transaction: bool = True) -> pytest.MarkDecorator:
    """pytest-django's mark for a test on ``vendor`` (with the SQLite default alongside).

    An alias that is not configured is left out, so the test reaches
    :func:`database_alias`, which skips it (or fails it under CI) with a reason.
    """
    aliases = [a for a in ("default", DATABASE_ALIASES[vendor]) if a in settings.DATABASES]
    return pytest.mark.django_db(databases=sorted(set(aliases)), transaction=transaction)


def on_databases(*vendors: str, transaction: bool = True) -> pytest.MarkDecorator:
    """Parametrize a test's ``vendor`` argument over databases, each with its db mark."""
    return pytest.mark.parametrize(
        "vendor",
        [pytest.param(v, marks=db_mark(v, transaction=transaction), id=v) for v in vendors],
    )


@pytest.fixture(scope="session")
def django_db_modify_db_settings_xdist_suffix() -> None:
    """No suffix: tests/settings.py already names each pytest-xdist worker's test
    databases (``TEST_RUN_TAG``), and worker processes started by tests are given them."""


@pytest.fixture(scope="session", autouse=True)
def _close_lease_connections(django_db_setup: None) -> Iterator[None]:
    # Test databases cannot be dropped while lease connections are open to them.
    yield
    close_database_lease_connections()


@pytest.fixture(scope="session", autouse=True)
def _aliases_ready(django_db_setup: None, django_db_blocker: Any) -> None:
    """Ready the aliases that the test setup may leave unconnected.

    A SQLite replica (tests/settings.py's ``READ_REPLICAS``, Django test mirrors) is the
    same file under another connection, with its primary's settings: with their
    ``IMMEDIATE`` transactions, a test case's atomic block on the replica would wait for
    the write lock the same test's block on the primary holds. A replica only reads: its
    transactions begin deferred.

    Every alias then answers the model checks once, here: Django 6.1's model checks ask
    every database's features (JSON support, the server's version), and an alias that no
    test has connected yet (a replica; every MariaDB one when PIKKU_TEST_BACKENDS leaves
    it out) would connect from a test that may not.
    """
    for alias in settings.READ_REPLICAS.values():
        if alias in connections and connections[alias].vendor == "sqlite":
            replica = connections[alias]
            replica.close()
            options = {**replica.settings_dict["OPTIONS"], "transaction_mode": "DEFERRED"}
            replica.settings_dict = {**replica.settings_dict, "OPTIONS": options}
    with django_db_blocker.unblock():
        checks.run_checks(tags=[checks.Tags.models], databases=list(connections))


def fresh_database_lease_service(alias: str, **options: object) -> DatabaseLeaseService:
    """A database lease service on ``alias`` with an empty lease table."""
    service = DatabaseLeaseService(alias, **options)
    with service._pool.connection() as conn:
        cursor = conn.connection.cursor()
        cursor.execute("DELETE FROM pikku_lease")
        cursor.close()
    return service


def spawn_settings_dict(alias: str) -> dict[str, object]:
    """The settings of ``alias``'s test database, for a process spawned by a test."""
    return dict(connections[alias].settings_dict)


#: Words in a test's id that tie it to one backend.
BACKEND_WORDS = {
    "sqlite": ("sqlite",),
    "postgres": ("postgres",),
    "mariadb": ("mariadb", "mysql"),
    "redis": ("redis",),
}


#: What an id made from an object's default repr holds: it changes from process to process.
UNSTABLE_ID = re.compile(r" (object )?at 0x[0-9a-f]+")


def check_stable_ids(items: list[pytest.Item]) -> None:
    """Refuse test ids that name an object's address: every pytest-xdist process must
    collect the same ids, and a rerun must find the same test (give ``ids=`` instead)."""
    unstable = [item.nodeid for item in items if UNSTABLE_ID.search(item.nodeid)]
    if unstable:
        raise pytest.UsageError(
            "These test ids hold an object's address, which differs between processes; "
            "give the parametrize call ids=: " + ", ".join(unstable[:5])
        )


def long_files_first(items: list[pytest.Item]) -> None:
    """Order the files for pytest-xdist's ``--dist loadfile`` (run with
    ``--no-loadscope-reorder``, which keeps this order): files marked ``long`` first,
    then the others by their number of tests, most first (xdist's own order). A file
    that takes minutes in a few tests, started last, would end the run alone."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    files = sorted(
        by_file.values(),
        key=lambda tests: (tests[0].get_closest_marker("long") is None, -len(tests)),
    )
    items[:] = [item for tests in files for item in tests]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """PIKKU_TEST_BACKENDS=sqlite,postgres runs only those backends' tests (and the
    backend-free ones); the others are deselected, not skipped. Files marked ``long``
    are run first (:func:`long_files_first`)."""
    check_stable_ids(items)
    long_files_first(items)
    wanted = os.environ.get("PIKKU_TEST_BACKENDS", "").strip()
    if not wanted:
        return
    keep = {name.strip() for name in wanted.split(",") if name.strip()}
    unknown = keep - set(BACKEND_WORDS)
    if unknown:
        raise pytest.UsageError(
            f"PIKKU_TEST_BACKENDS names unknown backends {sorted(unknown)}; "
            f"use any of {sorted(BACKEND_WORDS)}"
        )
    dropped_words = [w for name, words in BACKEND_WORDS.items() if name not in keep for w in words]
    selected, deselected = [], []
    for item in items:
        nodeid = item.nodeid.lower()
        (deselected if any(w in nodeid for w in dropped_words) else selected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI a skipped test is a failure: every backend must run.

    Under pytest-xdist the controller judges, on the reports of every worker.
    """
    if not IN_CI or hasattr(session.config, "workerinput"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter:
            reporter.write_line(
                f"CI=true: {len(skipped)} test(s) skipped, which fails the run.", red=True
            )
