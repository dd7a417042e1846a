"""PgBouncer in front of the suite's PostgreSQL, started by the tests themselves.

:func:`start_poolers` starts one PgBouncer per pooling mode (``transaction`` and
``session``) on free ports of 127.0.0.1, each with its own ini and user list in a
temporary directory, forwarding every database name to the suite's PostgreSQL. As
root it runs as the ``postgres`` user (PgBouncer refuses root). Each pooler hands a
client's transactions to its server connections in turn (``server_round_robin``, with
several kept open), so behind the transaction pooler consecutive transactions really
land on other server sessions. :func:`pooled_settings` is a ``DATABASES`` entry through
one of them, mirroring the test database. The module is imported by the settings of
the workers the tests start (``tests.pooler_worker_settings``): what it imports at
the top needs no settings.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings

#: The pooling modes the suite runs behind, each with its ``DATABASES`` alias.
MODES = ("transaction", "session")
ENABLE = (
    "PgBouncer is not installed, so the tests through a connection pooler cannot run: "
    "install Debian's pgbouncer (apt-get install pgbouncer), or set PIKKU_TEST_PGBOUNCER "
    "to its path."
)


#: A ``DATABASES`` entry's engine and user, for a pooler in front of a private cluster.
POSTGRESQL = {"ENGINE": "django.db.backends.postgresql", "USER": "postgres", "PASSWORD": ""}


def alias_for(mode: str) -> str:
    """The ``DATABASES`` alias of the pooler in ``mode``."""
    return f"pooled_{mode}"


def executable() -> str | None:
    """PgBouncer's path, or None when it is not installed."""
    named = os.environ.get("PIKKU_TEST_PGBOUNCER")
    if named:
        return named
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
    )


@dataclass
class Pooler:
    """One running PgBouncer."""

    mode: str
    port: int
    directory: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def alias(self) -> str:
        return alias_for(self.mode)

    def log(self) -> str:
        return (self.directory / "pgbouncer.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop at once (SIGINT would wait for clients); server connections close."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


def _run_as() -> dict[str, Any]:
    """Popen's user: PgBouncer refuses to run as root."""
    if os.geteuid() != 0:
        return {}
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return {"user": pwd.getpwnam(name).pw_uid}
    raise RuntimeError("No user to run PgBouncer as (it refuses root): add 'postgres'")


def _ini(
    mode: str,
    port: int,
    server: dict[str, Any],
    directory: Path,
    pool_size: int | None,
    round_robin: bool,
) -> str:
    host = server.get("HOST") or "127.0.0.1"
    return f"""\
[databases]
* = host={host} port={server.get("PORT") or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "userlist.txt"}
pool_mode = {mode}
max_client_conn = 400
default_pool_size = {pool_size or (10 if mode == "transaction" else 30)}
min_pool_size = 4
server_round_robin = {int(round_robin)}
server_login_retry = 1
ignore_startup_parameters = extra_float_digits,options
server_reset_query = DISCARD ALL
logfile =
syslog = 0
log_connections = 0
log_disconnections = 0
"""


def start(
    mode: str,
    server: dict[str, Any],
    *,
    pool_size: int | None = None,
    round_robin: bool = True,
    attempts: int = 5,
) -> Pooler:
    """A PgBouncer in ``mode`` in front of ``server`` (a ``DATABASES`` entry), with
    ``pool_size`` server connections per database; ``round_robin`` hands transactions
    to them in turn (PgBouncer's default reuses the last one freed)."""
    program = executable()
    if program is None:
        raise FileNotFoundError(ENABLE)
    for _ in range(attempts):
        directory = Path(tempfile.mkdtemp(prefix=f"pikku-pgbouncer-{mode}-"))
        directory.chmod(0o755)
        port = _free_port()
        user, password = server.get("USER") or "postgres", server.get("PASSWORD") or ""
        (directory / "userlist.txt").write_text(f'"{user}" "{password}"\n')
        (directory / "pgbouncer.ini").write_text(
            _ini(mode, port, server, directory, pool_size, round_robin)
        )
        for path in directory.iterdir():
            path.chmod(0o644)
        with open(directory / "pgbouncer.log", "wb") as log:
            process = subprocess.Popen(  # noqa: S603
                [program, str(directory / "pgbouncer.ini")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                **_run_as(),
            )
        pooler = Pooler(mode, port, directory, process)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and process.poll() is None and not _open(port):
            time.sleep(0.05)
        if process.poll() is None and _open(port):
            return pooler
        log_text = pooler.log()
        pooler.stop()
        if "Address already in use" not in log_text:
            raise RuntimeError(f"PgBouncer ({mode}) did not start:\n{log_text}")
    raise RuntimeError(f"PgBouncer ({mode}) found no free port in {attempts} attempts")


def pooled_settings(server: dict[str, Any], port: int) -> dict[str, Any]:
    """``server`` (a PostgreSQL ``DATABASES`` entry) reached through the pooler on
    ``port``, as Django's docs ask behind a transaction pooler: no server-side cursors,
    and a new connection per request. Its test database is ``server``'s (a mirror)."""
    settings = {**server, "HOST": "127.0.0.1", "PORT": str(port)}
    settings["DISABLE_SERVER_SIDE_CURSORS"] = True
    settings["CONN_MAX_AGE"] = 0
    settings["OPTIONS"] = dict(server.get("OPTIONS") or {})
    settings["TEST"] = {**(server.get("TEST") or {}), "MIRROR": "postgres"}
    return settings


def pooled_pikku(alias: str, mode: str, **more: Any) -> dict[str, Any]:
    """``PIKKU`` for workflows and leases on ``alias``, behind a pooler in ``mode``.

    Worker notifications are off: a ``LISTEN`` needs a session of its own, which a
    transaction pooler does not give; idle workers poll instead.
    """
    return {
        "WORKFLOW_DATABASE": alias,
        "LEASE_DATABASE": alias,
        "DATABASE_POOLING": {alias: mode},
        "WORKER_NOTIFY": False,
        **more,
    }


def open_server_sessions(entry: dict[str, Any], count: int) -> None:
    """Have the pooler open ``count`` server sessions to the database, by holding as many
    transactions at once, so that round robin has sessions to go round."""
    import psycopg

    held = []
    try:
        for _ in range(count):
            conn = psycopg.connect(
                host=entry["HOST"],
                port=int(entry["PORT"]),
                dbname=entry["NAME"],
                user=entry.get("USER") or "postgres",
                password=entry.get("PASSWORD") or None,
            )
            held.append(conn)
            conn.execute("SELECT 1")  # its transaction holds a server session until commit
    finally:
        for conn in held:
            conn.commit()  # a client leaving mid-transaction would have its server closed
            conn.close()


@pytest.fixture(scope="module")
def poolers(django_db_setup: None) -> Iterator[dict[str, Pooler]]:
    """A PgBouncer per mode in front of this process's PostgreSQL test database, each
    a ``DATABASES`` alias (:func:`alias_for`) while the module's tests run. Skips (fails
    under CI) without PostgreSQL or PgBouncer."""
    from pikku_django.leases.database import close_database_lease_connections
    from tests.conftest import require_service, skip_unless_ci

    require_service("postgres")
    if executable() is None:
        skip_unless_ci(ENABLE)
    server = dict(connections["postgres"].settings_dict)
    started: dict[str, Pooler] = {}
    try:
        for mode in MODES:
            started[mode] = pooler = start(mode, server)
            entry = pooled_settings(server, pooler.port)
            settings.DATABASES[pooler.alias] = entry
            connections.settings[pooler.alias] = entry
            open_server_sessions(entry, 4)
        yield started
    finally:
        close_database_lease_connections()
        for pooler in started.values():
            with contextlib.suppress(Exception):
                connections[pooler.alias].close()
            with contextlib.suppress(AttributeError):
                del connections[pooler.alias]
            settings.DATABASES.pop(pooler.alias, None)
            connections.settings.pop(pooler.alias, None)
            pooler.stop()  # before the test database is dropped: it ends their sessions


@pytest.fixture(params=MODES)
def pooled(request: pytest.FixtureRequest, poolers: dict[str, Pooler]) -> Iterator[Pooler]:
    """Each pooler in turn, with ``PIKKU`` putting workflows and leases behind it."""
    from pikku_django.workflows.api import reset_engine

    pooler = poolers[request.param]
    with override_settings(PIKKU=pooled_pikku(pooler.alias, pooler.mode)):
        reset_engine()
        yield pooler
    reset_engine()


def pooled_mark(*, transaction: bool = True) -> pytest.MarkDecorator:
    """The database mark of a test through the poolers (the pooled aliases mirror
    PostgreSQL's test database, which a transactional test flushes)."""
    return pytest.mark.django_db(
        databases=["default", "postgres", *(alias_for(m) for m in MODES)],
        transaction=transaction,
    )


def pooled_worker(pooler: Pooler, *args: str, **env: str) -> subprocess.Popen[str]:
    """A ``pikku_worker`` process on the test database through ``pooler``."""
    from tests.test_worker import worker_process

    return worker_process(
        pooler.alias,
        *args,
        DJANGO_SETTINGS_MODULE="tests.pooler_worker_settings",
        PIKKU_TEST_POOLER_PORT=str(pooler.port),
        PIKKU_TEST_POOLER_MODE=pooler.mode,
        **env,
    )
