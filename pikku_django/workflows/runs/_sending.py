"""What code outside a run does with it besides starting and stopping it: send it
events (addressed by id or by (workflow, idempotency key), and send-with-start,
which starts the run when no run holds the key), read the values it published,
and wait for its end."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.db import connections

from pikku_django.models import WorkflowRun
from pikku_django.workflows._dberrors import retrying
from pikku_django.workflows.compose._events import (
    EventOutcome,
    EventWaits,
    RunKey,
    SentEvent,
    check_event_id,
    check_event_name,
    run_for_key,
)
from pikku_django.workflows.compose._published import published_values
from pikku_django.workflows.runs._lifecycle import RunLifecycle
from pikku_django.workflows.runs._options import resolve_run_options
from pikku_django.workflows.runs._starting import workflow_definition
from pikku_django.workflows.runs._state import RunStates
from pikku_django.workflows.runs._waits import wait_for_run

#: A run given by id, as a row, or by its workflow and idempotency key.
RunRef = uuid.UUID | str | WorkflowRun | RunKey


class RunExchange:
    """What ``send_event``, ``send_event_with_start``, ``published_values`` and
    ``wait_for_run`` do on one engine (its ``events``)."""

    def __init__(
        self,
        states: RunStates,
        lifecycle: RunLifecycle,
        drive_inline: Callable[[uuid.UUID], Any],
    ) -> None:
        self.states = states
        self.store = states.store
        self.lifecycle = lifecycle
        self.waits = EventWaits(states)
        self._drive_inline = drive_inline

    def send(
        self, run: RunRef, name: str, data: Any = None, *, event_id: str | None = None
    ) -> SentEvent:
        """Send the event ``name`` to a run (see :func:`~pikku_django.workflows.send_event`):
        stored for the run (idempotent by ``event_id``), and a pending wait woken."""
        check_event_name(name)
        key = check_event_id(event_id)

        def send() -> SentEvent:
            with self.store.atomic():
                return self.waits.send(self._run_id(run), name, data, key)

        sent = self._retried(send)
        self._after(sent)
        return sent

    def send_with_start(
        self,
        workflow: str | Callable[..., Any],
        idempotency_key: str,
        name: str,
        data: Any = None,
        *,
        input: Any = None,
        event_id: str | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> SentEvent:
        """Start the run of ``idempotency_key`` unless one holds it, and send it the
        event, in one transaction: concurrent senders start one run."""
        definition = workflow_definition(workflow)
        options = resolve_run_options(
            definition, self.states.clock.now(), priority=priority, queue=queue
        )
        check_event_name(name)
        key = check_event_id(event_id)
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise ValueError("send_event_with_start needs an idempotency_key (a non-empty str)")

        def start_and_send() -> SentEvent:
            with self.store.atomic():
                run, created = self.lifecycle.start(
                    definition,
                    input,
                    idempotency_key=idempotency_key,
                    inline=False,
                    options=options,
                )
                return replace(self.waits.send(run.id, name, data, key), started=created)

        sent = self._retried(start_and_send)
        self._after(sent)
        return sent

    def published_values(self, run_id: uuid.UUID | str) -> dict[str, Any]:
        """The values the run has published with ``ctx.set_event``, by name."""
        return published_values(self.store, run_id)

    def wait_for_run(
        self, run_id: uuid.UUID | str, timeout: float, *, poll_interval: float | None = None
    ) -> WorkflowRun:
        """The run once it has ended; RunWaitTimeoutError after ``timeout`` seconds."""
        return wait_for_run(
            self.store.using, run_id, timeout, poll_interval, notifying=self.store.notifying
        )

    def _retried(self, send: Callable[[], SentEvent]) -> SentEvent:
        """``send()``, made again after a deadlock or lock wait (senders racing for one
        key on MariaDB) when it is its own transaction; in the caller's, the caller's
        transaction is the one to retry."""
        if connections[self.store.using].in_atomic_block:
            return send()
        return retrying(send)

    def _run_id(self, run: RunRef) -> uuid.UUID | str:
        if isinstance(run, WorkflowRun):
            return run.id
        if isinstance(run, RunKey):
            return run_for_key(self.store, run)
        if isinstance(run, uuid.UUID | str):
            return run
        raise TypeError(
            f"send_event addresses a run by id, WorkflowRun or RunKey(workflow, key), not {run!r}"
        )

    def _after(self, sent: SentEvent) -> None:
        """An inline run that got its event is carried on here: no worker passes it."""
        if sent.outcome != EventOutcome.DELIVERED:
            return
        inline = self.store.runs().filter(id=sent.run_id).values_list("inline", flat=True).first()
        if inline:
            self._drive_inline(self.states.inline_root(sent.run_id))
