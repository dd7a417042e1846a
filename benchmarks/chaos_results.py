"""What a run of ``benchmarks/chaos.py`` did, what its rows say about every guarantee,
and the report of both."""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

#: How far apart two clocks of this host may read the same instant (none, here).
CLOCK_SLACK = timedelta(milliseconds=5)


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


@dataclass
class Chaos:
    """What was done to the workers."""

    kills: list[float] = field(default_factory=list)  # seconds since the start
    stops: list[tuple[float, float]] = field(default_factory=list)  # (stopped, continued)
    outage: tuple[float, float] | None = None  # (began, ended), seconds since the start
    outage_ended_at: datetime | None = None  # the wall clock, to compare with the rows
    started: float = 0.0
    chaos_ended: float = 0.0
    drained: float = 0.0


# -- the report ----------------------------------------------------------------------------------


def outage_text(chaos: Chaos, args: argparse.Namespace) -> str:
    if chaos.outage is None:
        return "none"
    began, ended = chaos.outage
    return f"{ended - began:.1f} s (from {began:.1f} s to {ended:.1f} s, every worker cut off)"


def seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def report_text(
    result: dict[str, Any], chaos: Chaos, args: argparse.Namespace, first_after: float | None
) -> str:
    ok = {True: "ok", False: "FAILED"}
    lines = [
        f"chaos run on {args.database}: {args.runs} runs x 5 steps (3 transactional, "
        f"2 plain), {args.workers} workers x {args.concurrency} threads, "
        f"step lease {args.lease_ms} ms",
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
        f"database outage:                               {outage_text(chaos, args)}",
        f"end of the outage -> first step completed:     {seconds_text(first_after)}",
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
