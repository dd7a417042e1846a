"""A worker process that SIGKILLs itself between a step's settle and the pass after it,
or (``PIKKU_TEST_KILL_AFTER_BATCH``, :func:`kill_after_batch`) holding a batch it
claimed and has not started.

Enabled in worker processes by ``PIKKU_TEST_KILL_AFTER_SETTLE`` (tests/worker_settings.py),
the path of a marker file: the first step of a ``testapp.settle_then_pass`` run whose
success leaves the run for its own worker's next pass writes the marker (as JSON: the
process, run, step and the wall-clock time of the kill) and kills its process. The
receiver runs after the settle has committed and before the worker's next pass.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.utils import timezone

from pikku_django.models import WorkflowRun
from pikku_django.signals import step_attempt_succeeded

WORKFLOW = "testapp.settle_then_pass"


def kill_after_settle(marker: str) -> None:
    """Connect the receiver that kills this process, writing ``marker`` first."""
    path = Path(marker)

    def receiver(sender: Any, *, run_id: Any, workflow: str, step: str, **kwargs: Any) -> None:
        if workflow != WORKFLOW or path.exists():
            return
        wake_at = (
            WorkflowRun.objects.using(sender.using)
            .filter(id=run_id)
            .values_list("wake_at", flat=True)
            .first()
        )
        lease = timedelta(milliseconds=sender.config.run_lease_ms)
        if wake_at is None or wake_at < timezone.now() + lease / 2:
            return  # the settle woke the run for any worker: no pass is owed to this one
        note = {"pid": os.getpid(), "run": str(run_id), "step": step, "at": time.time()}
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(note))
        partial.rename(path)  # the test never reads half a marker
        os.kill(os.getpid(), signal.SIGKILL)

    step_attempt_succeeded.connect(receiver, weak=False, dispatch_uid="pikku-test-kill")


def kill_after_batch(marker: str) -> None:
    """Make this worker process SIGKILL itself as soon as one claim took two units or
    more, before it starts any of them, writing ``marker`` first (as JSON: the
    process, the steps claimed with their attempts, and the wall-clock time)."""
    from pikku_django.workflows.worker._batches import Batches

    path = Path(marker)
    claimed = Batches.claimed

    def killing(self: Batches, reserved: int, units: list[Any]) -> Any:
        if len(units) >= 2 and not path.exists():
            steps = [[u.claimed.step_id, u.claimed.attempt] for u in units if u.claimed]
            note = {"pid": os.getpid(), "steps": steps, "at": time.time()}
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(note))
            partial.rename(path)  # the test never reads half a marker
            os.kill(os.getpid(), signal.SIGKILL)
        return claimed(self, reserved, units)

    Batches.claimed = killing  # type: ignore[method-assign]
