"""Django signals for what happens to runs and steps, for metrics, traces or alerts.

Connect a receiver as with any Django signal::

    from django.dispatch import receiver
    from pikku_django.signals import step_attempt_failed

    @receiver(step_attempt_failed)
    def page_someone(sender, *, run_id, workflow, step, attempt, error_type, **kwargs):
        ...

Every signal is sent with ``sender`` the :class:`~pikku_django.workflows.WorkflowEngine`
and these keyword arguments (receivers must accept ``**kwargs``: arguments may be
added later):

``run_started``
    ``run_id``, ``workflow``, ``input``, ``parent_run_id`` (None for a top-level run),
    ``trace_context`` (a dict of W3C trace headers, or None): once, when the run is created
    (by ``start_workflow``, as a child run, or by an intake: webhook events, cron ticks).
``run_pass_started`` / ``run_pass_finished``
    ``run_id``, ``workflow``, ``trace_context``; ``run_pass_finished`` adds ``status``
    (the run's status after the pass): around each orchestration pass.
``step_attempt_started``
    ``run_id``, ``workflow``, ``step``, ``attempt`` (1 for the first), ``queue``,
    ``worker``, ``claim_latency`` (seconds from the step being reached to its first
    attempt's claim; None for later attempts), ``trace_context``: just before a step's
    function is called, queued (by a worker) or inline (in the pass).
``step_attempt_succeeded``
    ``run_id``, ``workflow``, ``step``, ``attempt``, ``queue``, ``worker``, ``duration``
    (seconds).
``step_attempt_failed``
    as ``step_attempt_succeeded``, plus ``error_type``, ``error_message`` and
    ``will_retry`` (whether another attempt follows) and ``exception`` (the exception
    the step raised, with its traceback); sent once the attempt's result (or error) is
    stored, fenced by its attempt, so a superseded attempt sends neither.
``step_attempt_superseded``
    ``run_id``, ``workflow``, ``step``, ``attempt``, ``queue``, ``worker``, ``duration``:
    the attempt's lease lapsed and another attempt took the step over, so what it
    returned or raised was not recorded (a lost lease). Sent by the worker whose
    attempt lost, instead of ``step_attempt_succeeded`` or ``step_attempt_failed``.
``run_suspended``
    ``run_id``, ``workflow``, ``reason``.
``run_finished``
    ``run_id``, ``workflow``, ``status`` (completed, failed or cancelled), ``error_type``
    (or None), ``duration`` (seconds since the run started): when a run ends, and for
    each run ``cancel()`` cancels (its child runs too).
``webhook_received``
    sent by the webhook view with ``sender`` the source's class
    (:class:`~pikku_django.webhooks.WebhookSource`), and ``source`` (its name) and
    ``status_code`` (the answer's HTTP status): once per request to a declared source's
    route, after its events are stored.

Receivers run in the sender's thread, after the change is committed; an exception
in a receiver is logged and does not stop the engine (they are sent with
``send_robust``).
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

run_started = Signal()
run_pass_started = Signal()
run_pass_finished = Signal()
step_attempt_started = Signal()
step_attempt_succeeded = Signal()
step_attempt_failed = Signal()
step_attempt_superseded = Signal()
run_suspended = Signal()
run_finished = Signal()
webhook_received = Signal()

ALL_SIGNALS: dict[str, Signal] = {
    "run_started": run_started,
    "run_pass_started": run_pass_started,
    "run_pass_finished": run_pass_finished,
    "step_attempt_started": step_attempt_started,
    "step_attempt_succeeded": step_attempt_succeeded,
    "step_attempt_failed": step_attempt_failed,
    "step_attempt_superseded": step_attempt_superseded,
    "run_suspended": run_suspended,
    "run_finished": run_finished,
    "webhook_received": webhook_received,
}


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` to every receiver; one that raises is logged, not propagated."""
    # send_robust returns at once when nothing listens: no has_listeners() first,
    # which would look the receivers up a second time on every send.
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "A receiver of a pikku_django signal raised: %r",
                receiver,
                exc_info=(type(result), result, result.__traceback__),
            )


__all__ = [
    "ALL_SIGNALS",
    "run_finished",
    "run_pass_finished",
    "run_pass_started",
    "run_started",
    "run_suspended",
    "send",
    "step_attempt_failed",
    "step_attempt_started",
    "step_attempt_succeeded",
    "step_attempt_superseded",
    "webhook_received",
]
