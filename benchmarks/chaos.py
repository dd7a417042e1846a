"""A chaos run on PostgreSQL: workers SIGKILLed and SIGSTOPped while runs proceed.

``--runs`` runs (default 300) of the ``bench.chaos`` workflow (``benchmarks/bench_app``),
each of 5 steps that work for a random 50-500 ms (``--step-ms``); steps 0, 2 and 4
are transactional (they write a ``ChaosEffect`` row inside the step's transaction),
1 and 3 plain. Every execution of a step function records itself at its start in
``ChaosExecution`` (pid, thread, start, and a fresh nonce that the step also
returns) through a connection of its own in autocommit, so a rollback or a kill
does not lose it.

``--workers`` (3) ``pikku_worker`` processes with ``--concurrency`` (4) threads run
them, with a short step lease (``--lease-ms``, 3000). For ``--seconds`` (30), or
until every run has ended: worker A is SIGKILLed and restarted every
``--kill-every`` seconds on average (3; each wait drawn from 0.5x-1.5x), and worker
B is SIGSTOPped every ``--stop-every`` seconds (8) for ``--stop-for`` seconds
(lease + 1.5 s), past its step lease, then SIGCONTinued. Then the script waits for
every run to end (the drain) and checks the rows:

1. runs completed: every run, none failed, suspended or still running;
2. results from a superseded attempt: 0. For each step, the StepAttempt history
   must hold exactly one succeeded attempt, the step's current one; the stored
   result's nonce must name an execution run by that attempt's worker (the pid
   and thread in ``StepAttempt.worker``) that started inside that attempt
   (between its ``started_at`` and ``finished_at``). A result written by an
   attempt that was replaced names another thread, or an earlier start;
3. transactional steps whose effect happened other than once: 0. Exactly one
   ``ChaosEffect`` row per transactional step, carrying the stored result's nonce;
4. each run's output is its steps' stored results.

It prints the time to drain (from the end of the chaos to the last run's end),
the kills and stops, and how many steps ran more than once (allowed: plain steps
are at-least-once, and a transactional step's superseded execution rolls back),
then one JSON object. Exit status 1 if a check fails.

The workers run with ``RUN_LEASE_MS`` = the step lease, ``RUN_PASS_TIMEOUT`` 5 s,
``RECOVERY_INTERVAL`` 2 s and ``STALLED_RUN_AFTER`` 5 s (``--pass-timeout``,
``--recovery-interval``, ``--stalled-after``): with the defaults (30 s, 300 s, 30 s,
300 s) a pass cut short by a kill is retried only after 5 minutes, which would be
the drain time. Run it from the repository root:

    .venv/bin/python benchmarks/chaos.py
    .venv/bin/python benchmarks/chaos.py --runs 1000 --seconds 120

The database is ``PIKKU_BENCH_WORKFLOWS_URL`` (default
postgres://postgres@127.0.0.1:5432/pikku_bench_workflows); chaos rows left by an
earlier run are deleted first. Progress goes to stderr; stdout gets the report
and, last, one JSON object. A default run takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from benchlib import (
    BENCH_DIR,
    BenchError,
    Processes,
    django_env,
    ensure_database,
    listening_sessions,
    machine,
    vacuum,
    wait_for,
)

log = logging.getLogger("pikku.bench.chaos")

SETTINGS = "bench_settings"
WORKFLOW = "bench.chaos"
WORKFLOWS_URL = os.environ.get(
    "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_workflows"
)
#: How far apart two clocks of this host may read the same instant (none, here).
CLOCK_SLACK = timedelta(milliseconds=5)


@dataclass
class Chaos:
    """What was done to the workers."""

    kills: list[float] = field(default_factory=list)  # seconds since the start
    stops: list[tuple[float, float]] = field(default_factory=list)  # (stopped, continued)
    started: float = 0.0
    chaos_ended: float = 0.0
    drained: float = 0.0


# -- the run ---------------------------------------------------------------------------------------


def reset() -> str:
    from bench_app.models import ChaosEffect, ChaosExecution
    from django.core.management import call_command
    from django.db import connection

    from pikku_django.models import WorkflowRun

    call_command("migrate", verbosity=0)
    vacuum(WORKFLOWS_URL)
    WorkflowRun.objects.filter(workflow=WORKFLOW).delete()
    ChaosEffect.objects.all().delete()
    ChaosExecution.objects.all().delete()
    others = WorkflowRun.objects.filter(status="running").count()
    if others:
        log.warning("%d other running run(s) in this database: the workers will run them", others)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return str(cursor.fetchone()[0])


def start_runs(args: argparse.Namespace) -> list[Any]:
    from django.db import transaction

    from pikku_django.workflows import WorkflowEngine

    rng = random.Random(args.seed)
    low, high = args.step_ms
    engine = WorkflowEngine()
    with transaction.atomic():
        return [
            engine.start(
                WORKFLOW, {"db": "default", "ms": [rng.randint(low, high) for _ in range(5)]}
            ).id
            for _ in range(args.runs)
        ]


def open_runs(ids: list[Any]) -> int:
    from pikku_django.models import RunStatus, WorkflowRun

    return WorkflowRun.objects.filter(id__in=ids, status=RunStatus.RUNNING).count()


def run_chaos(args: argparse.Namespace, procs: Processes) -> tuple[list[Any], Chaos, int]:
    """Start the workers and the runs, do the chaos, drain; the run ids, what was done,
    and how many workers were started in all."""
    rng = random.Random(args.seed + 1)
    names = [f"worker-{i}" for i in range(args.workers)]
    killed_name, stopped_name = names[0], names[1 % len(names)]
    generation = 0

    def start(name: str) -> None:
        nonlocal generation
        generation += 1
        procs.start_pikku_worker(name, args.concurrency)

    for name in names:
        start(name)
    wait_for(
        lambda: listening_sessions(WORKFLOWS_URL, "pikku_work") >= len(names),
        60,
        "the workers to listen",
        every=0.1,
    )
    chaos = Chaos()
    ids = start_runs(args)
    t0 = chaos.started = time.monotonic()
    log.info("started %d runs; chaos for %gs", len(ids), args.seconds)

    def draw(mean: float) -> float:
        return rng.uniform(0.5 * mean, 1.5 * mean)

    next_kill = t0 + draw(args.kill_every) if args.kill_every > 0 else float("inf")
    next_stop = t0 + draw(args.stop_every) if args.stop_every > 0 else float("inf")
    resume_at: float | None = None
    last_poll = 0.0
    left = len(ids)
    while True:
        now = time.monotonic()
        if now - t0 >= args.seconds or left == 0:
            break
        if resume_at is not None and now >= resume_at:
            procs.signal(stopped_name, signal.SIGCONT)
            chaos.stops[-1] = (chaos.stops[-1][0], round(now - t0, 3))
            log.info("  %6.2fs SIGCONT %s", now - t0, stopped_name)
            resume_at = None
            next_stop = now + draw(args.stop_every)
        if now >= next_kill:
            procs.signal(killed_name, signal.SIGKILL)
            procs.procs[killed_name].wait()
            procs.stop(killed_name)
            start(killed_name)
            chaos.kills.append(round(now - t0, 3))
            log.info("  %6.2fs SIGKILL %s, restarted", now - t0, killed_name)
            next_kill = now + draw(args.kill_every)
        if resume_at is None and now >= next_stop and stopped_name != killed_name:
            procs.signal(stopped_name, signal.SIGSTOP)
            chaos.stops.append((round(now - t0, 3), -1.0))
            log.info("  %6.2fs SIGSTOP %s for %gs", now - t0, stopped_name, args.stop_for)
            resume_at = now + args.stop_for
            next_stop = float("inf")
        for name in names:
            if name != killed_name:
                procs.check_alive(name)
        if now - last_poll >= 0.25:
            last_poll = now
            left = open_runs(ids)
        time.sleep(0.02)
    if resume_at is not None:
        procs.signal(stopped_name, signal.SIGCONT)
        chaos.stops[-1] = (chaos.stops[-1][0], round(time.monotonic() - t0, 3))
    chaos.chaos_ended = time.monotonic() - t0
    log.info("chaos over at %.1fs; %d runs still running: draining", chaos.chaos_ended, left)
    wait_for(lambda: open_runs(ids) == 0, args.timeout, "every run to end", every=0.05)
    chaos.drained = time.monotonic() - t0
    log.info("drained at %.1fs", chaos.drained)
    return ids, chaos, generation


# -- the checks -----------------------------------------------------------------------------------


def worker_thread(worker: str) -> tuple[int, int] | None:
    """(pid, thread ident) from a StepAttempt's worker, ``host:pid:thread``."""
    try:
        _, pid, thread = worker.rsplit(":", 2)
        return int(pid), int(thread)
    except ValueError:
        return None


def check(ids: list[Any]) -> dict[str, Any]:
    from bench_app.models import ChaosEffect, ChaosExecution
    from bench_app.workflows import chaos_function

    from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowRun, WorkflowStep

    runs = {r.id: r for r in WorkflowRun.objects.filter(id__in=ids)}
    statuses = Counter(r.status for r in runs.values())
    steps = list(WorkflowStep.objects.filter(run_id__in=ids).order_by("run_id", "id"))
    attempts: dict[int, list[StepAttempt]] = defaultdict(list)
    for a in StepAttempt.objects.filter(step__run_id__in=ids).order_by("attempt"):
        attempts[a.step_id].append(a)
    executions = {e.nonce: e for e in ChaosExecution.objects.filter(run_id__in=map(str, ids))}
    runs_per_step: Counter[tuple[str, str]] = Counter(
        (e.run_id, e.step) for e in executions.values()
    )
    effects: dict[tuple[str, str], list[ChaosEffect]] = defaultdict(list)
    for effect in ChaosEffect.objects.filter(run_id__in=map(str, ids)):
        effects[(effect.run_id, effect.step)].append(effect)

    problems: list[str] = []
    superseded_results = 0
    effects_not_once = 0
    unsettled = 0
    outputs_wrong = 0
    by_run: dict[Any, list[WorkflowStep]] = defaultdict(list)
    for step in steps:
        by_run[step.run_id].append(step)
        key = (str(step.run_id), step.name)
        if step.status != StepStatus.SUCCEEDED:
            unsettled += 1
            problems.append(f"step {key} is {step.status}")
            continue
        won = [a for a in attempts[step.id] if a.status == StepStatus.SUCCEEDED]
        result = step.result if isinstance(step.result, dict) else {}
        execution = executions.get(result.get("nonce", ""))
        who = worker_thread(won[0].worker) if len(won) == 1 else None
        reason = None
        if len(won) != 1 or won[0].attempt != step.attempt:
            reason = f"succeeded attempts {[a.attempt for a in won]}, current {step.attempt}"
        elif execution is None:
            reason = f"its result {result} names no recorded execution"
        elif who is None:
            reason = f"attempt worker {won[0].worker!r} has no pid:thread"
        elif (execution.pid, execution.thread) != who:
            reason = (
                f"result by {execution.pid}:{execution.thread}, but attempt {won[0].attempt} "
                f"ran in {who[0]}:{who[1]}"
            )
        elif not (
            won[0].started_at - CLOCK_SLACK
            <= execution.started_at
            <= (won[0].finished_at or execution.started_at) + CLOCK_SLACK
        ):
            reason = (
                f"result's execution started {execution.started_at:%H:%M:%S.%f}, outside "
                f"attempt {won[0].attempt} ({won[0].started_at:%H:%M:%S.%f}-"
                f"{won[0].finished_at:%H:%M:%S.%f})"
            )
        if reason:
            superseded_results += 1
            problems.append(f"step {key}: {reason}")
        if step.function == chaos_function(0):
            mine = effects.get(key, [])
            if len(mine) != 1 or mine[0].nonce != result.get("nonce"):
                effects_not_once += 1
                problems.append(
                    f"transactional step {key}: {len(mine)} effect row(s), nonces "
                    f"{[e.nonce for e in mine]}, result nonce {result.get('nonce')}"
                )
    for run_id, run in runs.items():
        if run.status != RunStatus.COMPLETED:
            problems.append(f"run {run_id} is {run.status}: {run.error or run.suspend_reason}")
            continue
        if run.output != [s.result for s in by_run[run_id]] or len(by_run[run_id]) != 5:
            outputs_wrong += 1
            problems.append(f"run {run_id}: output is not its steps' results")
    all_attempts = [a for group in attempts.values() for a in group]
    return {
        "runs": len(ids),
        "runs_completed": statuses.get(RunStatus.COMPLETED, 0),
        "runs_by_status": dict(statuses),
        "steps": len(steps),
        "steps_not_succeeded": unsettled,
        "results_from_superseded_attempt": superseded_results,
        "transactional_steps": sum(1 for s in steps if s.function == chaos_function(0)),
        "transactional_effects_not_exactly_once": effects_not_once,
        "run_outputs_not_matching_steps": outputs_wrong,
        "attempts": len(all_attempts),
        "steps_with_more_than_one_attempt": sum(1 for g in attempts.values() if len(g) > 1),
        "attempts_not_succeeded": sum(1 for a in all_attempts if a.status != StepStatus.SUCCEEDED),
        "executions": len(executions),
        "steps_executed_more_than_once": sum(1 for n in runs_per_step.values() if n > 1),
        "problems": problems[:50],
    }


def passed(result: dict[str, Any]) -> bool:
    return (
        result["runs_completed"] == result["runs"]
        and result["steps_not_succeeded"] == 0
        and result["results_from_superseded_attempt"] == 0
        and result["transactional_effects_not_exactly_once"] == 0
        and result["run_outputs_not_matching_steps"] == 0
    )


def report_text(result: dict[str, Any], chaos: Chaos, args: argparse.Namespace) -> str:
    ok = {True: "ok", False: "FAILED"}
    lines = [
        f"chaos run: {args.runs} runs x 5 steps (3 transactional, 2 plain), {args.workers} "
        f"workers x {args.concurrency} threads, step lease {args.lease_ms} ms",
        f"chaos for {chaos.chaos_ended:.1f} s: {len(chaos.kills)} SIGKILL+restart of worker A, "
        f"{len(chaos.stops)} SIGSTOP of worker B for {args.stop_for:g} s each",
        "",
        f"runs completed:                                {result['runs_completed']} / "
        f"{result['runs']}  {ok[result['runs_completed'] == result['runs']]}"
        f"  {result['runs_by_status']}",
        f"results from a superseded attempt:             "
        f"{result['results_from_superseded_attempt']}  "
        f"{ok[result['results_from_superseded_attempt'] == 0]}",
        f"transactional effects not exactly once:        "
        f"{result['transactional_effects_not_exactly_once']} of "
        f"{result['transactional_steps']}  "
        f"{ok[result['transactional_effects_not_exactly_once'] == 0]}",
        f"run outputs not matching their steps:          "
        f"{result['run_outputs_not_matching_steps']}  "
        f"{ok[result['run_outputs_not_matching_steps'] == 0]}",
        f"time to drain (chaos over -> last run ended):  "
        f"{chaos.drained - chaos.chaos_ended:.2f} s (all runs: {chaos.drained:.2f} s)",
        f"steps with more than one attempt:              "
        f"{result['steps_with_more_than_one_attempt']} of {result['steps']} "
        f"({result['attempts']} attempts, {result['attempts_not_succeeded']} not succeeded)",
        f"steps whose function ran more than once:       "
        f"{result['steps_executed_more_than_once']} ({result['executions']} executions; "
        "at-least-once, superseded transactional ones rolled back)",
        "",
        f"result: {'PASSED' if passed(result) else 'FAILED'}",
    ]
    if result["problems"]:
        lines += ["", "problems (first 50):", *(f"  {p}" for p in result["problems"])]
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=300, help="workflow runs (300)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of chaos (30)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (3)")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker (4)")
    parser.add_argument("--lease-ms", type=int, default=3000, help="STEP_LEASE_MS (3000)")
    parser.add_argument("--kill-every", type=float, default=3.0, help="mean seconds (3)")
    parser.add_argument("--stop-every", type=float, default=8.0, help="mean seconds (8)")
    parser.add_argument(
        "--stop-for", type=float, default=None, help="seconds stopped (lease + 1.5 s)"
    )
    parser.add_argument("--step-ms", default="50,500", help="step work range in ms (50,500)")
    parser.add_argument("--pass-timeout", type=float, default=5.0, help="RUN_PASS_TIMEOUT (5)")
    parser.add_argument("--recovery-interval", type=float, default=2.0, help="(2)")
    parser.add_argument("--stalled-after", type=float, default=5.0, help="(5)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="drain timeout (300)")
    args = parser.parse_args(argv)
    try:
        low, high = (int(x) for x in args.step_ms.split(","))
    except ValueError:
        parser.error("--step-ms is LOW,HIGH in milliseconds")
    args.step_ms = (low, high)
    if args.stop_for is None:
        args.stop_for = args.lease_ms / 1000 + 1.5
    if args.runs < 1 or args.workers < 2 or args.concurrency < 1 or not 0 <= low <= high:
        parser.error("--runs >= 1, --workers >= 2, --concurrency >= 1, 0 <= LOW <= HIGH")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[chaos] %(message)s")

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    env = django_env(
        SETTINGS,
        {
            "PIKKU_BENCH_WORKFLOWS_URL": WORKFLOWS_URL,
            "PIKKU_BENCH_STEP_LEASE_MS": str(args.lease_ms),
            "PIKKU_BENCH_RUN_LEASE_MS": str(args.lease_ms),
            "PIKKU_BENCH_RUN_PASS_TIMEOUT": repr(args.pass_timeout),
            "PIKKU_BENCH_RECOVERY_INTERVAL": repr(args.recovery_interval),
            "PIKKU_BENCH_STALLED_RUN_AFTER": repr(args.stalled_after),
            "PIKKU_BENCH_POLL": "0.2",
            "PIKKU_BENCH_LOG_LEVEL": "WARNING",
        },
    )
    os.environ.update(env)
    try:
        ensure_database(WORKFLOWS_URL)
        import django

        django.setup()
        logging.getLogger("pikku_django").setLevel(logging.WARNING)
        server = reset()
    except Exception as exc:
        log.error("PostgreSQL set-up failed (%s: %s)", type(exc).__name__, exc)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="pikku-bench-chaos-"))
    procs = Processes(tmp, env)
    try:
        ids, chaos, started = run_chaos(args, procs)
    except BenchError as exc:
        log.error("%s", exc)
        for name in procs.procs:
            log.error("--- %s:\n%s", name, procs.tail(name))
        return 1
    except KeyboardInterrupt:
        log.error("interrupted: stopping the workers")
        return 130
    finally:
        procs.stop_all()
        from django.db import connections

        connections.close_all()
    refused = sum(
        len(re.findall(r"not (?:be )?recorded", path.read_text(errors="replace")))
        for path in tmp.glob("*.log")
    )
    shutil.rmtree(tmp, ignore_errors=True)
    result = check(ids)
    print(report_text(result, chaos, args))
    print(
        json.dumps(
            {
                "benchmark": "pikku_django chaos: SIGKILL and SIGSTOP of workers mid-run",
                "settings": {
                    "runs": args.runs,
                    "steps_per_run": 5,
                    "workers": args.workers,
                    "concurrency": args.concurrency,
                    "step_lease_ms": args.lease_ms,
                    "run_lease_ms": args.lease_ms,
                    "run_pass_timeout_s": args.pass_timeout,
                    "recovery_interval_s": args.recovery_interval,
                    "stalled_run_after_s": args.stalled_after,
                    "seconds": args.seconds,
                    "kill_every_s": args.kill_every,
                    "stop_every_s": args.stop_every,
                    "stop_for_s": args.stop_for,
                    "step_ms": list(args.step_ms),
                    "seed": args.seed,
                },
                "machine": machine(server),
                "chaos": {
                    "kills_at_s": chaos.kills,
                    "stops_at_s": chaos.stops,
                    "chaos_seconds": round(chaos.chaos_ended, 3),
                    "all_runs_ended_s": round(chaos.drained, 3),
                    "drain_s": round(chaos.drained - chaos.chaos_ended, 3),
                    "worker_processes_started": started,
                    "late_outcomes_refused_in_logs": refused,
                },
                "checks": {k: v for k, v in result.items() if k != "problems"},
                "problems": result["problems"],
                "passed": passed(result),
            }
        )
    )
    return 0 if passed(result) else 1


if __name__ == "__main__":
    sys.exit(main())
