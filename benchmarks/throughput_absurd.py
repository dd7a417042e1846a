"""django-absurd, a peer of ``benchmarks/throughput.py``, in processes of a Python >= 3.12
with Django >= 6.0 (which django-absurd needs), installed as for PgQueuer
(``throughput_pgqueuer.py``) with ``pip install "django-absurd>=1.0"`` in the same
interpreter.

A minimal Django project of its own (``django_absurd`` in INSTALLED_APPS, its
``AbsurdBackend`` as the ``django.tasks`` backend, psycopg 3) on
``PIKKU_BENCH_ABSURD_URL``, with two tasks: ``bench_noop`` (one step's worth: a task
with no step) and ``bench_steps`` (``steps`` no-op ``context.step`` calls: the peer of
a pikku run of that many steps). The worker is ``manage.py absurd_worker
--concurrency N`` with its documented defaults (``--batch-size`` = concurrency,
``--poll-interval`` 0.25 s: Absurd polls, it has no LISTEN/NOTIFY).

- ``worker --concurrency N``: that worker.
- ``client``: stdin commands, one JSON line each: ``batch KIND UNITS STEPS`` enqueues
  UNITS tasks (``django.tasks`` has no bulk enqueue: one ``enqueue`` call each, in one
  transaction); prints the tasks' ids, the first call's and the commit's epoch times,
  and the client's CPU in µs a unit.
- ``migrate``: installs the Absurd schema and the default queue.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

URL = os.environ.get(
    "PIKKU_BENCH_ABSURD_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_absurd"
)


def configure() -> None:
    from django.conf import settings

    if settings.configured:
        return
    url = urlsplit(URL)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": url.path.lstrip("/"),
                "USER": url.username or "postgres",
                "PASSWORD": url.password or "",
                "HOST": url.hostname or "127.0.0.1",
                "PORT": str(url.port or 5432),
            }
        },
        INSTALLED_APPS=["django_absurd"],
        TASKS={"default": {"BACKEND": "django_absurd.backends.AbsurdBackend"}},
        USE_TZ=True,
        LOGGING_CONFIG=None,
    )
    import django

    django.setup()


configure()

from django.tasks import task  # noqa: E402 (after settings)


@task
def bench_noop() -> None:
    return None


def _noop() -> None:
    return None


@task
def bench_steps(steps: int) -> int:
    from django_absurd import get_absurd_context

    context = get_absurd_context()
    for i in range(steps):
        context.step(f"s{i}", _noop)
    return steps


def client() -> None:
    from django.db import transaction

    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        kind, units, steps = words[1], int(words[2]), int(words[3])
        began = time.time()
        cpu = time.thread_time()
        with transaction.atomic():
            if kind == "chain":
                ids = [bench_steps.enqueue(steps).id for _ in range(units)]
            else:
                ids = [bench_noop.enqueue().id for _ in range(units)]
        out: dict[str, Any] = {
            "ids": [str(i) for i in ids],
            "began": began,
            "committed": time.time(),
            "store_us": (time.thread_time() - cpu) * 1e6 / units,
        }
        print(json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from django.core.management import call_command

    parser = argparse.ArgumentParser(description="A django-absurd process of throughput.py")
    parser.add_argument("command", choices=("worker", "client", "migrate"))
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    if args.command == "worker":
        call_command("absurd_worker", concurrency=args.concurrency)
    elif args.command == "client":
        client()
    else:
        call_command("migrate", verbosity=0)
    return 0


if __name__ == "__main__":
    # The tasks must live in an importable module, not __main__, for the worker.
    import throughput_absurd

    sys.exit(throughput_absurd.main())
