"""The tables, pairings and targets of ``benchmarks/throughput.py``, from the figures
its per-database processes return."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from benchlib import format_table

#: pikku's configuration the targets judge: the one the README recommends for workers.
RECOMMENDED = "pikku_carried_cma60"
MEMORY_TARGET_BYTES_PER_STEP = 50.0
#: The recommended configuration with the Prometheus and Sentry integrations on.
INTEGRATIONS = "pikku_integrations_cma60"


@dataclass(frozen=True)
class Pairing:
    name: str
    ours: str
    theirs: str
    kind: str
    target: float | None


PAIRINGS = (
    Pairing(
        "10 queued steps vs Procrastinate 10-job chains", RECOMMENDED, "procrastinate", "chain", 3.0
    ),
    Pairing("10 queued steps vs DBOS 10-step queued workflows", RECOMMENDED, "dbos", "chain", 1.5),
    Pairing(
        "1 queued step vs Procrastinate single jobs", RECOMMENDED, "procrastinate", "single", 2.0
    ),
    Pairing("inline steps vs DBOS direct workflows", RECOMMENDED, "dbos", "inline", 2.0),
    Pairing("1 queued step vs PgQueuer single jobs", RECOMMENDED, "pgqueuer", "single", 1.0),
    Pairing("10 queued steps vs PgQueuer 10-job chains", RECOMMENDED, "pgqueuer", "chain", None),
    Pairing("10 queued steps vs django-absurd 10-step tasks", RECOMMENDED, "absurd", "chain", 2.0),
    Pairing("1 queued step vs django-absurd 1-step tasks", RECOMMENDED, "absurd", "single", None),
    # For information: the same with Django's default CONN_MAX_AGE, and carrying off.
    Pairing(
        "CONN_MAX_AGE=0: 10 queued steps vs Procrastinate chains",
        "pikku_carried_cma0",
        "procrastinate",
        "chain",
        None,
    ),
    Pairing(
        "CONN_MAX_AGE=0: 10 queued steps vs DBOS queued",
        "pikku_carried_cma0",
        "dbos",
        "chain",
        None,
    ),
    Pairing(
        "CONN_MAX_AGE=0: 1 queued step vs Procrastinate jobs",
        "pikku_carried_cma0",
        "procrastinate",
        "single",
        None,
    ),
    Pairing("CONN_MAX_AGE=0: inline vs DBOS direct", "pikku_carried_cma0", "dbos", "inline", None),
    Pairing(
        "carrying off: 10 queued steps vs Procrastinate chains",
        "pikku_claimed_cma60",
        "procrastinate",
        "chain",
        None,
    ),
    Pairing(
        "carrying off: 10 queued steps vs DBOS queued", "pikku_claimed_cma60", "dbos", "chain", None
    ),
    Pairing(
        "carried vs carrying off (CONN_MAX_AGE=60)",
        RECOMMENDED,
        "pikku_claimed_cma60",
        "chain",
        None,
    ),
    Pairing(
        "carried vs carrying off (CONN_MAX_AGE=0)",
        "pikku_carried_cma0",
        "pikku_claimed_cma0",
        "chain",
        None,
    ),
    Pairing(
        "CONN_MAX_AGE 60 vs 0, 10 queued steps", RECOMMENDED, "pikku_carried_cma0", "chain", None
    ),
    Pairing(
        "CONN_MAX_AGE 60 vs 0, 1 queued step", RECOMMENDED, "pikku_carried_cma0", "single", None
    ),
    Pairing("CONN_MAX_AGE 60 vs 0, inline", RECOMMENDED, "pikku_carried_cma0", "inline", None),
    # --integrations: the Prometheus metrics and Sentry reports on, next to off.
    Pairing("integrations on vs off, 10 queued steps", INTEGRATIONS, RECOMMENDED, "chain", 0.95),
    Pairing("integrations on vs off, 1 queued step", INTEGRATIONS, RECOMMENDED, "single", 0.95),
)


def best(db: dict[str, Any], key: str, kind: str) -> dict[str, Any] | None:
    """The concurrency with the highest median of ``key``'s ``kind``, and its summary."""
    by_c = db.get("throughput", {}).get(key, {}).get(kind)
    if not by_c:
        return None
    c, summary = max(by_c.items(), key=lambda item: item[1]["median"])
    return {"concurrency": int(c), **summary}


def judge(results: dict[str, Any]) -> dict[str, Any]:
    """Every pairing of every database with both sides measured; targets met or not."""
    out: dict[str, Any] = {"pairings": [], "memory": None}
    for database, db in results.items():
        if "skipped" in db:
            continue
        for p in PAIRINGS:
            ours, theirs = best(db, p.ours, p.kind), best(db, p.theirs, p.kind)
            if ours is None or theirs is None or not theirs["median"]:
                continue
            ratio = ours["median"] / theirs["median"]
            out["pairings"].append(
                {
                    "database": database,
                    "pairing": p.name,
                    "kind": p.kind,
                    "ours": p.ours,
                    "theirs": p.theirs,
                    "ours_best": ours,
                    "theirs_best": theirs,
                    "ratio": round(ratio, 3),
                    "target": p.target,
                    "met": None if p.target is None else ratio >= p.target,
                    "missed_by_pct": None
                    if p.target is None or ratio >= p.target
                    else round((1 - ratio / p.target) * 100, 1),
                }
            )
        out["pairings"] += latency_pairings(database, db)
        memory = db.get("memory")
        if memory and memory.get("slope_last_half_bytes_per_step") is not None:
            slope = memory["slope_last_half_bytes_per_step"]
            out["memory"] = {
                "slope_last_half_bytes_per_step": slope,
                "target": f"< {MEMORY_TARGET_BYTES_PER_STEP:g}",
                "met": slope < MEMORY_TARGET_BYTES_PER_STEP,
            }
    return out


def latency_pairings(database: str, db: dict[str, Any]) -> list[dict[str, Any]]:
    """pikku's idle-worker latencies (p50) over each peer's, for information: below 1
    is faster."""
    out = []
    latency = db.get("latency", {})
    for ours in (RECOMMENDED, "pikku_carried_cma0"):
        for theirs in ("procrastinate", "dbos", "pgqueuer", "absurd"):
            if ours not in latency or theirs not in latency:
                continue
            for what in ("stored_to_first_step", "step_to_step"):
                a, b = latency[ours][what], latency[theirs][what]
                if not a or not b or not b["p50_ms"]:
                    continue
                out.append(
                    {
                        "database": database,
                        "pairing": f"latency {what.replace('_', ' ')} p50, {ours} vs {theirs}",
                        "kind": f"latency_{what}",
                        "ours": ours,
                        "theirs": theirs,
                        "ours_best": {"median": a["p50_ms"], "unit": "ms"},
                        "theirs_best": {"median": b["p50_ms"], "unit": "ms"},
                        "ratio": round(a["p50_ms"] / b["p50_ms"], 3),
                        "target": None,
                        "met": None,
                        "missed_by_pct": None,
                    }
                )
    return out


def _label(db: dict[str, Any], key: str) -> str:
    return db["systems"].get(key, {}).get("label", key)


def render(results: dict[str, Any], targets: dict[str, Any], args: argparse.Namespace) -> str:
    out: list[str] = []
    sweep = [str(c) for c in args.concurrency]
    for database, db in results.items():
        out.append(f"== {database}")
        if "skipped" in db:
            out += [f"skipped: {db['skipped']}", ""]
            continue
        server = ", ".join(f"{k} {v}" for k, v in db["server"].items())
        out.append(f"server: {server}")
        rows = []
        for key, info in db["systems"].items():
            if info["unavailable"]:
                out.append(f"{info['label']}: {info['unavailable']}")
                continue
            for kind, by_c in db["throughput"].get(key, {}).items():
                top = best(db, key, kind)
                assert top is not None
                cells = [_summary(by_c.get(c)) for c in sweep]
                top_text = f"{top['median']:.1f} @ {top['concurrency']}"
                rows.append((info["label"], kind, *cells, top_text))
        header = ("system", "kind", *(f"steps/s @ {c}" for c in sweep), "best")
        out += [format_table(header, rows), ""]
        pairs = [p for p in targets["pairings"] if p["database"] == database]
        for p in pairs:
            if "unavailable" in p:  # throughput.py --pooler: a system that could not run
                out.append(f"{p['pairing']}: not measured: {p['unavailable']}")
                continue
            verdict = ""
            if p["target"] is not None:
                verdict = (
                    f"  target >= {p['target']:g}: met"
                    if p["met"]
                    else f"  target >= {p['target']:g}: MISSED by {p['missed_by_pct']:.1f}%"
                )
            a, b = p["ours_best"], p["theirs_best"]
            left, right = (
                (
                    f"{a['median']:.1f} @ {a['concurrency']}",
                    f"{b['median']:.1f} @ {b['concurrency']}",
                )
                if "concurrency" in a
                else (f"{a['median']:.2f} ms", f"{b['median']:.2f} ms")
            )
            out.append(f"{p['pairing']}: {left} / {right} = {p['ratio']:.2f}x{verdict}")
        if db.get("transactions_per_unit"):
            trows = [
                (_label(db, key), kind, f"{s['median']:.2f}")
                for key, kinds in db["transactions_per_unit"].items()
                for kind, s in kinds.items()
            ]
            out += [
                "",
                "server transactions per unit (run, chain or job), median over the sweep:",
                format_table(("system", "kind", "transactions"), trows),
            ]
        if db.get("worker_cpu_ms_per_unit"):
            wrows = [
                (_label(db, key), kind, _summary(s, "{:.2f}"))
                for key, kinds in db["worker_cpu_ms_per_unit"].items()
                for kind, s in kinds.items()
            ]
            out += [
                "",
                "worker CPU per unit (ms a run, chain or job, user + system of the worker",
                "processes across the batch), median (min-max) over the sweep:",
                format_table(("system", "kind", "ms"), wrows),
            ]
        if db.get("bulk"):
            from throughput_bulk import render_bulk

            out += render_bulk(db["bulk"])
        if db.get("store_cpu_us_per_unit"):
            srows = [
                (_label(db, key), kind, f"{s['median']:.0f}")
                for key, kinds in db["store_cpu_us_per_unit"].items()
                for kind, s in kinds.items()
            ]
            out += [
                "",
                "CPU to store a unit in the benchmark's process (µs a run, chain or job; pikku:",
                "start_workflow per run in one transaction, which finds its first step;",
                "Procrastinate: one batch_defer; DBOS: one client enqueue per workflow), median:",
                format_table(("system", "kind", "µs"), srows),
            ]
        if db.get("latency"):
            lrows = []
            for key, lat in db["latency"].items():
                first, gap = lat["stored_to_first_step"], lat["step_to_step"]
                lrows.append(
                    (
                        _label(db, key),
                        f"{first['p50_ms']:.1f} / {first['p95_ms']:.1f} ms (n={first['n']})",
                        f"{gap['p50_ms']:.1f} / {gap['p95_ms']:.1f} ms" if gap else "-",
                    )
                )
            concurrency = next(iter(db["latency"].values()))["concurrency"]
            out += [
                "",
                f"latency, one unit at a time on an idle worker (concurrency {concurrency}):",
                format_table(
                    ("system", "stored to first step p50 / p95", "step to step p50 / p95"), lrows
                ),
            ]
        memory = db.get("memory")
        if memory:
            slope = memory["slope_last_half_bytes_per_step"]
            mb = {k: memory[k] / 1024 for k in ("rss_start_kb", "rss_end_kb", "peak_rss_kb")}
            out.append(
                f"worker memory over {memory['steps']:,} steps (9 in 10 queued, "
                f"{memory['payload_bytes']} B payloads): VmRSS {mb['rss_start_kb']:.1f} MB"
                f" -> {mb['rss_end_kb']:.1f} MB, peak {mb['peak_rss_kb']:.1f} MB;"
                f" slope over the last half {slope if slope is not None else float('nan'):.1f}"
                f" bytes/step (target < {MEMORY_TARGET_BYTES_PER_STEP:g})"
            )
        for kind, text in db.get("profile", {}).items():
            out += [f"profile, pikku {kind} (CONN_MAX_AGE=60): {text}"]
        out.append("")
    out.append(
        f"{args.runs} units x {args.steps} steps per batch (1-step kind: {args.runs * args.steps}"
        f" units); median (min-max) of {args.repeat} interleaved repeat(s); "
        f"{args.processes} process(es) per system; warm-up {args.warmup} units per kind"
    )
    return "\n".join(out)


def _summary(s: dict[str, Any] | None, fmt: str = "") -> str:
    """A median with its range (``fmt`` for all three; else 1 and 0 decimals)."""
    if not s:
        return "-"
    if len(s["repeats"]) == 1:
        return (fmt or "{:.1f}").format(s["median"])
    low, high = (fmt or "{:.0f}").format(s["min"]), (fmt or "{:.0f}").format(s["max"])
    return f"{(fmt or '{:.1f}').format(s['median'])} ({low}-{high})"
