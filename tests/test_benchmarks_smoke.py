"""The benchmarks' ``--quick`` modes run end to end and print the JSON the docs read.

Each script runs as a subprocess on databases named after this process (dropped
afterwards), and its last line is checked for its shape: every figure with its
median and range, its baseline beside it, the server settings. Never a speed: the
figures of a run on a shared machine mean nothing, and a test must not depend on them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_service

pytestmark = [pytest.mark.once, pytest.mark.long]

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
PG = "postgres://postgres@127.0.0.1:5432"
TAG = f"pikku_smoke_{os.getpid()}"
SUMMARY_KEYS = {"median", "min", "max", "q1", "q3", "spread_pct", "repeats"}


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def run_script(script: str, *argv: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
    done = subprocess.run(  # noqa: S603 - this interpreter on a script of the repository
        [sys.executable, str(BENCH / script), *argv],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    return json.loads(last)


def drop_pg(names: list[str]) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        for name in names:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def pg_names() -> Iterator[dict[str, str]]:
    require_service("postgres")
    names = {
        "PIKKU_BENCH_THROUGHPUT_URL": f"{TAG}_wf",
        "PIKKU_BENCH_PROCRASTINATE_URL": f"{TAG}_pr",
        "PIKKU_BENCH_DBOS_URL": f"{TAG}_dbos",
        "PIKKU_BENCH_PGQUEUER_URL": f"{TAG}_pgq",
        "PIKKU_BENCH_ABSURD_URL": f"{TAG}_absurd",
        "PIKKU_BENCH_POSTGRES_URL": f"{TAG}_pg",
    }
    yield {var: f"{PG}/{name}" for var, name in names.items()}
    drop_pg(list(names.values()))


def figures_module() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import figures
    finally:
        sys.path.remove(str(BENCH))
    return figures


def test_repeats_rotate_and_summaries_hold_their_spread() -> None:
    figures = figures_module()
    orders = [order for _, order in figures.rotations(["a", "b", "c"], 4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    summary = figures.Summary.of([3.0, 1.0, 2.0, 10.0])
    assert (summary.median, summary.low, summary.high) == (2.5, 1.0, 10.0)
    assert summary.as_json(1)["repeats"] == [3.0, 1.0, 2.0, 10.0]
    with pytest.raises(ValueError, match="at least one value"):
        figures.Summary.of([])
    assert figures.ratio(summary, figures.Summary.of([1.25])) == 2.0


def test_memory_slope_reads_only_the_last_half() -> None:
    figures = figures_module()
    # Steep growth while warming up, then 40 bytes a step.
    points = [(0, 0), (100, 1_000_000), (500, 1_000_000 + 400 * 40), (1000, 1_000_000 + 900 * 40)]
    assert figures.slope_last_half(points) == pytest.approx(40.0)
    assert figures.slope_last_half(points[:1]) is None


def assert_summary(summary: dict[str, Any]) -> None:
    assert set(summary) >= SUMMARY_KEYS
    assert summary["min"] <= summary["median"] <= summary["max"]
    assert len(summary["repeats"]) >= 1


def test_throughput_quick(pg_names: dict[str, str]) -> None:
    report = run_script(
        "throughput.py",
        *("--quick", "--databases", "postgres,sqlite", "--conn-max-age", "60"),
        *("--memory-steps", "200", "--latency-runs", "1", "--warmup", "1"),
        *("--runs", "6", "--steps", "5", "--integrations", "--bulk", "20"),
        env=pg_names,
        timeout=170,
    )
    assert report["settings"]["quick"] is True
    assert set(report["docs"]) == {"procrastinate", "dbos", "pgqueuer", "absurd", "django"}
    pg, sqlite = report["databases"]["postgres"], report["databases"]["sqlite"]
    assert "skipped" not in pg, pg
    assert "skipped" not in sqlite, sqlite
    for setting in ("fsync", "synchronous_commit", "autovacuum", "shared_buffers"):
        assert setting in pg["server"]
    assert sqlite["server"]["journal_mode"] == "wal"
    for db in (pg, sqlite):
        for key, system in db["systems"].items():
            if system["unavailable"]:
                assert isinstance(system["unavailable"], str)
                assert key not in db["throughput"]
                continue
            assert set(db["throughput"][key]) == set(system["kinds"])
            for by_concurrency in db["throughput"][key].values():
                assert set(by_concurrency) == {"4"}
                assert_summary(by_concurrency["4"])
        ours = db["latency"]["pikku_carried_cma60"]
        assert ours["stored_to_first_step"]["n"] == 1
        assert ours["step_to_step"]["n"] == 4
    peers = {
        "procrastinate": installed("procrastinate"),
        "dbos": installed("dbos"),
    }
    for peer, present in peers.items():
        assert (pg["systems"][peer]["unavailable"] is None) is present
    # PgQueuer runs on a Python >= 3.12 of its own: present or absent, it says which.
    pgqueuer = pg["systems"]["pgqueuer"]
    if pgqueuer["unavailable"] is None:
        assert set(pg["throughput"]["pgqueuer"]) == {"chain", "single"}
        assert set(pg["bulk"]["figures"]) == {
            "pikku_one_by_one",
            "pgqueuer_batch",
            "pgqueuer_one_by_one",
        }
    else:
        assert "Python >= 3.12" in pgqueuer["unavailable"]
        assert "bulk" not in pg
    absurd = pg["systems"]["absurd"]
    if absurd["unavailable"] is None:
        assert set(pg["throughput"]["absurd"]) == {"chain", "single"}
    else:
        assert "Python >= 3.12" in absurd["unavailable"]
    assert pg["worker_cpu_ms_per_unit"]["pikku_carried_cma60"]["single"]["median"] > 0
    pairings = {(p["database"], p["theirs"], p["kind"]) for p in report["targets"]["pairings"]}
    for kind in ("chain", "single"):  # --integrations: on, next to off
        assert ("postgres", "pikku_carried_cma60", kind) in pairings
    if peers["procrastinate"]:
        assert ("postgres", "procrastinate", "chain") in pairings
        assert ("postgres", "procrastinate", "single") in pairings
    if peers["dbos"]:
        assert ("postgres", "dbos", "chain") in pairings
        assert ("postgres", "dbos", "inline") in pairings
    for pairing in report["targets"]["pairings"]:
        assert pairing["ratio"] > 0, pairing
        assert (pairing["met"] is None) is (pairing["target"] is None)
    memory = pg["memory"]
    assert memory["steps"] == 200
    assert memory["payload_bytes"] == 1024
    assert len(memory["trace"]) >= 2


def test_leases_quick_on_each_backend_mariadb_redis_included(pg_names: dict[str, str]) -> None:
    require_service("mariadb")
    require_service("redis")
    env = {
        "PIKKU_BENCH_POSTGRES_URL": pg_names["PIKKU_BENCH_POSTGRES_URL"],
        "PIKKU_BENCH_MARIADB_URL": f"mysql://root@127.0.0.1:3306/{TAG}",
        "PIKKU_BENCH_REDIS_URL": "redis://127.0.0.1:6379/14",
    }
    try:
        report = run_script("leases.py", "--quick", "--seconds", "0.2", env=env, timeout=120)
    finally:
        drop_mariadb(TAG)
    assert report["settings"]["quick"] is True
    assert not report["skipped"], report["skipped"]
    assert {"fsync", "synchronous_commit", "autovacuum"} <= set(
        report["server_settings"]["postgres"]
    )
    by = {(r["backend"], r["case"]): r for r in report["results"]}
    assert len(by) == 15  # five backends, three cases
    expected = {
        "sqlite": {"raw sqlite3 upsert"},
        "postgres": {"raw psycopg upsert", "pg_try_advisory_lock"},
        "mariadb": {"raw MySQLdb upsert"},
        "redis": {"redis-py Lock", "python-redis-lock"},
        "memory": set(),
    }
    for (backend, case), r in by.items():
        names = set(r["baselines"]) | set(r["baselines_unavailable"])
        assert names == expected[backend]
        if "python-redis-lock" in r["baselines_unavailable"]:
            assert not installed("redis_lock")
        for tally in [r["ours"], *r["baselines"].values()]:
            assert tally["acquired"] > 0
            assert tally["acquire_release_latency"]["p50_us"] > 0
            assert_summary(tally["acquired_per_s_by_slice"])
            if "1 key" not in case:
                assert tally["failed_attempts"] == 0
        if r["target"] is not None:
            assert r["ratio"] is not None
            assert r["met"] is (r["ratio"] >= r["target"])


def test_webhooks_quick(pg_names: dict[str, str]) -> None:
    report = run_script(
        "webhooks.py",
        *("--quick", "--seconds", "0.2", "--rounds", "2"),
        env={"PIKKU_BENCH_POSTGRES_URL": pg_names["PIKKU_BENCH_POSTGRES_URL"]},
        timeout=120,
    )
    assert report["settings"]["clients"] == [1, 8]
    assert not report["skipped"], report["skipped"]
    by_backend = {r["backend"]: r for r in report["results"]}
    assert set(by_backend) == {"sqlite", "postgres"}
    pg = by_backend["postgres"]
    assert {"fsync", "synchronous_commit", "autovacuum"} <= set(pg["server_settings"])
    for result in by_backend.values():
        for clients in ("1", "8"):
            figures = result["by_clients"][clients]
            assert {"raw", "pikku"} <= set(figures)
            for side in ("raw", "pikku"):
                assert_summary(figures[side]["requests_per_s"])
            assert figures["ratios"]["pikku_vs_raw"] > 0
        start = result["worker_starting_runs"]
        assert start["runs_started"] > 0
        assert start["intake_plus_start_us_per_event_1_client"] > start["us_per_event"]
        assert result["row_check"]["runs"] == 0
        cpu = result["cpu_us_per_request_1_client"]
        assert {"raw", "pikku"} <= set(cpu)
        for side in cpu:
            assert_summary(cpu[side])
    assert {"notify", "defer"} <= set(by_backend["sqlite"]["unavailable"])
    assert pg["by_clients"]["8"]["ratios"]["pikku_vs_notify"] > 0
    if installed("procrastinate"):
        assert "defer" in pg["by_clients"]["8"]
        assert pg["targets"]["pikku_vs_defer_at_8_clients"]["ratio"] > 0
    else:
        assert "not installed" in pg["unavailable"]["defer"]


def drop_mariadb(name: str) -> None:
    import MySQLdb

    conn = MySQLdb.connect(host="127.0.0.1", user="root", connect_timeout=5)
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def test_transactions_are_counted_per_unit(
    pg_names: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--transactions``: a batch's server transactions per unit, less the
    benchmark's own reads (here a batch of 20 units that commits 3 a unit)."""
    import psycopg

    monkeypatch.syspath_prepend(str(BENCH))
    import benchlib
    import throughput_run
    from throughput_systems import Batch, Kind

    url = pg_names["PIKKU_BENCH_THROUGHPUT_URL"]
    benchlib.ensure_database(url)
    # Each connection below is closed at once, so its counts reach the server at once.
    monkeypatch.setattr(throughput_run, "STATS_SETTLE", 1.0)
    monkeypatch.setattr(throughput_run, "IDLE_WATCH", 0.5)

    class Counted:
        def database_url(self) -> str:
            return url

        def batch(self, kind: Kind, units: int, steps: int) -> Batch:
            with psycopg.connect(**benchlib.pg_params(url), autocommit=True) as conn:
                for _ in range(units * 3 + 3):  # and its start, end and commit-time reads
                    conn.execute("SELECT 1")
            return Batch(units, 1.0)

    batch, per_unit = throughput_run.counted_batch(Counted(), Kind.SINGLE, 20, 1)
    assert batch == Batch(20, 1.0)
    assert per_unit == pytest.approx(3.0, abs=0.3)


def test_tasks_benchmark_repeats_every_system_and_compares_medians() -> None:
    require_service("postgres")
    name = f"{TAG}_tasks"
    try:
        report = run_script(
            "tasks.py",
            *("--tasks", "5", "--repeat", "2", "--settle", "0.2"),
            env={"PIKKU_BENCH_TASKS_URL": f"{PG}/{name}"},
            timeout=240,
        )
    finally:
        drop_pg([name])
    assert report["settings"]["repeat"] == 2
    systems = ["pikku", "django_tasks_db"] + (
        ["procrastinate"] if installed("procrastinate") else []
    )
    for system in systems:
        for figure in ("tasks_per_s", "enqueues_per_s", "drain_tasks_per_s"):
            assert_summary(report[system][figure])
            assert len(report[system][figure]["repeats"]) == 2
    assert report["ratios"]["pikku_vs_django_tasks_db_tasks"] > 0


def test_retention_quick_deletes_the_same_rows_as_pikku_prune() -> None:
    require_service("postgres")
    name = f"{TAG}_retention"
    try:
        report = run_script(
            "retention.py",
            "--quick",
            env={"PIKKU_BENCH_WORKFLOWS_URL": f"{PG}/{name}"},
            timeout=240,
        )
    finally:
        drop_pg([name])
    assert report["quick"] is True
    deleted = report["rows_deleted"]
    # The same data each time; the job's own run, step and attempt stay.
    assert deleted["pikku_prune"] > 0
    assert deleted["retention_job"] == deleted["pikku_prune"] - 3
    assert set(report["rows_per_s"]) == {"pikku_prune", "retention_job"}
    assert report["retention_against_prune"] > 0
