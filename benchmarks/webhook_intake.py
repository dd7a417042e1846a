"""The child side of ``benchmarks/webhooks.py``: one database, configured in a process of
its own, driven through one in-process ``WSGIHandler`` by 1, 8 and 32 client threads."""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import logging
import pstats
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dj_database_url
from figures import rotations
from webhook_requests import PATHS, POSTGRES_URL, SECRET, SOURCE, WORKFLOW, BenchError, Poster

log = logging.getLogger("pikku.bench.webhooks")
BENCH_DIR = Path(__file__).resolve().parent


def has_procrastinate() -> bool:
    return importlib.util.find_spec("procrastinate") is not None


class Unavailable(Exception):
    """The database cannot be used; the message says why."""


def configure_django(backend: str, sqlite_path: Path) -> None:
    import django
    from django.conf import settings

    if backend == "sqlite":
        database: dict[str, Any] = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(sqlite_path),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL;",
            },
        }
    else:
        database = dj_database_url.parse(POSTGRES_URL)
        database["OPTIONS"] = {"connect_timeout": 5}
    database["CONN_MAX_AGE"] = None  # one connection per client thread, as a pool would keep
    sys.path.insert(0, str(BENCH_DIR))
    apps = ["pikku_django", "webhook_bench"]
    if backend == "postgres" and has_procrastinate():
        apps.append("procrastinate.contrib.django")
    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        SECRET_KEY="pikku-bench-not-secret",  # noqa: S106
        INSTALLED_APPS=apps,
        BENCH_WEBHOOK_SECRET=SECRET,
        DATABASES={"default": database},
        ROOT_URLCONF="webhook_bench.urls",
        MIDDLEWARE=[],
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        PIKKU={},  # every documented default (NOTIFY on PostgreSQL, stored credentials)
    )
    django.setup()


def create_postgres_database() -> str:
    """Create the database when missing; the server's version."""
    import psycopg
    from django.conf import settings
    from psycopg import sql

    db = settings.DATABASES["default"]
    params = {
        key: db[name]
        for key, name in (("host", "HOST"), ("port", "PORT"), ("user", "USER"))
        if db.get(name)
    }
    if db.get("PASSWORD"):
        params["password"] = db["PASSWORD"]
    try:
        admin = psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5, **params)
    except psycopg.OperationalError as exc:
        raise Unavailable(
            f"cannot connect ({' '.join(str(exc).split())}); "
            "start it or set PIKKU_BENCH_POSTGRES_URL"
        ) from exc
    with admin:
        found = admin.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (db["NAME"],)
        ).fetchone()
        if found is None:
            log.info("postgres: creating database %s", db["NAME"])
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
        return str(admin.execute("SHOW server_version").fetchone()[0])


def clear_rows() -> None:
    """Delete what this benchmark wrote (receipts, runs and bare rows); nothing else."""
    from django.db import connection
    from webhook_bench.models import RawDelivery

    from pikku_django.models import WebhookReceipt, WorkflowRun, WorkflowStep

    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {WebhookReceipt._meta.db_table} WHERE source = %s", [SOURCE])
        runs = f"SELECT id FROM {WorkflowRun._meta.db_table} WHERE workflow = %s"
        if WorkflowStep.objects.filter(run__workflow=WORKFLOW).exists():
            # Only if a worker on the same database picked the runs up: delete through
            # the ORM, which knows what hangs off a step.
            WorkflowStep.objects.filter(run__workflow=WORKFLOW).delete()
        cursor.execute(f"DELETE FROM {WorkflowRun._meta.db_table} WHERE id IN ({runs})", [WORKFLOW])
        cursor.execute(f"DELETE FROM {RawDelivery._meta.db_table}")
        if connection.vendor == "postgresql" and has_procrastinate():
            cursor.execute("TRUNCATE procrastinate_jobs CASCADE")


def enable_source() -> None:
    """The source switched on, with the secret stored as its only credential value."""
    from pikku_django.models import CredentialValue, TriggerSource
    from pikku_django.webhooks import credential_name, set_credential

    TriggerSource.objects.update_or_create(
        name=SOURCE, defaults={"kind": "webhook", "declared": True, "enabled": True}
    )
    name = credential_name(SOURCE)
    CredentialValue.objects.filter(credential=name).delete()
    set_credential(name, SECRET)


def forget_source() -> None:
    """Remove the source's row and credential (PostgreSQL: the database outlives the run)."""
    from pikku_django.models import CredentialValue, TriggerSource
    from pikku_django.webhooks import credential_name

    CredentialValue.objects.filter(credential=credential_name(SOURCE)).delete()
    TriggerSource.objects.filter(name=SOURCE).delete()


def statements_of(call: Callable[[], None]) -> list[str]:
    """The SQL one call runs (captured on a second call, so nothing is first-time)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    call()
    with CaptureQueriesContext(connection) as captured:
        call()
    return [q["sql"] for q in captured.captured_queries]


def check_rows(sent: dict[str, int]) -> dict[str, int]:
    """Every request left what its side stores, and nothing more."""
    from django.db import connection
    from django.db.models import Q
    from webhook_bench.models import RawDelivery

    from pikku_django.models import WebhookReceipt, WorkflowRun

    counts = {
        "receipts": WebhookReceipt.objects.filter(source=SOURCE).count(),
        "receipts_waiting_with_input": WebhookReceipt.objects.filter(
            Q(source=SOURCE) & Q(run_id__isnull=True, workflow=WORKFLOW, input__isnull=False)
        ).count(),
        "runs": WorkflowRun.objects.filter(workflow=WORKFLOW).count(),
        "raw_rows": RawDelivery.objects.count(),
        **{f"{side}_requests": n for side, n in sent.items()},
    }
    ok = (
        counts["receipts"] == counts["receipts_waiting_with_input"] == sent.get("pikku", 0)
        and counts["runs"] == 0
        and counts["raw_rows"] == sent.get("raw", 0) + sent.get("notify", 0) + sent.get("defer", 0)
    )
    if "defer" in sent:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")
            counts["procrastinate_jobs"] = cursor.fetchone()[0]
        ok = ok and counts["procrastinate_jobs"] == sent["defer"]
    if not ok:
        raise BenchError(f"the rows do not match the requests: {counts}")
    return counts


def run_clients(
    app: Callable[..., Any], side: str, body: bytes, clients: int, seconds: float, warmup: float
) -> tuple[int, float, int]:
    """``clients`` threads POST to ``side`` flat out: (timed requests, seconds, all sent).

    Each thread has its own Poster (and so its own delivery ids) and its own database
    connections, opened during the untimed warm-up and closed at the end."""
    from django.db import connections
    from webhook_bench.views import close_raw_connection

    counts, sent = [0] * clients, [0] * clients
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)
    stop = threading.Event()
    window = [float("inf"), float("inf")]

    def work(i: int) -> None:
        poster = Poster(app, PATHS[side], body)
        clock = time.perf_counter
        try:
            start.wait()
            while not stop.is_set():
                t0 = clock()
                poster()
                if window[0] <= t0 < window[1]:
                    counts[i] += 1
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:
            errors.append(exc)
            start.abort()
            stop.set()
        finally:
            sent[i] = poster.count
            connections.close_all()
            close_raw_connection()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    t0 = t1 = 0.0
    try:
        start.wait()
        time.sleep(warmup)
        t0 = time.perf_counter()
        window[:] = [t0, t0 + seconds]
        time.sleep(seconds)
        t1 = time.perf_counter()
    except threading.BrokenBarrierError:
        pass
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return sum(counts), max(0.0, min(t1, window[1]) - t0), sum(sent)


def cpu_per_request(
    app: Callable[..., Any], sides: list[str], body: bytes, requests: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Each side's CPU time a request, in microseconds, from one client in this thread
    (``time.thread_time``: the WSGI handler, the view and the driver, not the server's
    side nor the waits): ``requests`` timed after 50 untimed, ``rounds`` times, the
    sides in an order rotated each round. At 8 clients the process holds the GIL for
    about this long a request, so the intake's ceiling is about one second over it.
    Also how many requests each side sent."""
    from django.db import connections
    from webhook_bench.views import close_raw_connection

    out: dict[str, list[float]] = {side: [] for side in sides}
    sent = dict.fromkeys(sides, 0)
    try:
        for _, order in rotations(sides, rounds):
            for side in order:
                poster = Poster(app, PATHS[side], body)
                for _ in range(50):
                    poster()
                t0 = time.thread_time()
                for _ in range(requests):
                    poster()
                out[side].append((time.thread_time() - t0) / requests * 1e6)
                sent[side] += poster.count
    finally:
        connections.close_all()
        close_raw_connection()
    return out, sent


def time_starting_runs(seconds: float) -> dict[str, Any]:
    """The worker's side, for information: a worker thread starting the runs of the
    stored events (``start_waiting_runs``, batches of 100) for about ``seconds``; each
    run's receipt is then checked to be linked to it."""
    from pikku_django.models import WebhookReceipt, WorkflowRun
    from pikku_django.workflows.api import get_engine
    from pikku_django.workflows.worker.intake import start_waiting_runs

    engine = get_engine()
    linked = 0
    clock = time.perf_counter
    t0 = clock()
    while clock() - t0 < seconds:
        done = start_waiting_runs(engine, 100)
        if not done:
            break
        linked += done
    elapsed = clock() - t0
    runs = WorkflowRun.objects.filter(workflow=WORKFLOW).count()
    with_run = WebhookReceipt.objects.filter(source=SOURCE, run_id__isnull=False).count()
    if not runs == with_run == linked:
        raise BenchError(f"{linked} events given runs, but {runs} runs and {with_run} linked")
    log.info("worker: started %d runs in %.2f s", linked, elapsed)
    return {"runs_started": linked, "seconds": round(elapsed, 3)}


def profile_ours(ours: Poster, seconds: float) -> None:
    """Run the pikku side for ``seconds`` under cProfile; the top functions to stderr."""
    profiler = cProfile.Profile()
    n0 = ours.count
    profiler.enable()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        ours()
    profiler.disable()
    out = io.StringIO()
    out.write(f"cProfile of the pikku view, {ours.count - n0} requests\n")
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(25)
    sys.stderr.write(out.getvalue())


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="pikku-bench-webhooks-"))
    try:
        configure_django(backend, tmp / "webhooks.sqlite3")
        from django.core.handlers.wsgi import WSGIHandler
        from django.core.management import call_command
        from django.db import connection

        server = create_postgres_database() if backend == "postgres" else sqlite3.sqlite_version
        log.info("%s: migrating", backend)
        call_command("migrate", verbosity=0)
        if backend == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA journal_mode")
                mode = cursor.fetchone()[0]
            if mode.lower() != "wal":
                raise BenchError(f"the SQLite file is in {mode} mode, not WAL")
        settings_of = server_settings(backend, tmp / "webhooks.sqlite3")
        clear_rows()
        enable_source()

        from webhook_requests import push_body

        body = push_body(args.body_bytes)
        app = WSGIHandler()
        sides = ["raw", "pikku"]
        unavailable: dict[str, str] = {}
        if backend != "postgres":
            unavailable["notify"] = "SQLite has no NOTIFY"
            unavailable["defer"] = "Procrastinate runs on PostgreSQL only"
        elif not has_procrastinate():
            unavailable["defer"] = 'procrastinate is not installed (pip install -e ".[bench]")'
        else:
            sides.append("defer")
        if backend == "postgres":
            sides.insert(1, "notify")
        statements = {side: statements_of(Poster(app, PATHS[side], body)) for side in sides}
        # raw and notify run on a connection of their own, which Django does not see.
        from webhook_bench import views

        statements["raw"] = [views.PG_INSERT if backend == "postgres" else views.SQLITE_INSERT]
        if "notify" in statements:
            statements["notify"] = ["BEGIN", views.PG_INSERT, views.PG_NOTIFY, "COMMIT"]
        sent = {side: 2 for side in sides}  # statements_of posts twice
        for side in sides:
            log.info(
                "%s: %s runs %d SQL statements a request", backend, side, len(statements[side])
            )
        tallies: dict[str, dict[str, list[tuple[int, float]]]] = {}
        for clients in args.clients:
            tallies[str(clients)] = {side: [] for side in sides}
            for r, order in rotations(sides, args.rounds):
                for side in order:
                    n, elapsed, total = run_clients(
                        app, side, body, clients, args.seconds, args.warmup
                    )
                    sent[side] += total
                    tallies[str(clients)][side].append((n, elapsed))
                    log.info(
                        "%s: %d clients, round %d/%d, %-5s %7.0f req/s",
                        backend,
                        clients,
                        r + 1,
                        args.rounds,
                        side,
                        n / elapsed if elapsed else 0.0,
                    )
        log.info("%s: CPU a request, one client", backend)
        cpu, posted = cpu_per_request(app, sides, body, args.cpu_requests, args.rounds)
        sent = {side: sent[side] + posted[side] for side in sides}
        counts = check_rows(sent)
        if args.profile:
            profile_ours(Poster(app, PATHS["pikku"], body), args.seconds)
            counts = {**counts, "profiled": True}
        starting = time_starting_runs(max(args.seconds, 1.0))
        if backend == "postgres":
            clear_rows()
            forget_source()
        connection.close()
        return {
            "backend": backend,
            "server_version": server,
            "server_settings": settings_of,
            "tallies": tallies,
            "statements": statements,
            "unavailable": unavailable,
            "row_check": counts,
            "cpu_us_per_request": cpu,
            "starting_runs": starting,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def server_settings(backend: str, sqlite_path: Path) -> dict[str, str]:
    from benchlib import pg_server_settings, sqlite_settings

    if backend == "postgres":
        return pg_server_settings(POSTGRES_URL)
    return sqlite_settings(str(sqlite_path))


def child_main(args: argparse.Namespace) -> int:
    import json

    try:
        result = run_backend(args.child, args)
    except Unavailable as exc:
        result = {"backend": args.child, "skipped": str(exc)}
    print(json.dumps(result))
    return 0
