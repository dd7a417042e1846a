"""Failover: how soon leases are taken again after an asynchronous standby is promoted,
and whether the holders of the commits the failover lost are all refused.

On a private primary and asynchronous standby (``tests/pg_clusters.py``: Debian's
PostgreSQL binaries, free ports, temporary directories; the machine's own cluster is
not touched), through one libpq multi-host alias (``target_session_attrs=read-write``),
each trial:

1. takes ``--keys`` leases on the primary (short, so they lapse) and measures, as the
   baseline, the first acquire of a new lease service (a new connection: what a
   worker pays after a failover too) and the median acquire on a warm one;
2. holds the standby back, lets the leases lapse and has new holders take every key
   over: commits only the primary has;
3. stops the primary (``immediate``) and promotes the standby;
4. measures promotion -> first lease acquired by a worker whose pooled connections
   went to the old primary (its connections are replaced, and libpq picks the new
   primary), then takes every key over on the new primary;
5. has every holder from the lost timeline refresh, release and re-acquire: each must
   be refused, and every token after the promotion must exceed every token before.

Then, on a second pair per trial, the same for steps (``benchmarks/failover_steps.py``):
promotion -> first step completed against a baseline on a new connection, runs
completed of those started, and the lost timeline's claims: each renewal and settle
must be refused, and every claim token after the promotion must exceed every one
before. Run it from the repository root:

    .venv/bin/python benchmarks/failover.py
    .venv/bin/python benchmarks/failover.py --trials 5 --keys 50 --runs 50

stdout gets the table and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

from tests.pg_clusters import (  # noqa: E402
    ReplicatedPair,
    django_database,
    primary_and_standby,
    unavailable_reason,
)

ALIAS = "default"
APP = "pikku_app"
LEASE_TABLE = """
    CREATE TABLE pikku_lease (
        key varchar(255) PRIMARY KEY, holder varchar(255) NOT NULL,
        token bigint NOT NULL, expires_at bigint NOT NULL
    )
"""


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def take(service: Any, key: str, holder: str, ttl: int, timeout: float = 30) -> Any:
    """Acquire ``key`` as soon as it is free (connection errors count as not yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            lease = service.acquire(key, holder, ttl)
        except Exception:
            lease = None
            if time.monotonic() > deadline:
                raise
        if lease is not None:
            return lease
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key} was never free")
        time.sleep(0.005)


def trial(pair: ReplicatedPair, keys: int, short_ms: int) -> dict[str, Any]:
    from pikku_django.leases.database import DatabaseLeaseService

    with pair.primary.connect(APP, APP) as conn:
        conn.execute(LEASE_TABLE)
    names = [f"key-{i}" for i in range(keys)]

    started = time.monotonic()
    cold = DatabaseLeaseService(ALIAS)
    first = take(cold, "cold", "baseline", short_ms)
    cold_first_ms = ms(time.monotonic() - started)
    cold.close()
    old_worker = DatabaseLeaseService(ALIAS)
    warm: list[float] = []
    before = [first]
    for name in names:
        t = time.monotonic()
        before.append(take(old_worker, name, "first", short_ms))
        warm.append(time.monotonic() - t)

    pair.hold_back_standby()
    lost = [take(old_worker, name, "lost", 60_000) for name in names]
    before += lost

    stopped = time.monotonic()
    pair.fail_over()
    promoted = time.monotonic()
    new_worker = old_worker  # its pooled connections all went to the old primary
    after = [take(new_worker, "after-promotion", "successor", 60_000)]
    first_after = time.monotonic()
    after += [take(new_worker, name, "successor", 60_000) for name in names]

    refused = {"refresh": 0, "release": 0, "acquire": 0}
    for lease in lost:
        refused["refresh"] += new_worker.refresh(lease, 60_000) is None
        refused["release"] += not new_worker.release(lease)
        refused["acquire"] += new_worker.acquire(lease.key, lease.holder, 60_000) is None
    new_worker.close()
    return {
        "baseline_first_acquire_new_service_ms": cold_first_ms,
        "baseline_median_acquire_ms": ms(statistics.median(warm)),
        "stop_to_promoted_ms": ms(promoted - stopped),
        "promoted_to_first_acquire_ms": ms(first_after - promoted),
        "lost_holders": len(lost),
        "lost_holders_refused": refused,
        "tokens_before_max": max(x.token for x in before),
        "tokens_after_min": min(x.token for x in after),
        "tokens_rose": min(x.token for x in after) > max(x.token for x in before),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--short-ms", type=int, default=200, help="the first holders' ttl")
    parser.add_argument("--runs", type=int, default=20, help="runs whose claims are lost")
    parser.add_argument("--lost-runs", type=int, default=5, help="runs started, then lost")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    results = []
    for n in range(args.trials):
        with primary_and_standby() as pair:
            pair.primary.create_database(APP, owner=APP)
            db = django_database(APP, APP, [pair.primary, pair.standby])
            use(db)
            results.append(trial(pair, args.keys, args.short_ms))
        with primary_and_standby() as pair:
            pair.primary.create_database(APP, owner=APP)
            use(django_database(APP, APP, [pair.primary, pair.standby]))
            from benchmarks.failover_steps import step_trial

            results[-1].update(step_trial(pair, ALIAS, args.runs, args.lost_runs))
        print(f"trial {n + 1}: {results[-1]}", file=sys.stderr)

    def col(name: str) -> str:
        return " ".join(f"{r[name]:>8}" for r in results)

    print(f"{'figure (ms), per trial':<48} values")
    for name in (
        "baseline_first_acquire_new_service_ms",
        "baseline_median_acquire_ms",
        "stop_to_promoted_ms",
        "promoted_to_first_acquire_ms",
        "steps_baseline_first_step_new_connection_ms",
        "steps_stop_to_promoted_ms",
        "steps_promoted_to_first_step_completed_ms",
    ):
        print(f"{name:<48} {col(name)}")
    for r in results:
        print(
            f"lost holders {r['lost_holders']}: refused {r['lost_holders_refused']}; "
            f"tokens before <= {r['tokens_before_max']}, after >= {r['tokens_after_min']}"
        )
        print(
            f"runs completed {r['runs_completed']} of {r['runs_started']} started; "
            f"lost step claims {r['lost_claims']}: refused {r['lost_claims_refused']}, "
            f"results stored {r['lost_results_stored']}; claim tokens before <= "
            f"{r['claim_tokens_before_max']}, after >= {r['claim_tokens_after_min']}"
        )
    print(json.dumps({"trials": results, "keys": args.keys, "runs": args.runs}))
    ok = all(
        r["tokens_rose"]
        and all(v == r["lost_holders"] for v in r["lost_holders_refused"].values())
        and r["claim_tokens_rose"]
        and all(v == r["lost_claims"] for v in r["lost_claims_refused"].values())
        and r["lost_results_stored"] == 0
        for r in results
    )
    return 0 if ok else 1


def use(db: dict[str, Any]) -> None:
    """Point the alias at ``db`` (Django configured on first use)."""
    if not settings.configured:
        settings.configure(
            DATABASES={ALIAS: db},
            INSTALLED_APPS=["pikku_django"],
            USE_TZ=True,
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
            PIKKU={"LEASE_BACKEND": "database"},
        )
        django.setup()
    else:
        from django.db import connections

        connections[ALIAS].close()
        connections.settings[ALIAS].update(db)


if __name__ == "__main__":
    sys.exit(main())
