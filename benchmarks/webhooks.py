"""Webhook intake: signed POSTs per second through pikku_django's verifying view, next to
what a careful user would write by hand, from 1, 8 and 32 concurrent clients, on the same
in-process server and the same database; then the worker's cost of starting the runs.

Every request is a GitHub ``push`` delivery (the GitHub preset: ``X-Hub-Signature-256``,
an HMAC-SHA256 of the raw body) with a fresh ``X-GitHub-Delivery``, so every request
is a new event. The sides, per database:

* ``pikku``: ``/pikku/webhooks/bench-github/``, pikku_django's view for the source in
  ``benchmarks/webhook_bench/webhooks.py``: the source must be enabled, the secret
  comes from its stored (encrypted) credential, the signature is verified, and the
  event is stored as a ``WebhookReceipt`` holding the input of the run a worker is to
  start for it (on PostgreSQL one statement that also checks the source's switch and
  sends the workers' ``NOTIFY``).
* ``raw`` (the floor): a plain view that checks the signature with ``hmac`` +
  ``compare_digest`` and runs one prepared ``INSERT`` of the body under its unique
  delivery id, on a raw driver connection (psycopg ``prepare=True``; sqlite3).
* ``notify`` (PostgreSQL, for information): ``raw`` plus a ``pg_notify`` in the same
  transaction, as pikku's intake wakes its workers; PostgreSQL serialises the commits
  of notifying transactions, which caps this side as concurrency grows.
* ``defer`` (PostgreSQL, with Procrastinate installed): the same check, then in one
  transaction the row through the ORM and a Procrastinate ``defer`` through its Django
  integration (``procrastinate.contrib.django``), so the job commits with the row.

Each database runs in a child process of its own, driving one
``django.core.handlers.wsgi.WSGIHandler`` from ``--clients`` (1,8,32) threads, each with
its own database connections (``CONN_MAX_AGE=None``), no middleware. Every response is
checked (``200`` and ``{"received": 1}``), and afterwards every stored row: one receipt
waiting for its run per ``pikku`` request, one row per ``raw`` and ``defer`` request and
one waiting job per ``defer`` request. For each client count the sides run ``--rounds``
(5) slices each, in an order rotated by one place every round; each slice runs
``--warmup`` seconds untimed, then ``--seconds`` timed; the slices give each figure's
median and range. Then a worker thread starts the stored events' runs
(``start_waiting_runs``, batches of 100), and its runs per second are reported beside
the intake: an event costs its request plus its start.

Targets, at 8 clients: ``pikku`` >= 0.8x ``raw`` and >= 1.5x ``defer`` (medians).

Then, per side, the CPU time of this process a request from one client
(``time.thread_time`` over ``--cpu-requests`` requests, each round): the WSGI handler,
the view and the driver, without the server's side or the waits. With 8 clients the
process holds the GIL for about that long a request, so it bounds the intake.

Also measured, in this process: the GitHub verifier's ``verify(headers, body, secrets)``
alone, with one secret and with two where the second matches, next to ``hmac.new`` +
``compare_digest`` alone.

Databases: SQLite (a temporary file, WAL, ``transaction_mode`` IMMEDIATE, ``timeout``
20) and PostgreSQL (``PIKKU_BENCH_POSTGRES_URL``, default
postgres://postgres@127.0.0.1:5432/pikku_bench, created when missing; the rows this
benchmark writes there are deleted before and after).

Run it from the repository root:

    .venv/bin/python benchmarks/webhooks.py             # about 4 minutes
    .venv/bin/python benchmarks/webhooks.py --quick     # about 30 s, to check it runs

Options: ``--seconds 1``, ``--rounds 5``, ``--warmup 0.25``, ``--clients 1,8,32``,
``--cpu-requests 1000``,
``--backends sqlite,postgres``, ``--body-bytes 4096``, ``--verify-seconds 1``,
``--profile`` (afterwards, the pikku side under cProfile, to stderr). A database that
cannot be reached is reported as skipped. Progress goes to stderr; stdout gets the
tables and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import os
import platform
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from figures import Summary, ratio
from webhook_requests import RETIRED_SECRET, SECRET, BenchError, push_body, sign

log = logging.getLogger("pikku.bench.webhooks")

BACKENDS = ("sqlite", "postgres")
TITLES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
SIDES = ("raw", "notify", "pikku", "defer")
#: pikku / baseline at TARGET_CLIENTS clients.
TARGETS = {"raw": 0.8, "defer": 1.5}
TARGET_CLIENTS = 8


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


# --- the parent: children, table, JSON ----------------------------------------------------


def run_child(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        *(sys.executable, str(Path(__file__).resolve()), "--child", backend),
        *("--seconds", str(args.seconds), "--rounds", str(args.rounds)),
        *("--warmup", str(args.warmup), "--body-bytes", str(args.body_bytes)),
        *("--clients", ",".join(map(str, args.clients))),
        *("--cpu-requests", str(args.cpu_requests)),
    ]
    if args.profile:
        command.append("--profile")
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"backend": backend, "skipped": f"the child process failed (exit {done.returncode})"}
    return json.loads(lines[-1])


@dataclass
class BackendResult:
    raw: dict[str, Any]

    @property
    def backend(self) -> str:
        return str(self.raw["backend"])

    def summary(self, clients: int, side: str) -> Summary | None:
        slices = self.raw["tallies"].get(str(clients), {}).get(side)
        if not slices:
            return None
        return Summary.of([n / s if s else 0.0 for n, s in slices])

    def total_per_s(self, clients: int, side: str) -> float | None:
        slices = self.raw["tallies"].get(str(clients), {}).get(side)
        if not slices:
            return None
        seconds = sum(s for _, s in slices)
        return sum(n for n, _ in slices) / seconds if seconds else 0.0

    @property
    def runs_started_per_s(self) -> float:
        s = self.raw["starting_runs"]
        return s["runs_started"] / s["seconds"] if s["seconds"] else 0.0

    def cpu(self, side: str) -> Summary | None:
        values = self.raw["cpu_us_per_request"].get(side)
        return Summary.of(values) if values else None

    def ratios(self, clients: int) -> dict[str, float | None]:
        ours = self.summary(clients, "pikku")
        return {
            side: ratio(ours, self.summary(clients, side)) for side in ("raw", "notify", "defer")
        }

    def targets(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for side, target in TARGETS.items():
            value = self.ratios(TARGET_CLIENTS).get(side)
            out[f"pikku_vs_{side}_at_{TARGET_CLIENTS}_clients"] = {
                "ratio": None if value is None else round(value, 3),
                "target": target,
                "met": None if value is None else value >= target,
                "unavailable": self.raw["unavailable"].get(side),
            }
        return out

    def as_json(self, clients: list[int]) -> dict[str, Any]:
        figures: dict[str, Any] = {}
        for c in clients:
            figures[str(c)] = {
                side: {
                    "requests_per_s": self.summary(c, side).as_json(1),  # type: ignore[union-attr]
                    "requests_per_s_overall": round(self.total_per_s(c, side) or 0.0, 1),
                }
                for side in SIDES
                if self.summary(c, side) is not None
            }
            figures[str(c)]["ratios"] = {
                f"pikku_vs_{k}": None if v is None else round(v, 3)
                for k, v in self.ratios(c).items()
            }
        pikku_1 = self.summary(1, "pikku")
        start_us = 1e6 / self.runs_started_per_s if self.runs_started_per_s else None
        return {
            "backend": self.backend,
            "server_version": self.raw["server_version"],
            "server_settings": self.raw["server_settings"],
            "by_clients": figures,
            "unavailable": self.raw["unavailable"],
            "targets": self.targets(),
            "sql_statements_per_request": {k: len(v) for k, v in self.raw["statements"].items()},
            "sql_statements": {
                k: [q if len(q) <= 100 else q[:97] + "..." for q in v]
                for k, v in self.raw["statements"].items()
            },
            "row_check": self.raw["row_check"],
            "cpu_us_per_request_1_client": {
                side: self.cpu(side).as_json(1)  # type: ignore[union-attr]
                for side in SIDES
                if self.cpu(side) is not None
            },
            "worker_starting_runs": {
                **self.raw["starting_runs"],
                "runs_per_s": round(self.runs_started_per_s, 1),
                "us_per_event": None if start_us is None else round(start_us, 1),
                "intake_plus_start_us_per_event_1_client": None
                if pikku_1 is None or start_us is None or not pikku_1.median
                else round(1e6 / pikku_1.median + start_us, 1),
            },
        }


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
        "clients",
        *(f"{s} req/s" for s in SIDES),
        "pikku/raw",
        "pikku/notify",
        "pikku/defer",
    )
    rows = [header]
    for r in results:
        for c in args.clients:
            cells = [r.summary(c, side) for side in SIDES]
            ratios = r.ratios(c)
            rows.append(
                (
                    TITLES[r.backend],
                    str(c),
                    *(s.text(".0f") if s else "-" for s in cells),
                    *(
                        "-" if ratios[k] is None else f"{ratios[k]:.2f}"  # type: ignore[index]
                        for k in ("raw", "notify", "defer")
                    ),
                )
            )
    out = table(rows, right=set(range(1, len(header))))
    for name, reason in skipped.items():
        out.append(f"{TITLES[name]}: skipped, {reason}")
    for r in results:
        for side, why in r.raw["unavailable"].items():
            out.append(f"{TITLES[r.backend]}: no {side} side: {why}")
        start = r.as_json(args.clients)["worker_starting_runs"]
        both = start["intake_plus_start_us_per_event_1_client"]
        out.append(
            f"{TITLES[r.backend]}, then a worker thread starts the stored events' runs: "
            f"{start['runs_started']:,} in {start['seconds']:.2f} s, "
            f"{r.runs_started_per_s:,.0f} runs/s ({start['us_per_event'] or 0:,.0f} us an event;"
            f" intake + start at 1 client {both or 0:,.0f} us an event)"
        )
        cpu = {side: r.cpu(side) for side in SIDES if r.cpu(side) is not None}
        out.append(
            f"{TITLES[r.backend]}, CPU of this process a request (one client): "
            + ", ".join(f"{side} {c.text('.0f')} us" for side, c in cpu.items())
            + (f"; pikku/raw {ratio(cpu['pikku'], cpu['raw']):.2f}" if len(cpu) > 1 else "")
        )
        for name, t in r.targets().items():
            if t["ratio"] is None:
                continue
            verdict = (
                "met" if t["met"] else f"MISSED by {(1 - t['ratio'] / t['target']) * 100:.1f}%"
            )
            out.append(
                f"{TITLES[r.backend]} target {name} >= {t['target']:g}: {t['ratio']:.2f}, {verdict}"
            )
    out.append("")
    vrows = [(f"verification, GitHub preset, {body_size:,}-byte body", "us/request")]
    for f in verify:
        vrows.append((f.label, f"{f.us_per_call:.2f}"))
    out += table(vrows, right={1})
    out.append("")
    out.append(
        f"req/s: median (range) of {args.rounds} slices of {args.seconds:g} s after "
        f"{args.warmup:g} s warm-up, sides in an order rotated each round; one WSGIHandler "
        "in-process, a connection per client thread, no middleware"
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
    add = parser.add_argument
    add("--seconds", type=float, default=1.0, help="timed seconds per slice (default 1)")
    add("--warmup", type=float, default=0.25, help="untimed seconds before each slice (0.25)")
    add("--rounds", type=int, default=5, help="slices per side and client count (default 5)")
    add("--clients", default="1,8,32", help="concurrent client threads (default 1,8,32)")
    add("--backends", default=",".join(BACKENDS), help="sqlite,postgres (default: both)")
    add("--body-bytes", type=int, default=4096, help="size of the push payload (default 4096)")
    add("--verify-seconds", type=float, default=1.0, help="seconds per verification case (1)")
    add("--cpu-requests", type=int, default=1000, help="requests a round of the CPU figure")
    add("--profile", action="store_true", help="afterwards, cProfile the pikku side (stderr)")
    add("--quick", action="store_true", help="short slices, 2 rounds, 1 and 8 clients")
    add("--child", choices=BACKENDS, help=argparse.SUPPRESS)
    if parser.parse_known_args(argv)[0].quick:  # smaller defaults; options given still win
        parser.set_defaults(
            seconds=0.3, rounds=2, warmup=0.1, clients="1,8", verify_seconds=0.2, cpu_requests=100
        )
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backends {unknown}; choose from {', '.join(BACKENDS)}")
    try:
        args.clients = [int(c) for c in str(args.clients).split(",") if c.strip()]
    except ValueError:
        parser.error("--clients is a comma-separated list of integers")
    if not args.clients or min(args.clients) < 1:
        parser.error("--clients must be positive")
    if args.seconds <= 0 or args.warmup < 0 or args.rounds < 1 or args.verify_seconds <= 0:
        parser.error("--seconds and --verify-seconds must be > 0, --warmup >= 0, --rounds >= 1")
    if args.body_bytes < 1 or args.cpu_requests < 1:
        parser.error("--body-bytes and --cpu-requests must be >= 1")
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
        from webhook_intake import child_main

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
        results.append(BackendResult(raw))
    log.info("done in %.0f s", time.perf_counter() - began)

    print(format_tables(results, skipped, verify, args, len(body)))
    judged = [t for r in results for t in r.targets().values() if t["met"] is not None]
    all_met = all(t["met"] for t in judged) if judged else None
    print("targets: " + {None: "none measured", True: "all met", False: "some MISSED"}[all_met])
    report = {
        "benchmark": "pikku_django webhooks: signed POSTs per second from concurrent clients, "
        "pikku view vs a raw prepared insert and vs verify + insert + Procrastinate defer",
        "settings": {
            "seconds_per_slice": args.seconds,
            "warmup_seconds": args.warmup,
            "rounds": args.rounds,
            "clients": args.clients,
            "order": "sides rotated by one each round",
            "body_bytes": len(body),
            "verify_seconds": args.verify_seconds,
            "middleware": [],
            "conn_max_age": None,
            "targets": {f"pikku_vs_{k}_at_{TARGET_CLIENTS}_clients": v for k, v in TARGETS.items()},
            "quick": args.quick,
        },
        "machine": machine() | {"loadavg_start": load_start, "loadavg_end": load_average()},
        "skipped": skipped,
        "results": [r.as_json(args.clients) for r in results],
        "verify": [f.as_json() for f in verify],
        "all_targets_met": all_met,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
