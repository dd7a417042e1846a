"""Private PostgreSQL clusters for the tests: a primary, and an asynchronous streaming
standby of it, each on a free 127.0.0.1 port in a temporary directory, started with
Debian's binaries and torn down afterwards. The machine's own cluster (5432) is never
touched.

    with private_cluster() as pg:             # one cluster (a restart test)
        pg.restart()
    with primary_and_standby() as pair:       # a failover test
        pair.hold_back_standby()              # commits from now on are not replicated
        pair.primary.stop(mode="immediate")
        pair.standby.promote()

Run as root (CI), every binary runs as the ``postgres`` user (``initdb`` refuses root);
run as anyone else, as that user. Authentication is ``trust`` on 127.0.0.1.
:func:`unavailable_reason` says why clusters cannot be started here, and how to fix it;
:func:`require_clusters` skips a test with that reason (under CI it fails instead).
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


def _default_pg_bin() -> Path:
    """Debian's newest installed server binaries (postgresql-15 on Debian 12)."""
    found = sorted(
        (p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")),
        key=lambda b: int(b.parent.name) if b.parent.name.isdigit() else 0,
    )
    return found[-1] if found else Path("/usr/lib/postgresql/15/bin")


#: Where the server binaries are; PIKKU_TEST_PG_BIN points elsewhere.
PG_BIN = Path(os.environ.get("PIKKU_TEST_PG_BIN") or _default_pg_bin())
#: The OS user clusters run as when the tests run as root.
PG_OS_USER = "postgres"
#: The superuser role of every private cluster.
SUPERUSER = "postgres"
#: Settings every private cluster starts with: small, quick to start and stop.
SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "replica",
    "max_wal_senders": "4",
    "hot_standby": "on",
    "fsync": "off",  # the tests crash processes, never the machine
    "shared_buffers": "'16MB'",
    "max_connections": "40",
    "logging_collector": "off",
    "log_min_messages": "warning",
    "wal_receiver_status_interval": "1s",
}
WAIT_S = 60.0


def unavailable_reason() -> str | None:
    """Why private clusters cannot run here (and how to enable them), or None."""
    missing = [b for b in ("initdb", "pg_ctl", "pg_basebackup") if not (PG_BIN / b).exists()]
    if missing:
        return (
            f"private PostgreSQL clusters need {', '.join(missing)} in {PG_BIN}: install "
            f"Debian's postgresql-15 (apt-get install postgresql-15; .ci/run does) or set "
            f"PIKKU_TEST_PG_BIN to a directory with PostgreSQL's server binaries"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_OS_USER)
        except KeyError:
            return (
                f"running as root, private PostgreSQL clusters run as the {PG_OS_USER!r} "
                f"user, which does not exist: install postgresql-15, which creates it"
            )
    return None


def require_clusters() -> None:
    """Skip the calling test (under CI: fail it) unless private clusters can run."""
    from tests.conftest import skip_unless_ci

    reason = unavailable_reason()
    if reason is not None:
        skip_unless_ci(reason)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_owner(args: list[str]) -> list[str]:
    """``args`` run as the clusters' OS user when this process is root."""
    return ["runuser", "-u", PG_OS_USER, "--", *args] if os.geteuid() == 0 else args


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(  # noqa: S603  (our own binaries, our own arguments)
        _as_owner(args), capture_output=True, text=True, timeout=WAIT_S, check=False, **kwargs
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} exited with {result.returncode}:\n{result.stdout}{result.stderr}"
        )
    return result


def _owned_tempdir(prefix: str) -> Path:
    """A new directory the clusters' OS user owns."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        user = pwd.getpwnam(PG_OS_USER)
        os.chown(path, user.pw_uid, user.pw_gid)
    return path


@dataclass
class Cluster:
    """One private PostgreSQL cluster: its data directory, port and log."""

    name: str
    home: Path
    port: int
    data: Path = field(init=False)
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.data = self.home / "data"
        self.log = self.home / "server.log"

    # -- lifecycle ----------------------------------------------------------------

    def init(self) -> None:
        """Create the cluster (trust authentication, this cluster's settings)."""
        _run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        self.configure(**SERVER_SETTINGS)

    def configure(self, **settings: str) -> None:
        """Append settings to ``postgresql.conf`` (a later line wins); takes effect at
        the next start or reload."""
        lines = [f"{name} = {value}" for name, value in settings.items()]
        lines += [f"port = {self.port}", f"unix_socket_directories = '{self.home}'"]
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n" + "\n".join(lines) + "\n")

    def pg_ctl(self, *args: str) -> None:
        """Run ``pg_ctl`` on this cluster's data directory."""
        _run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args])

    def start(self) -> None:
        self.pg_ctl("-l", str(self.log), "-w", "-t", str(int(WAIT_S)), "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (a clean shutdown) or ``immediate`` (as a crash:
        no shutdown checkpoint, and nothing more is sent to standbys)."""
        self.pg_ctl("-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def reload(self) -> None:
        self.pg_ctl("reload")

    def promote(self) -> None:
        """Promote this standby to a primary on a new timeline, and wait until it is."""
        self.pg_ctl("-w", "promote")
        self.wait_for(lambda: self.scalar("SELECT NOT pg_is_in_recovery()"), "promotion")

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def discard(self) -> None:
        """Stop the server if it runs (``immediate``) and delete its files."""
        if self.running:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.home, ignore_errors=True)

    # -- SQL ----------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"

    def connect(self, dbname: str = "postgres", user: str = SUPERUSER) -> Any:
        """A new autocommit psycopg connection."""
        import psycopg

        return psycopg.connect(self.dsn(dbname, user), autocommit=True, connect_timeout=10)

    def execute(self, sql: str, params: tuple[Any, ...] = (), *, dbname: str = "postgres") -> None:
        with self.connect(dbname) as conn:
            conn.execute(sql, params)

    def scalar(self, sql: str, params: tuple[Any, ...] = (), *, dbname: str = "postgres") -> Any:
        with self.connect(dbname) as conn:
            row = conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def create_database(self, name: str, owner: str) -> None:
        """A login role ``owner`` (no superuser, no special roles) and a database it owns."""
        self.execute(f'CREATE ROLE "{owner}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
        self.execute(f'CREATE DATABASE "{name}" OWNER "{owner}"')

    def settings_dict(self, dbname: str, user: str = SUPERUSER) -> dict[str, Any]:
        """A Django DATABASES entry for this cluster."""
        return django_database(dbname, user, [self])

    def wait_for(self, ready: Any, what: str) -> None:
        """Wait until ``ready()`` is truthy (errors count as not yet), or raise."""
        deadline = time.monotonic() + WAIT_S
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except Exception as exc:  # the server may still be starting
                last = exc
            time.sleep(0.05)
        raise TimeoutError(f"{self.name}: waited {WAIT_S:.0f} s for {what} ({last})")


def django_database(dbname: str, user: str, hosts: list[Cluster], **options: Any) -> dict[str, Any]:
    """A Django DATABASES entry for ``hosts``: with several, a libpq multi-host entry
    that connects to whichever of them is the read-write primary, in order."""
    opts: dict[str, Any] = {"connect_timeout": 5, **options}
    if len(hosts) > 1:
        opts.setdefault("target_session_attrs", "read-write")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": dbname,
        "USER": user,
        "PASSWORD": "",
        "HOST": ",".join("127.0.0.1" for _ in hosts),
        "PORT": ",".join(str(c.port) for c in hosts),
        "OPTIONS": opts,
        "CONN_MAX_AGE": 0,
        "TEST": {"NAME": dbname},
    }


@contextlib.contextmanager
def django_alias(alias: str, settings_dict: dict[str, Any]) -> Iterator[str]:
    """``alias`` in ``django.db.connections`` for the block (no test database is made
    for it: the block uses it as it is), its connections closed on exit."""
    from django.db import connections

    if alias in connections.settings:
        raise ValueError(f"DATABASES already has an alias {alias!r}")
    configured = connections.configure_settings({"default": {}, alias: dict(settings_dict)})
    connections.settings[alias] = configured[alias]
    try:
        yield alias
    finally:
        with contextlib.suppress(Exception):
            connections[alias].close()
        with contextlib.suppress(AttributeError):
            delattr(connections._connections, alias)
        del connections.settings[alias]


def _new_cluster(name: str) -> Cluster:
    return Cluster(name, _owned_tempdir(f"pikku-pg-{name}-"), free_port())


@contextlib.contextmanager
def private_cluster(name: str = "solo") -> Iterator[Cluster]:
    """A running private cluster, discarded on exit."""
    cluster = _new_cluster(name)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.discard()


@dataclass
class ReplicatedPair:
    """A primary and an asynchronous streaming standby of it."""

    primary: Cluster
    standby: Cluster

    def replication_connected(self) -> bool:
        """Whether the primary streams to the standby now."""
        return bool(self.primary.scalar("SELECT count(*) FROM pg_stat_replication"))

    def catch_up(self) -> None:
        """Wait until the standby has replayed everything the primary wrote so far."""
        target = self.primary.scalar("SELECT pg_current_wal_lsn()::text")
        self.standby.wait_for(
            lambda: self.standby.scalar("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)),
            f"replay to {target}",
        )

    def hold_back_standby(self) -> str:
        """Stop the standby receiving WAL (its ``primary_conninfo`` emptied and
        reloaded), once it has caught up: what the primary commits from now on exists
        nowhere else. Returns the primary's WAL position at that moment."""
        self.catch_up()
        self.standby.execute("ALTER SYSTEM SET primary_conninfo = ''")
        self.standby.execute("SELECT pg_reload_conf()")
        self.standby.wait_for(
            lambda: not self.standby.scalar("SELECT count(*) FROM pg_stat_wal_receiver"),
            "its WAL receiver to stop",
        )
        self.primary.wait_for(lambda: not self.replication_connected(), "the walsender to end")
        return str(self.primary.scalar("SELECT pg_current_wal_lsn()::text"))

    def fail_over(self) -> None:
        """Crash the primary (``immediate``) and promote the standby."""
        self.primary.stop("immediate")
        self.standby.promote()

    def discard(self) -> None:
        self.standby.discard()
        self.primary.discard()


@contextlib.contextmanager
def primary_and_standby() -> Iterator[ReplicatedPair]:
    """A running primary and an asynchronous standby streaming from it (connected and
    caught up), both discarded on exit."""
    primary = _new_cluster("primary")
    standby = _new_cluster("standby")
    pair = ReplicatedPair(primary, standby)
    try:
        primary.init()
        primary.start()
        standby.data.parent.mkdir(exist_ok=True)
        base_backup = [str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port)]
        _run(
            [
                *base_backup,
                "-U",
                SUPERUSER,
                "-D",
                str(standby.data),
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
                "--no-sync",
            ]
        )
        standby.configure()  # its own port and socket directory
        standby.start()
        primary.wait_for(pair.replication_connected, "the standby to connect")
        pair.catch_up()
        yield pair
    finally:
        pair.discard()
