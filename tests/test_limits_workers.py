"""Queue concurrency, rate and per-key limits held by worker processes.

Two pikku_worker processes of four threads each (one on SQLite, which allows one
worker process) run runs of a concurrency-limited queue, a rate-limited queue and
two concurrency keys, drawn by hypothesis; sometimes a worker is SIGKILLed while it
holds slots and another takes over. By the attempt history: no limit is ever
exceeded, each key's runs start in start order, and every run completes.
"""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pikku_django.models import Lease, QueueClaim, RunStatus, StepAttempt, WorkflowRun
from pikku_django.workflows import WorkflowEngine
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

#: Worker processes killed, frozen or racing: their subject does not depend on Django's
#: version (the in-process tests of the same code run in both jobs), so the newest-Django
#: job leaves them out.
pytestmark = pytest.mark.once

RATE_PERIOD = 2.0
#: How much later than its claim an attempt's start may be stamped (a loaded machine).
STAMP_SLACK = timedelta(seconds=0.3)


def _intervals(attempts: list[tuple[datetime, datetime | None]], until: datetime) -> int:
    """The most of ``attempts`` running at one moment (unfinished ones until ``until``)."""
    events: list[tuple[datetime, int]] = []
    for started, finished in attempts:
        events += [(started, 1), (finished or until, -1)]
    most = running = 0
    for _, change in sorted(events):  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most


def _attempts(
    alias: str, dead: tuple[int, datetime] | None = None, **filters: Any
) -> list[tuple[datetime, datetime | None]]:
    """Each attempt's start and end. ``dead``: the pid of a worker SIGKILLed at that
    time, whose attempts ran until then at the latest (a successor closes one when it
    supersedes it, which may be well after its lease lapsed and its slot was free)."""
    rows = StepAttempt.objects.using(alias).filter(**filters).order_by("started_at")
    spans = []
    for started, finished, worker in rows.values_list("started_at", "finished_at", "worker"):
        if dead is not None and f":{dead[0]}:" in worker:
            finished = dead[1] if finished is None else min(finished, dead[1])
        spans.append((started, finished))
    return spans


def _clear(alias: str) -> None:
    WorkflowRun.objects.using(alias).all().delete()
    QueueClaim.objects.using(alias).all().delete()
    Lease.objects.using(alias).filter(key__startswith="pikku-worker:").delete()


@on_databases("sqlite", "postgres", "mariadb")
@pytest.mark.parametrize("kill", [False, True], ids=["", "killed"])
@settings(
    max_examples=2,
    deadline=None,
    # Each example runs worker processes: a failure is reported as found, unshrunk.
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    concurrency=st.integers(1, 3),
    rate=st.integers(2, 4),
    key_limit=st.integers(1, 2),
    runs=st.integers(5, 8),
)
def test_no_limit_is_exceeded_by_worker_processes(
    vendor: str,
    tmp_path: Path,
    concurrency: int,
    rate: int,
    key_limit: int,
    runs: int,
    kill: bool,
) -> None:
    alias = database_alias(vendor)
    _clear(alias)
    out_dir = tmp_path / f"ex{len(list(tmp_path.iterdir()))}"
    out_dir.mkdir()
    engine = WorkflowEngine(alias)
    started: list[WorkflowRun] = []
    for n in range(runs):
        slow = {"started": str(out_dir / f"t{n}"), "seconds": 0.2}
        started.append(engine.start("testapp.slow_one", slow, queue="tight"))
        fast = {"started": str(out_dir / f"r{n}"), "seconds": 0}
        started.append(engine.start("testapp.slow_one", fast, queue="rated"))
        for key in ("k1", "k2"):
            keyed = {"started": str(out_dir / f"{key}-{n}"), "seconds": 0.1}
            started.append(
                engine.start(
                    "testapp.keyed_slow", keyed, concurrency_key=key, concurrency_limit=key_limit
                )
            )
    env = {
        "PIKKU_TEST_QUEUES": json.dumps(
            {"tight": {"concurrency": concurrency}, "rated": {"rate": f"{rate}/{RATE_PERIOD:g}s"}}
        ),
        "PIKKU_TEST_STEP_LEASE_MS": "2000",
        "PIKKU_TEST_RUN_LEASE_MS": "2000",
    }
    processes = 1 if vendor == "sqlite" else 2
    killed_at = dead = None
    if kill:
        doomed = worker_process(alias, "--concurrency", "4", **env)
        wait_for(lambda: any(out_dir.iterdir()), 90, "the first worker to start a step")
        doomed.send_signal(signal.SIGKILL)
        doomed.communicate()
        killed_at = datetime.now().astimezone()
        dead = (doomed.pid, killed_at)
        if vendor == "sqlite":  # its one-worker lease would hold the next one off 30s
            Lease.objects.using(alias).filter(key__startswith="pikku-worker:").delete()
    workers = [
        worker_process(alias, "--until-idle", "--concurrency", "4", **env) for _ in range(processes)
    ]
    outs = [finish(w, timeout=240) for w in workers]
    for code, out in outs:
        assert code == 0, out
    # Nothing lost: every run completed, none added.
    for run in started:
        run.refresh_from_db(using=alias)
        assert run.status == RunStatus.COMPLETED, (run.error, run.key_waiting, outs)
    assert WorkflowRun.objects.using(alias).count() == len(started)
    until = killed_at or datetime.now().astimezone()
    # The queue's concurrency limit.
    assert _intervals(_attempts(alias, dead, step__queue="tight"), until) <= concurrency
    # The rate: any rate + 1 claims of the queue are a period apart.
    starts = [s for s, _ in _attempts(alias, step__queue="rated")]
    assert len(starts) >= runs
    for first, later in zip(starts, starts[rate:], strict=False):
        assert later - first >= timedelta(seconds=RATE_PERIOD) - STAMP_SLACK, starts
    # Each key: at most its limit at once, and (one at a time) in start order.
    for key in ("k1", "k2"):
        keyed = _attempts(alias, dead, step__run__concurrency_key=key)
        assert _intervals(keyed, until) <= key_limit
        first_starts: dict[Any, datetime] = defaultdict(lambda: datetime.max.replace(tzinfo=UTC))
        for run_id, at in (
            StepAttempt.objects.using(alias)
            .filter(step__run__concurrency_key=key)
            .values_list("step__run_id", "started_at")
        ):
            first_starts[run_id] = min(first_starts[run_id], at)
        by_start = [r.id for r in started if r.concurrency_key == key]
        if key_limit == 1:
            assert sorted(by_start, key=lambda r: first_starts[r]) == by_start
