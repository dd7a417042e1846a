"""``benchmarks/throughput.py --pooler``: the systems whose workers reach PostgreSQL
through a PgBouncer in transaction mode, and the pairings that judge them.

The benchmark starts the PgBouncer (``tests.pgbouncer.start``, ``default_pool_size`` 20,
on a free port of 127.0.0.1) and stops it after. Through it run:

- pikku (carried, ``CONN_MAX_AGE`` 60) with ``PIKKU["DATABASE_POOLING"]`` and
  ``WORKER_NOTIFY`` off: idle workers poll every 0.1 s (no ``LISTEN`` through a
  transaction pooler);
- the same with ``PIKKU["LISTEN_DATABASES"]`` naming a direct alias of the database, as
  the operations guide advises: everything goes through the pooler but the one
  ``LISTEN`` connection a worker process holds, so idle workers are woken, not polling;
- Procrastinate as its documentation and psycopg's advise behind a transaction pooler:
  ``worker --no-listen-notify`` with ``--fetch-job-polling-interval`` 0.1 (the same poll
  as pikku's), and psycopg connections that prepare nothing (``prepare_threshold=None``).
  A short trial run first: if Procrastinate cannot run through the pooler, the table
  says so with the error it met, instead of its figures.

Next to them, on the direct connection, pikku with ``PREPARED_STATEMENTS`` and
``LEASE_PREPARED_STATEMENTS`` off, which is what it does behind a transaction pooler
without the pooler: paired with the direct line (what planning every statement costs)
and with the polling line (what the pooler itself costs).

Each is paired with the same system on the direct connection (pikku carried,
``CONN_MAX_AGE`` 60; Procrastinate as in the peers' pairings, measured here even with
``--no-peers``), 10-step and 1-step runs (chains of 10 jobs and single jobs), as the
ratio of their best medians. Units are stored and read on the direct connection either
way.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from benchlib import Processes

log = logging.getLogger("pikku.bench.throughput")

#: The pikku systems whose workers go through the pooler: polling, and LISTENing over a
#: direct alias.
POOLED = "pikku_pooled_cma60"
POOLED_LISTEN = "pikku_pooled_listen_cma60"
PROCRASTINATE_POOLED = "procrastinate_pooled"
#: pikku direct with its statements not prepared, as behind a transaction pooler.
UNPREPARED = "pikku_unprepared_cma60"
POOLER_TARGET = 0.8
POOL_SIZE = 20


def start_pooler() -> Any:
    """A PgBouncer in transaction mode in front of the benchmark's PostgreSQL."""
    import dj_database_url
    from throughput_run import WORKFLOWS_URL

    from tests.pgbouncer import start

    server = dj_database_url.parse(WORKFLOWS_URL)
    return start("transaction", server, pool_size=POOL_SIZE, round_robin=False)


def pooler_version() -> str:
    from tests.pgbouncer import executable

    done = subprocess.run(
        [executable() or "pgbouncer", "--version"], capture_output=True, text=True, check=False
    )
    return (done.stdout or done.stderr).splitlines()[0] if done.stdout or done.stderr else "-"


def through(url: str, port: int) -> str:
    """``url`` with its host and port those of the pooler on ``port``."""
    parts = urlsplit(url)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{port}"))


def pooled_systems(pooler: Any) -> Any:
    """The systems behind ``pooler``, for ``throughput_run.build_systems``."""
    from throughput_run import POLL_WITHOUT_NOTIFY, PROCRASTINATE_URL, WORKFLOWS_URL
    from throughput_systems import Kind, Pikku, Procrastinate

    url = through(WORKFLOWS_URL, pooler.port)
    via = f"PgBouncer, pool_mode = {pooler.mode}, default_pool_size = {POOL_SIZE}"

    class PooledPikku(Pikku):
        listen = False

        def settings(self) -> dict[str, Any]:
            out = {
                **super().settings(),
                "via": via,
                "PIKKU['DATABASE_POOLING']": {"default": pooler.mode},
            }
            if self.listen:
                out["PIKKU['LISTEN_DATABASES']"] = {"default": "listen (direct)"}
            else:
                out["PIKKU['WORKER_NOTIFY']"] = False
            return out

        def start(self, concurrency: int, processes: int) -> None:
            direct = dict(self.procs.env)
            self.procs.env |= {"PIKKU_BENCH_WORKFLOWS_URL": url, "PIKKU_BENCH_POOLING": pooler.mode}
            if self.listen:
                self.procs.env["PIKKU_BENCH_LISTEN_URL"] = WORKFLOWS_URL
            try:
                super().start(concurrency, processes)
            finally:
                self.procs.env = direct

    class PooledListenPikku(PooledPikku):
        listen = True

    class UnpreparedPikku(Pikku):
        """Direct, with the hot-path and lease statements not prepared: what pikku does
        behind a transaction pooler, without the pooler."""

        def settings(self) -> dict[str, Any]:
            return {
                **super().settings(),
                "PIKKU['PREPARED_STATEMENTS']": False,
                "PIKKU['LEASE_PREPARED_STATEMENTS']": False,
            }

        def start(self, concurrency: int, processes: int) -> None:
            direct = dict(self.procs.env)
            self.procs.env["PIKKU_BENCH_PREPARED"] = "0"
            try:
                super().start(concurrency, processes)
            finally:
                self.procs.env = direct

    class PooledProcrastinate(Procrastinate):
        reason: str | None = None

        def unavailable(self) -> str | None:
            return super().unavailable() or self.reason

        def trial(self) -> None:
            """A chain of 3 jobs and a single job through the pooler, once; what went
            wrong, if anything, becomes the reason it is left out."""
            from throughput_run import clear_peers

            tail = ""
            try:
                self.start(2, 1)
                try:
                    after, jobs, _, _ = self._defer(Kind.CHAIN, 1, 3)
                    self._wait(after, jobs)
                    after, jobs, _, _ = self._defer(Kind.SINGLE, 1, 1)
                    self._wait(after, jobs)
                finally:
                    tail = "\n".join(self.procs.tail(n) for n in self.names)
                    self.stop()
            except Exception as exc:
                self.reason = (
                    "cannot run through PgBouncer (transaction): "
                    f"{type(exc).__name__}: {exc}; its worker printed: {tail.strip()[-600:]}"
                )
                log.warning("%s", self.reason)
            finally:
                clear_peers([self])

    def systems(database: str, procs: Processes, args: argparse.Namespace) -> list[Any]:
        if database != "postgres":
            return []
        common = {
            "conn_max_age": 60,
            "carry": True,
            "carry_setting": None,
            "kinds": (Kind.CHAIN, Kind.SINGLE),
        }
        label = f"pikku, carried, CONN_MAX_AGE=60, through PgBouncer ({pooler.mode})"
        out: list[Any] = [
            PooledPikku(
                POOLED,
                f"{label}, polling",
                procs,
                args.timeout,
                poll=POLL_WITHOUT_NOTIFY,
                **common,
            ),
            PooledListenPikku(
                POOLED_LISTEN,
                f"{label}, LISTEN direct",
                procs,
                args.timeout,
                poll=1.0,
                **common,
            ),
            UnpreparedPikku(
                UNPREPARED,
                "pikku, carried, CONN_MAX_AGE=60, statements not prepared",
                procs,
                args.timeout,
                poll=1.0,
                **common,
            ),
        ]
        pooled = PooledProcrastinate(
            PROCRASTINATE_POOLED,
            f"Procrastinate through PgBouncer ({pooler.mode}), polling",
            procs,
            args.timeout,
            PROCRASTINATE_URL,
            worker_url=through(PROCRASTINATE_URL, pooler.port),
            poll=POLL_WITHOUT_NOTIFY,
        )
        if pooled.unavailable() is None:
            from throughput_run import prepare_procrastinate

            prepare_procrastinate()
            if args.no_peers:  # its direct figure, which the peers would have measured
                out.append(
                    Procrastinate(
                        "procrastinate", "Procrastinate", procs, args.timeout, PROCRASTINATE_URL
                    )
                )
            pooled.trial()
        out.append(pooled)
        return out

    return systems


#: Each pairing: its name, through the pooler, direct.
PAIRS = (
    ("pikku through PgBouncer (transaction), polling, vs direct", POOLED, None),
    ("pikku through PgBouncer (transaction), LISTEN direct, vs direct", POOLED_LISTEN, None),
    (
        "pikku direct, statements not prepared (as behind the pooler), vs direct",
        UNPREPARED,
        None,
    ),
    (
        "pikku through PgBouncer (transaction), polling, vs direct with statements not prepared",
        POOLED,
        UNPREPARED,
    ),
    (
        "Procrastinate through PgBouncer (transaction), polling, vs direct",
        PROCRASTINATE_POOLED,
        "procrastinate",
    ),
)


def pooler_pairings(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Through the pooler against the direct connection, 10-step and 1-step runs; pikku
    against its target, Procrastinate for comparison (or why it could not run)."""
    from throughput_report import RECOMMENDED, best

    out = []
    for database, db in results.items():
        for title, pooled, direct in PAIRS:
            info = db.get("systems", {}).get(pooled)
            if info is None:
                continue
            if info["unavailable"]:
                out.append(
                    {
                        "database": database,
                        "pairing": title,
                        "kind": None,
                        "unavailable": info["unavailable"],
                    }
                )
                continue
            direct = direct or RECOMMENDED
            target = POOLER_TARGET if direct == RECOMMENDED and pooled != UNPREPARED else None
            for kind, name in (("chain", "10 queued steps"), ("single", "1 queued step")):
                ours, theirs = best(db, pooled, kind), best(db, direct, kind)
                if ours is None or theirs is None or not theirs["median"]:
                    continue
                ratio = ours["median"] / theirs["median"]
                met = None if target is None else ratio >= target
                out.append(
                    {
                        "database": database,
                        "pairing": f"{title}, {name}",
                        "kind": kind,
                        "ours": pooled,
                        "theirs": direct,
                        "ours_best": ours,
                        "theirs_best": theirs,
                        "ratio": round(ratio, 3),
                        "target": target,
                        "met": met,
                        "missed_by_pct": None
                        if target is None or met
                        else round((1 - ratio / target) * 100, 1),
                    }
                )
    return out
