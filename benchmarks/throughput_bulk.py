"""The bulk pairing of ``benchmarks/throughput.py`` (PostgreSQL, with PgQueuer):
``--bulk`` (10,000) one-step units started at once, PgQueuer's batch enqueue of all
of them in one call against pikku starting them one ``start_workflow`` call (and
transaction) at a time (pikku has no bulk start yet), and PgQueuer one enqueue call
at a time; and one call of each, timed from the same client machine.

Each side gets one worker of the sweep's first concurrency; each figure is measured
``--repeat`` times, in an order rotated each repeat. "started/s" is the units over
the wall time of the start calls alone; "units/s" is from the first start call to
the last unit's end. pikku's ">= 10x one by one" target waits for a bulk start (none
yet); the bulk ">= 1.0x PgQueuer's batch enqueue" target is judged on pikku one by one.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from benchlib import Processes
from figures import Summary, rotations
from throughput_peers import PgQueuer, worker_cpu_s
from throughput_systems import QUEUED, Batch, Kind, Pikku, System

log = logging.getLogger("pikku.bench.throughput")


class PikkuOneByOne(Pikku):
    """pikku runs of one queued step, each started by its own ``start_workflow`` call."""

    last: dict[str, Any] = {}  # noqa: RUF012 (replaced, never mutated)

    def batch(self, kind: Kind, units: int, steps: int) -> Batch:
        from pikku_django.workflows.api import start_workflow

        began = time.time()
        cpu, wall = time.thread_time(), time.perf_counter()
        ids = [start_workflow(QUEUED, {"steps": 1}).id for _ in range(units)]
        call_us = (time.perf_counter() - wall) * 1e6 / units
        store_us = (time.thread_time() - cpu) * 1e6 / units
        committed = time.time()
        self.last = {"began": began, "committed": committed, "call_us": call_us}
        self.wait(ids)
        from throughput_systems import pikku_end

        return Batch(units, pikku_end(ids) - committed, store_us)


class PgQueuerOneByOne(PgQueuer):
    """PgQueuer single jobs, each enqueued by its own call."""

    def batch(self, kind: Kind, units: int, steps: int) -> Batch:
        return self.one_by_one(units)[0]


def measure_bulk(
    procs: Processes, args: argparse.Namespace, pgqueuer: PgQueuer, counted: Any
) -> dict[str, Any]:
    """Every side of the bulk pairing, ``--repeat`` times; their summaries."""
    from throughput_run import clear_pikku

    ours = PikkuOneByOne(
        "pikku_one_by_one",
        "pikku, start_workflow one by one",
        procs,
        args.timeout,
        conn_max_age=60,
        carry=True,
        carry_setting=None,
        poll=1.0,
        kinds=(Kind.SINGLE,),
    )
    batch = PgQueuer(
        "pgqueuer_batch", "PgQueuer, one batch enqueue", procs, args.timeout, pgqueuer.url
    )
    each = PgQueuerOneByOne(
        "pgqueuer_one_by_one", "PgQueuer, enqueue one by one", procs, args.timeout, pgqueuer.url
    )
    sides: list[System] = [ours, batch, each]
    units, concurrency = args.bulk, args.concurrency[0]
    figures: dict[str, dict[str, list[float]]] = {s.key: {} for s in sides}
    for r, order in rotations(sides, args.repeat):
        for side in order:
            clear_pikku()
            pgqueuer.clear()
            log.info("bulk repeat %d/%d: %s, %d units", r + 1, args.repeat, side.label, units)
            side.start(concurrency, 1)
            try:
                side.batch(Kind.SINGLE, max(1, args.warmup), 1)
                cpu = worker_cpu_s(procs, side.names)
                if args.transactions:
                    done, tx = counted(side, Kind.SINGLE, units, 1)
                    figures[side.key].setdefault("transactions_per_unit", []).append(tx)
                else:
                    done = side.batch(Kind.SINGLE, units, 1)
                cpu = worker_cpu_s(procs, side.names) - cpu
            finally:
                side.stop()
            out = figures[side.key]
            last: dict[str, Any] = getattr(side, "last", {})
            # From the first start call to the last unit's end.
            total = last["committed"] + done.seconds - last["began"]
            out.setdefault("units_per_s", []).append(units / total)
            out.setdefault("worker_cpu_ms_per_unit", []).append(cpu * 1000 / units)
            if done.store_us is not None:
                out.setdefault("store_cpu_us_per_unit", []).append(done.store_us)
            out.setdefault("call_us", []).append(last["call_us"])
            out.setdefault("started_per_s", []).append(1e6 / last["call_us"])
            log.info("  %.1f units/s from first start to last end", units / total)
    return {
        "units": units,
        "concurrency": concurrency,
        "sides": {s.key: s.label for s in sides},
        "figures": {
            key: {name: Summary.of(v).as_json(2) for name, v in by.items()}
            for key, by in figures.items()
        },
    }


def bulk_ratios(bulk: dict[str, Any]) -> list[dict[str, Any]]:
    """The pairings of the bulk phase, ratios of medians (above 1: pikku ahead)."""
    f = bulk["figures"]
    pairs = [
        (
            "started/s: pikku one by one (no bulk start yet) vs PgQueuer batch enqueue",
            "pgqueuer_batch",
            "started_per_s",
            1.0,
        ),
        (
            "units/s, first start to last end: pikku one by one vs PgQueuer batch enqueue",
            "pgqueuer_batch",
            "units_per_s",
            1.0,
        ),
        (
            "units/s, first start to last end: pikku one by one vs PgQueuer one by one",
            "pgqueuer_one_by_one",
            "units_per_s",
            None,
        ),
        (
            "one start_workflow call vs one PgQueuer enqueue call (speed)",
            "pgqueuer_one_by_one",
            "started_per_s",
            1.0,
        ),
    ]
    out = []
    for name, theirs, figure, target in pairs:
        a = f.get("pikku_one_by_one", {}).get(figure)
        b = f.get(theirs, {}).get(figure)
        if not a or not b or not b["median"]:
            continue
        ratio = a["median"] / b["median"]
        out.append(
            {
                "pairing": name,
                "figure": figure,
                "ours": a,
                "theirs": b,
                "ratio": round(ratio, 3),
                "target": target,
                "met": None if target is None else ratio >= target,
            }
        )
    return out


def render_bulk(bulk: dict[str, Any]) -> list[str]:
    def cell(s: dict[str, Any] | None, fmt: str = "{:.1f}") -> str:
        if not s:
            return "-"
        text = fmt.format(s["median"])
        if len(s["repeats"]) > 1:
            text += f" ({fmt.format(s['min'])}-{fmt.format(s['max'])})"
        return text

    from benchlib import format_table

    rows = []
    for key, label in bulk["sides"].items():
        f = bulk["figures"].get(key, {})
        rows.append(
            (
                label,
                cell(f.get("units_per_s")),
                cell(f.get("started_per_s")),
                cell(f.get("call_us"), "{:.0f}"),
                cell(f.get("worker_cpu_ms_per_unit"), "{:.2f}"),
                cell(f.get("transactions_per_unit"), "{:.2f}"),
            )
        )
    header = ("system", "units/s", "started/s", "µs a call", "worker CPU ms/unit", "tx/unit")
    out = [
        "",
        f"bulk: {bulk['units']:,} one-step units at once, one worker of concurrency "
        f"{bulk['concurrency']}, median (min-max):",
        format_table(header, rows),
    ]
    for p in bulk_ratios(bulk):
        verdict = ""
        if p["target"] is not None:
            verdict = f"  target >= {p['target']:g}: " + ("met" if p["met"] else "MISSED")
        out.append(f"{p['pairing']}: {p['ratio']:.2f}x{verdict}")
    return out
