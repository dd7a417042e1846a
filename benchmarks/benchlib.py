"""What ``benchmarks/throughput.py`` and ``benchmarks/chaos.py`` share: processes they
start and stop, databases they create, memory read from ``/proc``, and the report's
machine section."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import dj_database_url

log = logging.getLogger("pikku.bench")

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent


class BenchError(RuntimeError):
    """A benchmark did not reach the state it waited for."""


#: How many times :func:`wait_for` has asked its predicate so far: each of the
#: benchmarks' predicates reads its database once (``--transactions`` takes them off).
POLLS = {"count": 0}


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        POLLS["count"] += 1
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise BenchError(f"timed out after {timeout:g}s waiting for {what}")


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0-100) by linear interpolation; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- PostgreSQL --------------------------------------------------------------------------------


def pg_params(url: str) -> dict[str, Any]:
    """psycopg connection keywords for a postgres:// URL."""
    db = dj_database_url.parse(url)
    params: dict[str, Any] = {"dbname": db["NAME"]}
    for key, field in (
        ("host", "HOST"),
        ("port", "PORT"),
        ("user", "USER"),
        ("password", "PASSWORD"),
    ):
        if db.get(field):
            params[key] = db[field]
    return params


def ensure_database(url: str) -> None:
    """Create the database ``url`` names if it is missing."""
    import psycopg
    from psycopg import sql

    params = pg_params(url)
    name = params.pop("dbname")
    with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5, **params) as admin:
        found = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if found is None:
            log.info("creating database %s", name)
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def vacuum(url: str) -> str:
    """VACUUM ANALYZE the database ``url`` names; the server's autovacuum setting."""
    import psycopg

    with psycopg.connect(autocommit=True, connect_timeout=5, **pg_params(url)) as conn:
        conn.execute("VACUUM ANALYZE")
        return str(conn.execute("SHOW autovacuum").fetchone()[0])


def listening_sessions(url: str, channel_like: str) -> int:
    """How many sessions of the database ``url`` last ran ``LISTEN <channel_like>``."""
    import psycopg

    with psycopg.connect(autocommit=True, connect_timeout=5, **pg_params(url)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query ILIKE %s",
            (f"LISTEN%{channel_like}%",),
        ).fetchone()
    return int(row[0]) if row else 0


#: The server settings every report records (PostgreSQL's names).
PG_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "autovacuum",
    "shared_buffers",
    "max_connections",
)
#: MariaDB's counterparts: what a commit waits for, the buffer pool, connections.
MYSQL_SETTINGS = (
    "version",
    "innodb_flush_log_at_trx_commit",
    "sync_binlog",
    "innodb_doublewrite",
    "innodb_buffer_pool_size",
    "max_connections",
    "transaction_isolation",  # MariaDB 11.1+
    "tx_isolation",  # its older name
)


def pg_server_settings(url: str) -> dict[str, str]:
    """The PG_SETTINGS of the server ``url`` names, with their units (shared_buffers in
    8 kB pages is given as, say, ``128MB``)."""
    import psycopg

    with psycopg.connect(autocommit=True, connect_timeout=5, **pg_params(url)) as conn:
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in PG_SETTINGS}


def mysql_connect(url: str, database: bool = True) -> Any:
    """A MySQLdb connection (autocommit) to the server ``url`` names."""
    import MySQLdb

    db = dj_database_url.parse(url)
    kwargs: dict[str, Any] = {"host": db.get("HOST") or "127.0.0.1", "connect_timeout": 5}
    if db.get("PORT"):
        kwargs["port"] = int(db["PORT"])
    if db.get("USER"):
        kwargs["user"] = db["USER"]
    if db.get("PASSWORD"):
        kwargs["password"] = db["PASSWORD"]
    if database:
        kwargs["database"] = db["NAME"]
    conn = MySQLdb.connect(**kwargs)
    conn.autocommit(True)
    return conn


def mysql_ensure_database(url: str) -> None:
    """Create the database ``url`` names (utf8mb4) if it is missing."""
    name = dj_database_url.parse(url)["NAME"]
    if not name.replace("_", "").isalnum():
        raise BenchError(f"unexpected database name {name!r}")
    conn = mysql_connect(url, database=False)
    try:
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def mysql_server_settings(url: str) -> dict[str, str]:
    conn = mysql_connect(url, database=False)
    try:
        cursor = conn.cursor()
        out = {}
        for name in MYSQL_SETTINGS:
            cursor.execute("SHOW GLOBAL VARIABLES LIKE %s", (name,))
            row = cursor.fetchone()
            if row:
                out[name] = str(row[1])
        return out
    finally:
        conn.close()


def sqlite_settings(path: str) -> dict[str, str]:
    """The library version and the file's journal mode and synchronous level."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return {
            "sqlite_version": sqlite3.sqlite_version,
            "journal_mode": str(conn.execute("PRAGMA journal_mode").fetchone()[0]),
            "synchronous (per connection, default)": str(
                conn.execute("PRAGMA synchronous").fetchone()[0]
            ),
        }
    finally:
        conn.close()


# -- processes ---------------------------------------------------------------------------------


def terminate(proc: subprocess.Popen[Any], name: str, timeout: float) -> int | None:
    """SIGTERM a worker (then SIGTERM again, which hands its work back, then SIGKILL),
    waiting ``timeout`` seconds for the first; its exit code."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) still up after %s", name, proc.pid, sig.name)
    return proc.poll()


class Processes:
    """Processes a benchmark started, each in its own session, logging to its own file."""

    def __init__(self, logdir: Path, env: dict[str, str]) -> None:
        self.logdir = logdir
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        stdin: int | None = subprocess.DEVNULL,
        stdout: int | None = None,
    ) -> subprocess.Popen[bytes]:
        with self.log_path(name).open("ab") as out:
            proc = subprocess.Popen(
                list(argv),
                cwd=ROOT,
                env={**self.env, **(env or {})},
                stdin=stdin,
                stdout=stdout if stdout is not None else out,
                stderr=out,
                # Its own session: a Ctrl-C on the terminal reaches the benchmark only,
                # which then stops its processes itself.
                start_new_session=True,
            )
        self.procs[name] = proc
        log.debug("started %s (pid %d)", name, proc.pid)
        return proc

    def start_pikku_worker(
        self, name: str, concurrency: int, *extra: str
    ) -> subprocess.Popen[bytes]:
        return self.start(
            name,
            [
                sys.executable,
                "-m",
                "django",
                "pikku_worker",
                "--concurrency",
                str(concurrency),
                *extra,
            ],
        )

    def log_path(self, name: str) -> Path:
        return self.logdir / f"{name}.log"

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self, *names: str) -> None:
        for name in names or tuple(self.procs):
            proc = self.procs[name]
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

    def stop(self, name: str, timeout: float = 20.0) -> int | None:
        """SIGCONT + SIGTERM (then SIGTERM again, then SIGKILL); its exit code."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
        return terminate(proc, name, timeout)

    def stop_all(self, timeout: float = 20.0) -> None:
        for name in list(self.procs):
            self.stop(name, timeout)


def django_env(settings: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that imports ``settings`` from ``benchmarks/``."""
    pythonpath = [str(BENCH_DIR), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        pythonpath.append(os.environ["PYTHONPATH"])
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings,
        "PYTHONPATH": os.pathsep.join(pythonpath),
        **(extra or {}),
    }


# -- memory ------------------------------------------------------------------------------------


def proc_memory_kb(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (peak resident) of ``pid``, in kB, from /proc."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


# -- report ------------------------------------------------------------------------------------


def machine(server: str, *dists: str) -> dict[str, Any]:
    import django

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_model(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgresql": server,
    }
    for dist in ("pikku-django", "psycopg", *dists):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    return info


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            str(cell).ljust(widths[i]) if i == 0 else str(cell).rjust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


#: Seconds an idle PostgreSQL backend may keep its transaction counts before it reports
#: them (PGSTAT_IDLE_INTERVAL is 10 s), and a margin.
STATS_SETTLE = 11.0


def server_transactions(url: str) -> int:
    """Transactions committed and rolled back in the database so far, by the server's
    statistics (one more, this read's own)."""
    import psycopg

    with psycopg.connect(autocommit=True, connect_timeout=5, **pg_params(url)) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])
