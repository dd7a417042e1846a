"""Webhook intake: signed POSTs per second through pikku_django's verifying view, next to
a bare Django view, on the same in-process server and the same database.

Every request is a GitHub ``push`` delivery (the GitHub preset: ``X-Hub-Signature-256``,
an HMAC-SHA256 of the raw body) with a fresh ``X-GitHub-Delivery``, so every request
is a new event. The two sides, per database:

* ``pikku``: ``/pikku/webhooks/bench-github/``, pikku_django's view
  (``pikku_django.urls``) for the source in ``benchmarks/webhook_bench/webhooks.py``:
  the source is looked up and must be enabled, the secret comes from its stored
  (encrypted) credential, the signature is verified, ``receive`` takes the JSON body as
  the event's data (``ctx.body_event``: not parsed in Python; the statement that stores
  it checks it is JSON), and the event is stored as a ``WebhookReceipt`` holding the
  input of the ``WorkflowRun`` a worker is to start for it (``start_workflow_on``).
  On PostgreSQL the connection keeps the source's switch and secrets between
  requests (it LISTENs for changes), and the event is one statement that also checks
  them (the gate) and sends the workers' ``NOTIFY``. On SQLite the switch and
  secrets are read on every request, and the event is one ``INSERT``. No worker
  runs: every receipt is checked afterwards to be waiting for its run, input kept.
* ``bare``: ``/bench/bare/``, a plain Django view that stores the body and the
  delivery id with one ``INSERT`` (``RawDelivery``, a ``BinaryField``) and answers
  the same ``{"received": 1}``. No verification, no parsing.

Both are driven the same way: one ``django.core.handlers.wsgi.WSGIHandler``, called in
this process and this thread with a prepared WSGI environ (fresh ``wsgi.input``), the
response read and closed as a WSGI server would (so ``request_started`` /
``request_finished`` fire), through one URL resolver, with no middleware and a
persistent database connection (``CONN_MAX_AGE=None``). Every response is checked
(``200`` and ``{"received": 1}``), and afterwards the row counts: one receipt waiting
for its run per ``pikku`` request, one row per ``bare`` request.

Target: ``pikku`` answers at least 0.8 of the bare view's requests per second, on:

* SQLite: a temporary file, WAL, ``transaction_mode`` IMMEDIATE, ``timeout`` 20 (what
  the README asks for).
* PostgreSQL: the database ``pikku_bench`` (created when missing, migrated);
  ``PIKKU_BENCH_POSTGRES_URL`` (default postgres://postgres@127.0.0.1:5432/pikku_bench)
  points elsewhere. The rows this benchmark writes there (receipts, runs, its source and
  credential, its own table) are deleted before and after.

Each database's figures come from slices run in the order bare, pikku, pikku, bare,
``--rounds`` times over; each slice runs ``--warmup`` seconds untimed, then ``--seconds``
timed. Each database runs in a child process of its own (Django is configured once
per process); it also reports the SQL statements one request of each side runs.

Also measured, in this process: the GitHub verifier's ``verify(headers, body, secrets)``
alone, in microseconds per call, with the one right secret and with two rotation
secrets where the second matches, next to ``hmac.new`` + ``compare_digest`` alone.

Run it from the repository root:

    .venv/bin/python benchmarks/webhooks.py
    .venv/bin/python benchmarks/webhooks.py --backends postgres --seconds 1 --profile

Options: ``--seconds 2`` (timed per slice), ``--rounds 4``, ``--warmup 0.25``,
``--backends sqlite,postgres``, ``--body-bytes 4096`` (the push payload's size),
``--verify-seconds 1`` (per verification case), ``--profile`` (after the timed
slices, run the pikku side once more under cProfile and print where its time goes,
to stderr). A default run takes about 80 s. A database that cannot be reached is
reported as skipped. Progress goes to stderr; stdout gets the tables and, as its last
line, one JSON object with every figure and the machine, Python, Django and server
versions.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import hmac
import io
import json
import logging
import os
import platform
import pstats
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import dj_database_url

log = logging.getLogger("pikku.bench.webhooks")

BENCH_DIR = Path(__file__).resolve().parent
BACKENDS = ("sqlite", "postgres")
TITLES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
DEFAULT_POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/pikku_bench"
POSTGRES_URL = os.environ.get("PIKKU_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)

TARGET = 0.8
SOURCE = "bench-github"  # as declared in webhook_bench/webhooks.py
WORKFLOW = "webhook_bench.push"  # as declared in webhook_bench/workflows.py
SECRET = "bench-github-webhook-secret-8f3a91c2"  # noqa: S105 - a benchmark's fixed secret
RETIRED_SECRET = "bench-github-webhook-secret-retired-5d0e"  # noqa: S105
OURS_PATH = f"/pikku/webhooks/{SOURCE}/"
BARE_PATH = "/bench/bare/"
EXPECTED = b'{"received": 1}'
SIDES = ("bare", "pikku")


class BenchError(RuntimeError):
    """A request or a row count was not what the benchmark expects."""


# --- the request --------------------------------------------------------------------------


def push_body(size: int) -> bytes:
    """A compact GitHub ``push`` payload of at least ``size`` bytes (commits pad it)."""
    sha = "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"
    event: dict[str, Any] = {
        "ref": "refs/heads/main",
        "before": sha,
        "after": sha[::-1],
        "created": False,
        "deleted": False,
        "forced": False,
        "compare": "https://github.com/pikku/bench/compare/9f8e7d6c5b4a...234567890a1b",
        "repository": {
            "id": 123456789,
            "name": "bench",
            "full_name": "pikku/bench",
            "private": False,
            "html_url": "https://github.com/pikku/bench",
            "default_branch": "main",
        },
        "pusher": {"name": "bench", "email": "bench@example.com"},
        "sender": {"login": "bench", "id": 42, "type": "User"},
        "commits": [],
    }
    while len(compact(event)) < size:
        i = len(event["commits"])
        event["commits"].append(
            {
                "id": f"{i:040x}",
                "message": f"Commit number {i} of the benchmark push",
                "timestamp": "2026-01-01T12:00:00Z",
                "author": {"name": "Bench", "email": "bench@example.com"},
                "added": [],
                "removed": [],
                "modified": [f"src/module_{i}.py"],
            }
        )
    return compact(event)


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Poster:
    """POSTs the signed body to ``path`` through a WSGI application, one new delivery id
    per call, and checks the answer; ``count`` says how many it has sent."""

    def __init__(self, app: Callable[..., Any], path: str, body: bytes) -> None:
        self.app = app
        self.body = body
        # GitHub's delivery ids are UUIDs: a random prefix, then the counter.
        self.prefix = str(uuid.uuid4())[:24]
        self.count = 0
        self.status = ""
        self.base = {
            "REQUEST_METHOD": "POST",
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": "",
            "SERVER_NAME": "testserver",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "testserver",
            "HTTP_USER_AGENT": "GitHub-Hookshot/pikku-bench",
            "HTTP_ACCEPT": "*/*",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_X_GITHUB_EVENT": "push",
            "HTTP_X_GITHUB_HOOK_ID": "123456",
            "HTTP_X_HUB_SIGNATURE_256": sign(body),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }

    def _start_response(self, status: str, headers: Any, exc_info: Any = None) -> None:
        self.status = status

    def __call__(self) -> None:
        self.count += 1
        environ = self.base.copy()
        environ["wsgi.input"] = io.BytesIO(self.body)
        environ["HTTP_X_GITHUB_DELIVERY"] = f"{self.prefix}{self.count:012d}"
        response = self.app(environ, self._start_response)
        try:
            content = b"".join(response)
        finally:
            response.close()
        if self.status != "200 OK" or content != EXPECTED:
            raise BenchError(f"{self.base['PATH_INFO']} answered {self.status}: {content[:300]!r}")


def run_slice(call: Callable[[], None], seconds: float, warmup: float) -> tuple[int, float]:
    """``warmup`` seconds of untimed calls, then calls for ``seconds``: (calls, elapsed)."""
    clock = time.perf_counter
    end = clock() + warmup
    while clock() < end:
        call()
    n = 0
    t0 = clock()
    end = t0 + seconds
    now = t0
    while now < end:
        call()
        n += 1
        now = clock()
    return n, now - t0


# --- verification alone (this process) ----------------------------------------------------


@dataclass
class VerifyFigure:
    key: str
    label: str
    calls: int
    seconds: float
    info: bool = False

    @property
    def us_per_call(self) -> float:
        return self.seconds / self.calls * 1e6 if self.calls else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "case": self.key,
            "label": self.label,
            "us_per_call": round(self.us_per_call, 3),
            "calls": self.calls,
            "seconds": round(self.seconds, 3),
            "info_only": self.info,
        }


def time_calls(fn: Callable[[], Any], seconds: float) -> tuple[int, float]:
    """Call ``fn`` in batches of 500 for about ``seconds``: (calls, elapsed)."""
    for _ in range(500):
        fn()
    clock = time.perf_counter
    calls = 0
    t0 = clock()
    end = t0 + seconds
    now = t0
    while now < end:
        for _ in range(500):
            fn()
        calls += 500
        now = clock()
    return calls, now - t0


def bench_verify(body: bytes, seconds: float) -> list[VerifyFigure]:
    """The GitHub verifier on one signed request, with one secret and with two."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(SECRET_KEY="pikku-bench-not-secret", USE_TZ=True)  # noqa: S106
    from pikku_django.webhooks.presets import GitHub

    verifier = GitHub()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": sign(body),
    }
    one = [SECRET]
    two = [RETIRED_SECRET, SECRET]
    if verifier.verify(headers, body, one).secret_index != 0:
        raise BenchError("the one secret did not match")
    if verifier.verify(headers, body, two).secret_index != 1:
        raise BenchError("the second of two secrets did not match")
    key = SECRET.encode()
    signature = bytes.fromhex(headers["X-Hub-Signature-256"].removeprefix("sha256="))

    def floor() -> bool:
        return hmac.compare_digest(hmac.new(key, body, hashlib.sha256).digest(), signature)

    cases = [
        ("one_secret", "GitHub().verify, 1 secret", lambda: verifier.verify(headers, body, one)),
        (
            "two_secrets_second_matches",
            "GitHub().verify, 2 secrets, the 2nd matches",
            lambda: verifier.verify(headers, body, two),
        ),
        ("hmac_floor", "hmac.new + compare_digest alone (floor)", floor),
    ]
    figures = []
    for key_, label, fn in cases:
        log.info("verify: %s", label)
        calls, elapsed = time_calls(fn, seconds)
        figures.append(VerifyFigure(key_, label, calls, elapsed, info=key_ == "hmac_floor"))
    return figures


# --- one database, in a child process -----------------------------------------------------


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
    database["CONN_MAX_AGE"] = None  # one connection for the whole run, as a pool would keep
    sys.path.insert(0, str(BENCH_DIR))
    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        SECRET_KEY="pikku-bench-not-secret",  # noqa: S106
        INSTALLED_APPS=["pikku_django", "webhook_bench"],
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


def check_rows(ours: Poster, bare: Poster) -> dict[str, int]:
    from django.db.models import Q
    from webhook_bench.models import RawDelivery

    from pikku_django.models import WebhookReceipt, WorkflowRun

    counts = {
        "receipts": WebhookReceipt.objects.filter(source=SOURCE).count(),
        "receipts_waiting_with_input": WebhookReceipt.objects.filter(
            Q(source=SOURCE) & Q(run_id__isnull=True, workflow=WORKFLOW, input__isnull=False)
        ).count(),
        "runs": WorkflowRun.objects.filter(workflow=WORKFLOW).count(),
        "bare_rows": RawDelivery.objects.count(),
        "pikku_requests": ours.count,
        "bare_requests": bare.count,
    }
    if not (
        counts["receipts"] == counts["receipts_waiting_with_input"] == ours.count
        and counts["runs"] == 0
        and counts["bare_rows"] == bare.count
    ):
        raise BenchError(f"the rows do not match the requests: {counts}")
    return counts


def time_starting_runs(seconds: float) -> dict[str, Any]:
    """The worker's side, for information: a worker thread starting the runs of the
    stored events (``start_waiting_runs``, batches of 100) for about ``seconds``; each
    run's receipt is then checked to be linked to it."""
    from pikku_django.models import WebhookReceipt, WorkflowRun
    from pikku_django.workflows.api import get_engine

    engine = get_engine()
    linked = 0
    clock = time.perf_counter
    t0 = clock()
    while clock() - t0 < seconds:
        done = engine.start_waiting_runs(100)
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
        clear_rows()
        enable_source()

        body = push_body(args.body_bytes)
        app = WSGIHandler()
        ours = Poster(app, OURS_PATH, body)
        bare = Poster(app, BARE_PATH, body)
        statements = {"pikku": statements_of(ours), "bare": statements_of(bare)}
        for side in SIDES:
            count = len(statements[side])
            log.info("%s: %s runs %d SQL statements a request:", backend, side, count)
            for sql in statements[side]:
                log.info("    %s", sql if len(sql) <= 110 else sql[:107] + "...")

        tallies: dict[str, list[tuple[int, float]]] = {"bare": [], "pikku": []}
        posters = {"bare": bare, "pikku": ours}
        order = ("bare", "pikku", "pikku", "bare") * args.rounds
        for i, side in enumerate(order, 1):
            n, elapsed = run_slice(posters[side], args.seconds, args.warmup)
            tallies[side].append((n, elapsed))
            log.info("%s: slice %d/%d %-5s %7.0f req/s", backend, i, len(order), side, n / elapsed)
        counts = check_rows(ours, bare)
        if args.profile:
            profile_ours(ours, args.seconds)
        starting = time_starting_runs(args.seconds)
        if backend == "postgres":
            clear_rows()
            forget_source()
        connection.close()
        return {
            "backend": backend,
            "server_version": server,
            "tallies": tallies,
            "statements": statements,
            "row_check": counts,
            "starting_runs": starting,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def child_main(args: argparse.Namespace) -> int:
    try:
        result = run_backend(args.child, args)
    except Unavailable as exc:
        result = {"backend": args.child, "skipped": str(exc)}
    print(json.dumps(result))
    return 0


# --- the parent: children, table, JSON ----------------------------------------------------


@dataclass
class Side:
    requests: int = 0
    seconds: float = 0.0
    slices: list[float] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def us_per_request(self) -> float:
        return self.seconds / self.requests * 1e6 if self.requests else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "requests_per_s": round(self.per_s, 1),
            "us_per_request": round(self.us_per_request, 1),
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "slices_requests_per_s": [round(s, 1) for s in self.slices],
        }


@dataclass
class BackendResult:
    backend: str
    server_version: str
    bare: Side
    pikku: Side
    statements: dict[str, list[str]]
    row_check: dict[str, int]
    starting_runs: dict[str, Any]

    @property
    def runs_started_per_s(self) -> float:
        seconds = self.starting_runs["seconds"]
        return self.starting_runs["runs_started"] / seconds if seconds else 0.0

    @property
    def ratio(self) -> float:
        return self.pikku.per_s / self.bare.per_s if self.bare.per_s else 0.0

    @property
    def met(self) -> bool:
        return self.ratio >= TARGET

    def as_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "server_version": self.server_version,
            "bare": self.bare.as_json(),
            "pikku": self.pikku.as_json(),
            "ratio": round(self.ratio, 3),
            "target": TARGET,
            "met": self.met,
            "sql_statements_per_request": {k: len(v) for k, v in self.statements.items()},
            "sql_statements": {
                k: [q if len(q) <= 100 else q[:97] + "..." for q in v]
                for k, v in self.statements.items()
            },
            "row_check": self.row_check,
            "worker_starting_runs": {
                **self.starting_runs,
                "runs_per_s": round(self.runs_started_per_s, 1),
                "info_only": True,
            },
        }


def run_child(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        backend,
        "--seconds",
        str(args.seconds),
        "--rounds",
        str(args.rounds),
        "--warmup",
        str(args.warmup),
        "--body-bytes",
        str(args.body_bytes),
    ]
    if args.profile:
        command.append("--profile")
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"backend": backend, "skipped": f"the child process failed (exit {done.returncode})"}
    return json.loads(lines[-1])


def as_result(raw: dict[str, Any]) -> BackendResult:
    sides = {}
    for side in SIDES:
        s = Side()
        for n, elapsed in raw["tallies"][side]:
            s.requests += n
            s.seconds += elapsed
            s.slices.append(n / elapsed if elapsed else 0.0)
        sides[side] = s
    return BackendResult(
        backend=raw["backend"],
        server_version=raw["server_version"],
        bare=sides["bare"],
        pikku=sides["pikku"],
        statements=raw["statements"],
        row_check=raw["row_check"],
        starting_runs=raw["starting_runs"],
    )


def machine() -> dict[str, Any]:
    import django

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "django": django.get_version(),
    }
    for dist in ("pikku-django", "psycopg", "cryptography"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    info["sqlite3_library"] = sqlite3.sqlite_version
    return info


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: other work on the machine shows here."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return platform.processor() or None
    return platform.processor() or None


def format_tables(
    results: list[BackendResult],
    skipped: dict[str, str],
    verify: list[VerifyFigure],
    args: argparse.Namespace,
    body_size: int,
) -> str:
    header = (
        "database",
        "bare req/s",
        "pikku req/s",
        "bare µs/req",
        "pikku µs/req",
        "ratio",
        "target",
        "met",
        "SQL/req bare, pikku",
    )
    rows = [header]
    for r in results:
        rows.append(
            (
                TITLES[r.backend],
                f"{r.bare.per_s:,.0f}",
                f"{r.pikku.per_s:,.0f}",
                f"{r.bare.us_per_request:,.0f}",
                f"{r.pikku.us_per_request:,.0f}",
                f"{r.ratio:.2f}",
                f">= {TARGET:.1f}",
                "yes" if r.met else "NO",
                f"{len(r.statements['bare'])}, {len(r.statements['pikku'])}",
            )
        )
    out = table(rows, right={1, 2, 3, 4, 5})
    for name, reason in skipped.items():
        out.append(f"{TITLES[name]}: skipped, {reason}")
    for r in results:
        out.append(
            f"{TITLES[r.backend]}, then a worker thread starts the stored events' runs "
            f"[info]: {r.starting_runs['runs_started']:,} in {r.starting_runs['seconds']:.2f} s, "
            f"{r.runs_started_per_s:,.0f} runs/s"
        )
    out.append("")
    vrows = [(f"verification, GitHub preset, {body_size:,}-byte body", "µs/request")]
    for f in verify:
        vrows.append((f.label + (" [info]" if f.info else ""), f"{f.us_per_call:.2f}"))
    out += table(vrows, right={1})
    out.append("")
    out.append(
        f"each request: signed POST, new X-GitHub-Delivery, {body_size:,}-byte push body; "
        "pikku: verify, receipt stored with its run's input; bare: one INSERT"
    )
    out.append(
        "same WSGIHandler in-process, 1 thread, no middleware, persistent connection; "
        f"slices bare, pikku, pikku, bare x {args.rounds}, each {args.warmup:g} s warm-up "
        f"+ {args.seconds:g} s timed"
    )
    return "\n".join(out)


def table(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    return [line(rows[0]), "  ".join("-" * w for w in widths), *(line(r) for r in rows[1:])]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="timed seconds per slice (default 2)"
    )
    parser.add_argument(
        "--warmup", type=float, default=0.25, help="untimed seconds before each slice (0.25)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="times the bare, pikku, pikku, bare slices repeat (default 4)",
    )
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help=f"comma-separated, from {','.join(BACKENDS)} (default: both)",
    )
    parser.add_argument(
        "--body-bytes", type=int, default=4096, help="size of the push payload (default 4096)"
    )
    parser.add_argument(
        "--verify-seconds",
        type=float,
        default=1.0,
        help="seconds per verification case (default 1)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, profile the pikku side for --seconds (cProfile, to stderr)",
    )
    parser.add_argument("--child", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backends {unknown}; choose from {', '.join(BACKENDS)}")
    if args.seconds <= 0 or args.warmup < 0 or args.rounds < 1 or args.verify_seconds <= 0:
        parser.error("--seconds and --verify-seconds must be > 0, --warmup >= 0, --rounds >= 1")
    if args.body_bytes < 1:
        parser.error("--body-bytes must be >= 1")
    return args


def setup_logging() -> None:
    # Only this script's logger: pikku_django's own INFO lines stay off, as by default.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[bench] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    if args.child:
        return child_main(args)

    began = time.perf_counter()
    load_start = load_average()
    body = push_body(args.body_bytes)
    verify = bench_verify(body, args.verify_seconds)
    results: list[BackendResult] = []
    skipped: dict[str, str] = {}
    for backend in args.backends:
        log.info("%s: starting", backend)
        raw = run_child(backend, args)
        if "skipped" in raw:
            skipped[backend] = raw["skipped"]
            log.warning("%s: skipped: %s", backend, raw["skipped"])
            continue
        result = as_result(raw)
        log.info(
            "%s: bare %.0f req/s, pikku %.0f req/s, ratio %.2f",
            backend,
            result.bare.per_s,
            result.pikku.per_s,
            result.ratio,
        )
        results.append(result)
    log.info("done in %.0f s", time.perf_counter() - began)

    print(format_tables(results, skipped, verify, args, len(body)))
    missed = [TITLES[r.backend] for r in results if not r.met]
    all_met = (not missed) if results else None
    if all_met is None:
        print("targets: none measured")
    else:
        print("targets: " + ("all met" if all_met else "MISSED: " + ", ".join(missed)))
    report = {
        "benchmark": "pikku_django webhooks: signed POSTs per second, pikku view vs bare view",
        "settings": {
            "seconds_per_slice": args.seconds,
            "warmup_seconds": args.warmup,
            "rounds": args.rounds,
            "slice_order": ["bare", "pikku", "pikku", "bare"],
            "body_bytes": len(body),
            "verify_seconds": args.verify_seconds,
            "threads": 1,
            "middleware": [],
            "conn_max_age": None,
            "target": TARGET,
        },
        "machine": machine() | {"loadavg_start": load_start, "loadavg_end": load_average()},
        "servers": {r.backend: r.server_version for r in results},
        "skipped": skipped,
        "results": [r.as_json() for r in results],
        "verify": [f.as_json() for f in verify],
        "all_targets_met": all_met,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
