"""Where a worker's time goes: py-spy attached to a ``pikku_worker`` process while it runs
a batch, and a summary of the samples of its worker threads (``--profile`` of
``benchmarks/throughput.py``): once in wall time (idle threads too: waits on the
database show), once in CPU (only the thread holding the GIL: where the Python goes,
by phase of the work). Sampling slows the worker, so nothing measured under it is
among the figures."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

log = logging.getLogger("pikku.bench.throughput")


def start_profiler(pid: int, out: Path, *, cpu: bool = False) -> subprocess.Popen[bytes] | None:
    """py-spy recording ``pid`` into ``out``: every thread, idle or not (wall time), or
    with ``cpu`` only the thread holding the GIL (where the worker's Python CPU goes)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        log.warning("--profile: py-spy is not installed (pip install py-spy); no profile")
        return None
    return subprocess.Popen(
        [
            *(exe, "record", "--pid", str(pid), "--gil" if cpu else "--idle"),
            *("--nonblocking", "--rate", "200"),
            *("--format", "raw", "--output", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop_profiler(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


#: The phases of a unit of work, by a function on the stack (the first that matches).
PHASES = (
    ("PassAfterStep.run", "the pass after a step, written with its success"),
    ("claim_due_run_rows", "the due-run claim"),
    ("WorkflowEngine.orchestrate", "a pass claimed apart (a run's first pass, and its insert)"),
    ("execute_step", "a step: its function and its settle"),
    ("claim_due_steps", "the ready-step claim"),
)


def summarise_profile(raw: Path, top: int = 25, *, cpu: bool = False) -> str:
    """Where the worker threads' time went: inclusive share of pikku_django functions
    (``cpu``: of the samples holding the GIL, by phase of the unit of work)."""
    inclusive: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "Worker._loop" not in stack:
            continue  # the main thread's joins, the LISTEN thread, lease renewals
        n = int(count)
        total += n
        frames = stack.split(";")
        seen = set()
        for frame in frames:
            name = frame.split(" (")[0]
            where = frame.split(" (")[-1]
            if "pikku_django/" in where and name not in seen:
                seen.add(name)
                inclusive[name] += n
        leaf = frames[-1]
        if cpu:
            phase = next((what for key, what in PHASES if key in stack), "the worker loop, other")
            categories[phase] += n
        elif "Connection.wait" in stack or "Connection.commit" in stack:
            categories["waiting on PostgreSQL (psycopg Connection.wait)"] += n
        elif "Condition.wait" in leaf or "Event.wait" in leaf or "_wait_for_tstate_lock" in leaf:
            categories["idle or joining a thread"] += n
        elif "django/db/models" in stack:
            categories["Python: Django ORM building and reading queries"] += n
        elif "psycopg/" in stack:
            categories["Python: psycopg adapting and sending"] += n
        else:
            categories["Python: other"] += n
    if not total:
        return "no samples of the worker threads"
    held = " holding the GIL" if cpu else ""
    lines = [f"{total} samples of the worker threads{held} ({raw})"]
    lines += [f"  {n / total:6.1%}  {what}" for what, n in categories.most_common()]
    lines.append("inclusive time of pikku_django functions:")
    lines += [f"  {n / total:6.1%}  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(lines)
