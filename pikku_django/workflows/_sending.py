"""Sending events to runs addressed by id or by (workflow, idempotency key), and
send-with-start: the run is started when no run holds the key."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.db import connections

from pikku_django.models import WorkflowRun
from pikku_django.workflows._dberrors import retrying
from pikku_django.workflows._lifecycle import RunLifecycle
from pikku_django.workflows._run_options import RunOptions
from pikku_django.workflows._runs import RunStates
from pikku_django.workflows._signals_in import (
    EventOutcome,
    EventWaits,
    RunKey,
    SentEvent,
    check_event_id,
    check_event_name,
    run_for_key,
)
from pikku_django.workflows.registry import WorkflowDefinition

#: A run given by id, as a row, or by its workflow and idempotency key.
RunRef = uuid.UUID | str | WorkflowRun | RunKey


class EventSender:
    """What ``send_event`` and ``send_event_with_start`` do on one engine."""

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

    def send(self, run: RunRef, name: str, data: Any, event_id: str | None) -> SentEvent:
        """Store the event for the run (idempotent by ``event_id``) and wake a wait."""
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
        definition: WorkflowDefinition,
        idempotency_key: str,
        name: str,
        data: Any,
        *,
        input: Any,
        event_id: str | None,
        options: RunOptions,
    ) -> SentEvent:
        """Start the run of ``idempotency_key`` unless one holds it, and send it the
        event, in one transaction: concurrent senders start one run."""
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
