"""Lease throughput: pikku_django's lease backends against baselines on the same server.

For each backend (SQLite, PostgreSQL, MariaDB, Redis, and the in-memory one for
information) it measures, in three cases (1 client; 8 clients on 1 key; 8 clients
on 8 keys), *acquisitions per second* (won acquisitions, each released) with the
latency of a won acquire+release, and apart from them the failed attempts (the key
held by another client) with their own rate and latency.

Each figure stands next to baselines measured in the same run, on the same server,
doing the same job with nothing of ours in the way (``lease_baselines.py``):

* SQLite, PostgreSQL, MariaDB: a raw driver connection running one conditional
  upsert and one releasing ``UPDATE``, two statements a pair, as ours;
* PostgreSQL also: ``pg_try_advisory_lock`` / ``pg_advisory_unlock`` (no lease, no
  fencing token, nothing written: the floor of "a lock in PostgreSQL");
* Redis: redis-py's own ``Lock`` and python-redis-lock's ``Lock``.

The ratio is ours / baseline, in acquisitions per second. Targets: a database backend
makes at least 0.8 of its raw upsert's, Redis at least 1.0 of redis-py's Lock; the
other baselines are for information.

Each figure is ``--seconds`` of timed work per side, cut into ``--rounds`` (5) slices;
each round runs one slice of every side, in an order rotated by one place each round,
and the slices' acquisitions per second give the median and range printed. Every slice
starts its threads afresh and runs a short untimed warm-up first.

Run it with ``make bench`` (``.venv/bin/python benchmarks/leases.py``). Options:
``--seconds 2`` timed per figure and side, ``--backends sqlite,postgres,mariadb,redis,memory``
(any subset), ``--rounds 5``, ``--warmup 0.1``, ``--quick`` (0.5 s in 2 rounds). The
default run takes about 2 minutes.
It needs no settings module: it configures Django itself, creates the scratch
databases ``pikku_bench`` on PostgreSQL and MariaDB when missing, migrates
pikku_django into them, and uses a temporary SQLite file in WAL mode. The
services default to the local ones; point it elsewhere with

    PIKKU_BENCH_POSTGRES_URL  default postgres://postgres@127.0.0.1:5432/pikku_bench
    PIKKU_BENCH_MARIADB_URL   default mysql://root@127.0.0.1:3306/pikku_bench
    PIKKU_BENCH_REDIS_URL     default redis://127.0.0.1:6379/15

A service that cannot be reached is reported as skipped. Progress goes to
stderr; stdout gets the table and, as its last line, one JSON object with every
figure and the machine, Python, Django and server versions.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from figures import Summary, percentile, rotations
from lease_backends import (
    BACKEND_CLASSES,
    BACKENDS,
    DATABASE_TARGET,
    REDIS_TARGET,
    Backend,
    Unavailable,
    configure_django,
    server_settings,
    versions,
)
from lease_baselines import TTL_MS, Client

log = logging.getLogger("pikku.bench")
log = logging.getLogger("pikku.bench")

THREADS = 8

# --- measurement ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """``threads`` clients; ``shared_key`` puts them all on one key, else one key each."""

    label: str
    threads: int
    shared_key: bool

    def key(self, i: int) -> str:
        if self.threads == 1:
            return "bench-single"
        return "bench-shared" if self.shared_key else f"bench-{i}"


# What each figure measures, for ours and every baseline alike:
# * acquired/s: acquisitions that won (each then released), per second, summed over
#   the threads; the ratio compares these. latency: the time of one won pair, an
#   acquire and its release (two statements, or two Redis calls).
# * failed/s and their latency, apart: attempts that found the key held by another
#   client (one statement or call; on a database, often a wait for the row lock of
#   the winner's upsert). Only the 1-key case has them.
# Cases: 1 client (one thread, one key: the latency of a pair); 8 clients on 1 key
# (a crowd on a busy key); 8 clients on 8 keys (a key each: throughput with no
# contention, bound by the server, the client's CPU and the GIL).
CASES = (
    Case("1 client", 1, shared_key=False),
    Case(f"{THREADS} clients, 1 key", THREADS, shared_key=True),
    Case(f"{THREADS} clients, {THREADS} keys", THREADS, shared_key=False),
)

#: Per-slice samples of won-pair latency kept per thread (enough for a p95).
LATENCY_SAMPLES = 2_000


@dataclass
class Tally:
    """Won and failed attempts over the timed seconds of one or more slices, with
    samples of their latencies (seconds) and each slice's acquisitions per second."""

    won: int = 0
    failed: int = 0
    seconds: float = 0.0
    won_latency: list[float] = field(default_factory=list)
    failed_latency: list[float] = field(default_factory=list)
    slices: list[float] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.won += other.won
        self.failed += other.failed
        self.seconds += other.seconds
        self.won_latency += other.won_latency
        self.failed_latency += other.failed_latency
        self.slices.append(other.won / other.seconds if other.seconds else 0.0)

    @property
    def acquired_per_s(self) -> float:
        return self.won / self.seconds if self.seconds else 0.0

    @property
    def failed_per_s(self) -> float:
        return self.failed / self.seconds if self.seconds else 0.0

    def as_json(self) -> dict[str, Any]:
        def lat(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            return {
                "p50_us": round(percentile(values, 50) * 1e6, 1),
                "p95_us": round(percentile(values, 95) * 1e6, 1),
                "samples": len(values),
            }

        return {
            "acquired_per_s": round(self.acquired_per_s, 1),
            "acquired_per_s_by_slice": Summary.of(self.slices).as_json(1) if self.slices else None,
            "acquired": self.won,
            "acquire_release_latency": lat(self.won_latency),
            "failed_attempts_per_s": round(self.failed_per_s, 1),
            "failed_attempts": self.failed,
            "failed_attempt_latency": lat(self.failed_latency),
            "seconds": round(self.seconds, 3),
        }


def run_segment(
    make_client: Callable[[str, str], Client], case: Case, seconds: float, warmup: float
) -> Tally:
    """Run ``case.threads`` clients flat out; count the attempts of the timed ``seconds``.

    Every thread builds its client (and, for a baseline, opens its connection)
    before the start line, then loops ``pair()`` until told to stop, timing each
    call. The clock starts after ``warmup``: only calls that start inside the timed
    window count, so thread start-up, connecting and the first (cold) calls never do.
    """
    n = case.threads
    won, failed = [0] * n, [0] * n
    won_lat: list[list[float]] = [[] for _ in range(n)]
    failed_lat: list[list[float]] = [[] for _ in range(n)]
    errors: list[BaseException] = []
    start = threading.Barrier(n + 1)
    stop = threading.Event()
    window = [float("inf"), float("inf")]  # the timed window's start and end

    def work(i: int) -> None:
        client = None
        clock = time.perf_counter
        try:
            client = make_client(case.key(i), f"holder-{i}")
            start.wait()
            pair = client.pair
            while not stop.is_set():
                t0 = clock()
                ok = pair()
                t1 = clock()
                if not window[0] <= t0 < window[1]:
                    continue
                if ok:
                    won[i] += 1
                    if len(won_lat[i]) < LATENCY_SAMPLES:
                        won_lat[i].append(t1 - t0)
                else:
                    failed[i] += 1
                    if len(failed_lat[i]) < LATENCY_SAMPLES:
                        failed_lat[i].append(t1 - t0)
        except threading.BrokenBarrierError:
            return  # another client failed and aborted the start; its error is recorded
        except BaseException as exc:
            errors.append(exc)
            start.abort()
        finally:
            if client is not None:
                client.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
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
    return Tally(
        won=sum(won),
        failed=sum(failed),
        seconds=max(0.0, min(t1, window[1]) - t0),
        won_latency=[x for lat in won_lat for x in lat],
        failed_latency=[x for lat in failed_lat for x in lat],
    )


@dataclass
class Result:
    backend: Backend
    case: Case
    ours: Tally
    baselines: dict[str, Tally]
    unavailable: dict[str, str]

    @property
    def ratio(self) -> float | None:
        """Ours / the first baseline, in acquisitions per second."""
        if not self.backend.baseline_names:
            return None
        first = self.baselines.get(self.backend.baseline_names[0])
        if first is None or not first.acquired_per_s:
            return None
        return self.ours.acquired_per_s / first.acquired_per_s

    def ratios(self) -> dict[str, float | None]:
        return {
            name: round(self.ours.acquired_per_s / t.acquired_per_s, 3)
            if t.acquired_per_s
            else None
            for name, t in self.baselines.items()
        }

    @property
    def met(self) -> bool | None:
        if self.ratio is None or self.backend.target is None:
            return None
        return self.ratio >= self.backend.target

    def as_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend.name,
            "case": self.case.label,
            "threads": self.case.threads,
            "distinct_keys": 1 if self.case.shared_key else self.case.threads,
            "ours": self.ours.as_json(),
            "baselines": {name: t.as_json() for name, t in self.baselines.items()},
            "baselines_unavailable": self.unavailable,
            "target_baseline": self.backend.baseline_names[0]
            if self.backend.baseline_names
            else None,
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "ratios": self.ratios(),
            "target": self.backend.target,
            "met": self.met,
        }


def run_case(backend: Backend, case: Case, seconds: float, warmup: float, rounds: int) -> Result:
    """Ours and every baseline on one case, ``seconds`` each, in interleaved slices.

    Each of ``rounds`` rounds runs one slice of every side, in an order rotated by
    one place from the round before, so each side gets ``seconds`` in all and any
    drift in the server's speed lands on every side alike.
    """
    backend.reset()
    unavailable = {
        name: why for name in backend.baseline_names if (why := backend.unavailable_baseline(name))
    }
    sides: dict[str, Callable[[str, str], Client]] = {"ours": backend.ours}
    for name in backend.baseline_names:
        if name not in unavailable:
            sides[name] = backend.baseline(name)
    tallies = {name: Tally() for name in sides}
    piece = seconds / rounds
    for _, order in rotations(list(sides), rounds):
        for name in order:
            tallies[name].add(run_segment(sides[name], case, piece, warmup))
    held = backend.still_held()
    if held:
        log.warning("%s / %s: %d leases still held afterwards", backend.name, case.label, held)
    backend.reset()
    ours = tallies.pop("ours")
    return Result(backend, case, ours, tallies, unavailable)


# --- setup and report ----------------------------------------------------------------------


def verdict(r: Result) -> str:
    if r.backend.target is None or r.met is None:
        return "info"
    return f">= {r.backend.target:.1f} " + ("met" if r.met else "MISSED")


def format_table(results: list[Result], skipped: dict[str, str]) -> str:
    from benchlib import format_table as table

    header = (
        "backend",
        "case",
        "side",
        "acquired/s median (range)",
        "won p50 / p95 us",
        "failed/s",
        "failed p50 us",
        "ratio",
        "target",
    )
    rows = []
    for r in results:
        ratios = r.ratios()
        for name, tally in [("pikku_django", r.ours), *r.baselines.items()]:
            j = tally.as_json()
            by = j["acquired_per_s_by_slice"]
            won, lost = j["acquire_release_latency"], j["failed_attempt_latency"]
            ours = name == "pikku_django"
            first = bool(r.backend.baseline_names) and name == r.backend.baseline_names[0]
            rows.append(
                (
                    r.backend.title if ours else "",
                    r.case.label if ours else "",
                    name,
                    f"{tally.acquired_per_s:,.0f}"
                    + (f" ({by['min']:,.0f}-{by['max']:,.0f})" if by else ""),
                    f"{won['p50_us']:,.0f} / {won['p95_us']:,.0f}" if won else "-",
                    f"{tally.failed_per_s:,.0f}" if tally.failed else "-",
                    f"{lost['p50_us']:,.0f}" if lost else "-",
                    "" if ours else ("-" if ratios[name] is None else f"{ratios[name]:.2f}"),
                    verdict(r) if first else "",
                )
            )
        for name, why in r.unavailable.items():
            rows.append(("", "", name, why, "", "", "", "", ""))
    out = [table(header, rows)]
    for name, reason in skipped.items():
        out.append(f"{BACKEND_CLASSES[name].title}: skipped, {reason}")
    out.append(
        "ratio = pikku_django's acquisitions per second / the baseline's; the target is "
        "judged against each backend's first baseline (a raw upsert; redis-py's Lock)"
    )
    out.append(
        "acquired/s counts won acquisitions (each released); failed attempts, which only "
        f"the {THREADS}-clients-1-key case has, are counted and timed apart"
    )
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=2.0,
        help="timed seconds per figure, for ours and for the baseline each (default 2)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.1,
        help="untimed seconds at the start of every slice (default 0.1)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="slices of every side, in an order rotated each round (default 5)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="0.5 s per figure in 2 rounds, to check it runs"
    )
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help=f"comma-separated, from {','.join(BACKENDS)} (default: all)",
    )
    if parser.parse_known_args(argv)[0].quick:  # smaller defaults; options given still win
        parser.set_defaults(seconds=0.5, rounds=2, warmup=0.05)
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backends {unknown}; choose from {', '.join(BACKENDS)}")
    if args.seconds <= 0 or args.warmup < 0 or args.rounds < 1:
        parser.error("--seconds must be > 0, --warmup >= 0 and --rounds >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[bench] %(message)s")
    tmp = Path(tempfile.mkdtemp(prefix="pikku-bench-"))
    configure_django(tmp / "leases.sqlite3")

    results: list[Result] = []
    skipped: dict[str, str] = {}
    servers: dict[str, str] = {}
    server_config: dict[str, dict[str, str]] = {}
    began = time.perf_counter()
    try:
        for name in args.backends:
            backend = BACKEND_CLASSES[name]()
            try:
                log.info("%s: setting up", name)
                backend.prepare()
                servers[name] = backend.server_version
                server_config[name] = server_settings(name, backend)
                for case in CASES:
                    log.info("%s: %s", name, case.label)
                    result = run_case(backend, case, args.seconds, args.warmup, args.rounds)
                    log.info(
                        "%s: %s: ours %.0f acquired/s, ratios %s",
                        name,
                        case.label,
                        result.ours.acquired_per_s,
                        result.ratios(),
                    )
                    results.append(result)
            except Exception as exc:
                # Unreachable, or failed part-way: report it and go on with the next.
                why = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
                skipped[name] = why.strip()
                log.warning("%s: skipped: %s", name, skipped[name])
                results = [r for r in results if r.backend is not backend]
            finally:
                try:
                    backend.close()
                except Exception:
                    log.debug("closing %s failed", name, exc_info=True)
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("done in %.0f s", time.perf_counter() - began)

    judged = [r for r in results if r.met is not None]
    all_met = all(r.met for r in judged) if judged else None
    print(format_table(results, skipped))
    missed = [f"{r.backend.title} / {r.case.label}" for r in judged if not r.met]
    if all_met is None:
        print("targets: none measured")
    else:
        print("targets: " + ("all met" if all_met else "MISSED: " + ", ".join(missed)))
    report = {
        "benchmark": "pikku_django leases: acquisitions per second and their latency",
        "settings": {
            "seconds": args.seconds,
            "warmup_seconds": args.warmup,
            "rounds": args.rounds,
            "order": "one slice of every side per round, rotated by one each round",
            "quick": args.quick,
            "threads": THREADS,
            "ttl_ms": TTL_MS,
            "targets": {"database": DATABASE_TARGET, "redis": REDIS_TARGET},
        },
        "machine": versions(),
        "servers": servers,
        "server_settings": server_config,
        "skipped": skipped,
        "results": [r.as_json() for r in results],
        "all_targets_met": all_met,
    }
    print(json.dumps(report, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
