"""One database's part of ``benchmarks/throughput.py``: its systems, the interleaved
repeats over the concurrency sweep, the latency runs and the memory phase."""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

from benchlib import (
    POLLS,
    STATS_SETTLE,
    BenchError,
    Processes,
    ensure_database,
    mysql_ensure_database,
    mysql_server_settings,
    pg_params,
    pg_server_settings,
    proc_memory_kb,
    server_transactions,
    sqlite_settings,
    vacuum,
)
from figures import Summary, latency_json, rotated, rotations, slope_last_half
from throughput_peers import ABSURD_URL, PGQUEUER_URL, DjangoAbsurd, PgQueuer, worker_cpu_s
from throughput_systems import (
    Batch,
    Dbos,
    Kind,
    Latency,
    Pikku,
    Procrastinate,
    System,
    dbos_init,
)

log = logging.getLogger("pikku.bench.throughput")

DATABASES = ("postgres", "mariadb", "sqlite")
# Databases of their own: a worker of another benchmark on the same database (chaos.py's
# default is pikku_bench_workflows) would take these runs, and these deletes its runs.
WORKFLOWS_URL = os.environ.get(
    "PIKKU_BENCH_THROUGHPUT_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_throughput"
)
MARIADB_URL = os.environ.get(
    "PIKKU_BENCH_THROUGHPUT_MARIADB_URL", "mysql://root@127.0.0.1:3306/pikku_bench_throughput"
)
PROCRASTINATE_URL = os.environ.get(
    "PIKKU_BENCH_PROCRASTINATE_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_procrastinate"
)
DBOS_URL = os.environ.get(
    "PIKKU_BENCH_DBOS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_dbos"
)
#: Workers without NOTIFY (MariaDB, SQLite) look for work this often (seconds).
POLL_WITHOUT_NOTIFY = 0.1
PAYLOAD_BYTES = 1024


def units_of(kind: Kind, args: argparse.Namespace) -> tuple[int, int]:
    """(units, steps per unit) of a batch: the same number of steps for every kind."""
    if kind is Kind.SINGLE:
        return args.runs * args.steps, 1
    return args.runs, args.steps


def prepare(database: str, procs: Processes, tmp: Path) -> dict[str, Any]:
    """Point Django at ``database``, create and migrate it; its server's settings."""
    url = {"postgres": WORKFLOWS_URL, "mariadb": MARIADB_URL}.get(
        database, f"sqlite:///{tmp / 'bench.sqlite3'}"
    )
    os.environ["PIKKU_BENCH_WORKFLOWS_URL"] = url
    procs.env["PIKKU_BENCH_WORKFLOWS_URL"] = url
    try:
        if database == "postgres":
            ensure_database(url)
        elif database == "mariadb":
            mysql_ensure_database(url)
    except Exception as exc:
        raise Unavailable(f"cannot reach the server ({type(exc).__name__}: {exc})") from exc
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    clear_pikku()
    if database == "postgres":
        return pg_server_settings(url)
    if database == "mariadb":
        return mysql_server_settings(url)
    return sqlite_settings(str(tmp / "bench.sqlite3"))


class Unavailable(Exception):
    """The database cannot be used here; the message says why."""


def clear_pikku() -> None:
    from django.db import connection

    from pikku_django.models import WorkflowRun

    WorkflowRun.objects.all().delete()
    key = connection.ops.quote_name("key")  # a reserved word on MariaDB
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM pikku_lease WHERE {key} LIKE %s", ["workflow-run:%"])


def clear_peers(systems: list[System]) -> None:
    import psycopg

    for system in systems:
        if system.unavailable() is not None:
            continue  # not installed: never set up, nothing to clear
        if isinstance(system, Procrastinate):
            with psycopg.connect(autocommit=True, **pg_params(system.url)) as conn:
                conn.execute("TRUNCATE procrastinate_jobs CASCADE")
        elif isinstance(system, Dbos):
            with psycopg.connect(autocommit=True, **pg_params(system.url)) as conn:
                conn.execute("TRUNCATE dbos.operation_outputs, dbos.workflow_status CASCADE")
        elif isinstance(system, PgQueuer):
            system.clear()


def prepare_peers(procs: Processes, args: argparse.Namespace) -> list[System]:
    peers: list[System] = [
        Procrastinate("procrastinate", "Procrastinate", procs, args.timeout, PROCRASTINATE_URL),
        Dbos("dbos", "DBOS", procs, args.timeout, DBOS_URL),
        PgQueuer("pgqueuer", "PgQueuer", procs, args.timeout, PGQUEUER_URL),
        DjangoAbsurd("absurd", "django-absurd", procs, args.timeout, ABSURD_URL),
    ]
    ready = []
    for peer in peers:
        if peer.unavailable() is None:
            if isinstance(peer, PgQueuer):
                peer.install()
            elif isinstance(peer, Procrastinate):
                prepare_procrastinate()
            else:
                ensure_database(DBOS_URL)
                dbos_init(DBOS_URL)
        ready.append(peer)
    return ready


def prepare_procrastinate() -> None:
    """Procrastinate's database and schema, where missing."""
    from throughput_baselines import procrastinate_app

    ensure_database(PROCRASTINATE_URL)
    with procrastinate_app.open():
        try:
            procrastinate_app.schema_manager.apply_schema()
        except Exception:
            log.debug("procrastinate's schema is already there")


def build_systems(database: str, procs: Processes, args: argparse.Namespace) -> list[System]:
    from bench_settings import CARRY_SETTING

    poll = 1.0 if database == "postgres" else POLL_WITHOUT_NOTIFY
    systems: list[System] = []
    for cma in args.conn_max_age:
        systems.append(
            Pikku(
                f"pikku_carried_cma{cma}",
                f"pikku, carried, CONN_MAX_AGE={cma}",
                procs,
                args.timeout,
                conn_max_age=cma,
                carry=True,
                carry_setting=CARRY_SETTING,
                poll=poll,
                kinds=(Kind.CHAIN, Kind.SINGLE, Kind.INLINE),
            )
        )
        if cma == 60 and getattr(args, "integrations", False):  # next to it off
            systems.append(
                Pikku(
                    "pikku_integrations_cma60",
                    "pikku, carried, CONN_MAX_AGE=60, Prometheus and Sentry on",
                    procs,
                    args.timeout,
                    conn_max_age=60,
                    carry=True,
                    carry_setting=CARRY_SETTING,
                    poll=poll,
                    kinds=(Kind.CHAIN, Kind.SINGLE),
                    integrations=True,
                )
            )
        systems.append(
            Pikku(
                f"pikku_claimed_cma{cma}",
                f"pikku, carrying off, CONN_MAX_AGE={cma}",
                procs,
                args.timeout,
                conn_max_age=cma,
                carry=False,
                carry_setting=CARRY_SETTING,
                poll=poll,
                kinds=(Kind.CHAIN,),
            )
        )
    for more in getattr(args, "more_systems", ()):  # throughput.py --pooler
        systems += more(database, procs, args)
    if database == "postgres" and not args.no_peers:
        systems += prepare_peers(procs, args)
    return [s for s in systems if chosen(s, args)]


def chosen(system: System, args: argparse.Namespace) -> bool:
    """Whether ``--systems`` and ``--kinds`` keep ``system`` (its kinds narrowed to them)."""
    if args.systems and not any(system.key.startswith(k) for k in args.systems):
        return False
    if args.kinds:
        system.kinds = tuple(k for k in system.kinds if k.value in args.kinds)
    return bool(system.kinds)


#: Seconds an idle worker is watched for the transactions it makes while idle.
IDLE_WATCH = 3.0


def counted_batch(system: System, kind: Kind, units: int, steps: int) -> tuple[Batch, float]:
    """A batch, and its server transactions per unit: the database's
    count across the batch once every backend has reported, less the benchmark's own
    reads and what the idle workers made meanwhile (watched just before)."""
    url = system.database_url()
    time.sleep(STATS_SETTLE)  # what came before is reported
    before_idle = server_transactions(url)
    time.sleep(IDLE_WATCH)
    before = server_transactions(url)
    idle_rate = max(before - before_idle - 1, 0) / IDLE_WATCH
    polls = POLLS["count"]
    t0 = time.monotonic()
    batch = system.batch(kind, units, steps)
    polls = POLLS["count"] - polls + 3  # and the batch's start, end and commit-time reads
    time.sleep(STATS_SETTLE)
    after = server_transactions(url)
    idle = idle_rate * (time.monotonic() - t0)
    return batch, max(after - before - 1 - polls - idle, 0) / units


def measure_system(
    system: System,
    concurrency: int,
    args: argparse.Namespace,
    processes: int,
    latency: bool,
    transactions: dict[Kind, float] | None = None,
    stored: dict[Kind, float] | None = None,
    worker_cpu: dict[Kind, float] | None = None,
) -> tuple[dict[Kind, float], Latency]:
    """Start, warm up, measure each kind once (with ``transactions``, count each one's
    server transactions per unit into it; into ``stored``, the CPU a unit took to store
    where it is stored ahead; into ``worker_cpu``, its workers' CPU in ms a unit),
    time ``--latency-runs`` units alone, stop."""
    system.start(concurrency, processes)
    out: dict[Kind, float] = {}
    lat = Latency()
    stored = {} if stored is None else stored
    worker_cpu = {} if worker_cpu is None else worker_cpu
    try:
        for kind in system.kinds:
            if args.warmup:
                units, steps = units_of(kind, args)
                system.batch(kind, min(units, args.warmup * max(1, units // args.runs)), steps)
        for kind in system.kinds:
            units, steps = units_of(kind, args)
            cpu = worker_cpu_s(system.procs, system.names)
            if transactions is None:
                batch = system.batch(kind, units, steps)
            else:
                batch, transactions[kind] = counted_batch(system, kind, units, steps)
            worker_cpu[kind] = (worker_cpu_s(system.procs, system.names) - cpu) * 1000 / units
            out[kind] = batch.per_s
            if batch.store_us is not None:
                stored[kind] = batch.store_us
        if latency and Kind.CHAIN in system.kinds:
            for _ in range(args.latency_runs):
                lat.add(system.one(args.steps))
    finally:
        system.stop()
    return out, lat


def run_database(
    database: str, args: argparse.Namespace, procs: Processes, tmp: Path
) -> dict[str, Any]:
    try:
        server = prepare(database, procs, tmp)
    except Unavailable as exc:
        return {"database": database, "skipped": str(exc)}
    autovacuum_off = database == "postgres" and server.get("autovacuum") != "on"
    do_vacuum = database == "postgres" and (
        args.vacuum == "always" or (args.vacuum == "auto" and autovacuum_off)
    )
    if autovacuum_off:
        log.warning("autovacuum is off on this server: VACUUM ANALYZE between repeats")
    processes = 1 if database == "sqlite" else args.processes  # one worker per SQLite file
    systems = build_systems(database, procs, args)
    runnable = [s for s in systems if s.unavailable() is None]
    values: dict[str, dict[str, dict[int, list[float]]]] = {s.key: {} for s in runnable}
    latencies: dict[str, Latency] = {s.key: Latency() for s in runnable}
    counted: dict[str, dict[str, list[float]]] = {s.key: {} for s in runnable}
    store_cpu: dict[str, dict[str, list[float]]] = {s.key: {} for s in runnable}
    worker_cpu: dict[str, dict[str, list[float]]] = {s.key: {} for s in runnable}
    count = args.transactions and database == "postgres"
    for r, order in rotations(runnable, args.repeat):
        clear_pikku()
        clear_peers(runnable)
        if do_vacuum:
            for url in [WORKFLOWS_URL] + [
                s.url for s in runnable if isinstance(s, Procrastinate | Dbos | PgQueuer)
            ]:
                vacuum(url)
        for concurrency in rotated(args.concurrency, r):
            for system in order:
                log.info(
                    "%s repeat %d/%d, concurrency %d: %s",
                    database,
                    r + 1,
                    args.repeat,
                    concurrency,
                    system.label,
                )
                tx: dict[Kind, float] | None = {} if count else None
                cpu: dict[Kind, float] = {}
                wcpu: dict[Kind, float] = {}
                per_s, lat = measure_system(
                    system,
                    concurrency,
                    args,
                    processes,
                    latency=concurrency == args.concurrency[0],
                    transactions=tx,
                    stored=cpu,
                    worker_cpu=wcpu,
                )
                for kind, ms in wcpu.items():
                    worker_cpu[system.key].setdefault(kind.value, []).append(ms)
                for kind, us in cpu.items():
                    store_cpu[system.key].setdefault(kind.value, []).append(us)
                for kind, value in per_s.items():
                    values[system.key].setdefault(kind.value, {}).setdefault(
                        concurrency, []
                    ).append(value)
                    if tx is None:
                        log.info("  %s: %.1f steps/s", kind.value, value)
                        continue
                    counted[system.key].setdefault(kind.value, []).append(tx[kind])
                    log.info(
                        "  %s: %.1f steps/s, %.1f server transactions a unit",
                        kind.value,
                        value,
                        tx[kind],
                    )
                latencies[system.key].add(lat)
    for system in runnable:
        if isinstance(system, Dbos):
            system.close()
    result: dict[str, Any] = {
        "database": database,
        "server": server,
        "vacuum_between_repeats": do_vacuum,
        "processes": processes,
        "systems": {
            s.key: {
                "label": s.label,
                "family": s.family,
                "kinds": [k.value for k in s.kinds],
                "settings": s.settings(),
                "unavailable": s.unavailable(),
            }
            for s in systems
        },
        "throughput": {
            key: {
                kind: {str(c): Summary.of(v).as_json(1) for c, v in by_c.items()}
                for kind, by_c in kinds.items()
            }
            for key, kinds in values.items()
        },
        "transactions_per_unit": {
            key: {kind: Summary.of(v).as_json(2) for kind, v in kinds.items()}
            for key, kinds in counted.items()
            if kinds
        },
        "store_cpu_us_per_unit": {
            key: {kind: Summary.of(v).as_json(1) for kind, v in kinds.items()}
            for key, kinds in store_cpu.items()
            if kinds
        },
        "worker_cpu_ms_per_unit": {
            key: {kind: Summary.of(v).as_json(3) for kind, v in kinds.items()}
            for key, kinds in worker_cpu.items()
            if kinds
        },
        "latency": {
            key: {
                "concurrency": args.concurrency[0],
                "stored_to_first_step": latency_json(lat.first_ms),
                "step_to_step": latency_json(lat.gaps_ms),
            }
            for key, lat in latencies.items()
            if lat.first_ms
        },
    }
    pgqueuer = next((s for s in runnable if type(s) is PgQueuer), None)
    if pgqueuer is not None and getattr(args, "bulk", None):
        from throughput_bulk import measure_bulk

        result["bulk"] = measure_bulk(procs, args, pgqueuer, counted_batch)
    if database == "postgres" and args.memory_steps:
        result["memory"] = measure_memory(procs, args)
    if args.profile:
        result["profile"] = profile_pikku(database, procs, args)
    return result


def profile_pikku(database: str, procs: Processes, args: argparse.Namespace) -> dict[str, str]:
    """Two more batches of each kind through a CONN_MAX_AGE=60 worker under py-spy, in
    wall time and in CPU; where its worker threads' time went, per kind (not among the
    figures)."""
    import time

    from profiling import start_profiler, stop_profiler, summarise_profile

    clear_pikku()
    system = Pikku(
        "pikku_profiled",
        "pikku under py-spy",
        procs,
        args.timeout,
        conn_max_age=60,
        carry=True,
        carry_setting=None,
        poll=1.0 if database == "postgres" else POLL_WITHOUT_NOTIFY,
        kinds=(Kind.CHAIN, Kind.SINGLE, Kind.INLINE),
    )
    args.profile.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}
    system.start(args.concurrency[0], 1)
    try:
        for kind in system.kinds:
            units, steps = units_of(kind, args)
            system.batch(kind, min(units, max(1, args.warmup)), steps)
        pid = procs.procs[system.names[0]].pid
        for kind in system.kinds:
            for cpu in (False, True):
                name = f"{kind.value}-cpu" if cpu else kind.value
                raw = args.profile / f"{database}-{name}.raw"
                profiler = start_profiler(pid, raw, cpu=cpu)
                if profiler is None:
                    return {"unavailable": "py-spy is not installed (pip install py-spy)"}
                time.sleep(1.0)  # py-spy attaches
                units, steps = units_of(kind, args)
                per_s = system.batch(kind, units, steps).per_s
                stop_profiler(profiler)
                summary = (
                    summarise_profile(raw, cpu=cpu) if raw.exists() else "py-spy recorded nothing"
                )
                out[name] = f"{per_s:.1f} steps/s under py-spy; {summary}"
    finally:
        system.stop()
    return out


def measure_memory(procs: Processes, args: argparse.Namespace) -> dict[str, Any]:
    """One worker (CONN_MAX_AGE 60, carried, the sweep's first concurrency) runs
    ``bench.payload`` until ``--memory-steps`` steps; VmRSS after every batch."""
    from throughput_systems import start_runs_with

    clear_pikku()
    worker = Pikku(
        "pikku_memory",
        "pikku memory",
        procs,
        args.timeout,
        conn_max_age=60,
        carry=True,
        carry_setting=None,
        poll=1.0,
        kinds=(),
    )
    concurrency = args.concurrency[0]
    worker.start(concurrency, 1)
    payload = "x" * PAYLOAD_BYTES
    steps, batch_runs = args.steps, max(1, min(200, args.memory_steps // (20 * args.steps)))
    trace: list[dict[str, int]] = []
    try:
        ids, _ = start_runs_with("bench.payload", 2, {"steps": steps, "payload": payload})
        worker.wait(ids)  # the worker's first runs, before the first reading
        pid = procs.procs[worker.names[0]].pid
        start = proc_memory_kb(pid)
        done = 0
        while done < args.memory_steps:
            runs = min(batch_runs, -(-(args.memory_steps - done) // steps))
            ids, _ = start_runs_with("bench.payload", runs, {"steps": steps, "payload": payload})
            worker.wait(ids)
            done += runs * steps
            trace.append({"steps": done, **proc_memory_kb(pid)})
            if len(trace) % 10 == 0:
                log.info("memory: %d steps, VmRSS %d kB", done, trace[-1]["VmRSS"])
    finally:
        worker.stop()
    if not trace:
        raise BenchError("the memory phase ran no batch")
    slope = slope_last_half([(p["steps"], p["VmRSS"] * 1024) for p in trace])
    return {
        "concurrency": concurrency,
        "steps": done,
        "queued_share": 0.9,
        "payload_bytes": PAYLOAD_BYTES,
        "rss_start_kb": start["VmRSS"],
        "rss_end_kb": trace[-1]["VmRSS"],
        "peak_rss_kb": trace[-1]["VmHWM"],
        "slope_last_half_bytes_per_step": None if slope is None else round(slope, 2),
        "trace": trace,
    }
