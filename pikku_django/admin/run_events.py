"""The run page's events: each event sent to the run, the wait that got it (or
that it is kept for a later wait), and the values the run published."""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from pikku_django.admin.formatting import EMPTY, json_block, pretty_json, workflow_database
from pikku_django.models import StepKind, WorkflowEvent, WorkflowRun, WorkflowStep


def events_table(run: WorkflowRun) -> SafeString | str:
    """A table of the events sent to ``run`` and the waits of the run, oldest first
    (read from the database the run was read from)."""
    using = run._state.db or workflow_database()
    events = list(
        WorkflowEvent.objects.using(using)
        .filter(run_id=run.id)
        .select_related("step")
        .order_by("id")
    )
    waits = list(
        WorkflowStep.objects.using(using).of_run(run.id).filter(kind=StepKind.EVENT).order_by("id")
    )
    if not events and not waits:
        return EMPTY
    taken = {event.step_id for event in events}
    rows: list[tuple[Any, ...]] = [
        (
            event.name,
            event.event_id,
            event.created_at.isoformat(timespec="seconds"),
            event.step.name if event.step is not None else _("kept for a later wait"),
            pretty_json(event.data),
        )
        for event in events
    ]
    for wait in waits:
        if wait.id in taken:
            continue
        result = wait.result if isinstance(wait.result, dict) else {}
        outcome = _("timed out") if result.get("timed_out") else _("waiting")
        rows.append(
            (
                wait.function,
                EMPTY,
                wait.created_at.isoformat(timespec="seconds"),
                f"{wait.name}: {outcome}",
                "",
            )
        )
    body = format_html_join(
        "",
        "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>"
        '<td><pre class="pikku-json">{}</pre></td></tr>',
        rows,
    )
    return format_html(
        '<table class="pikku-events"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
        "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
        _("Event"),
        _("Event id"),
        _("Sent / waited since"),
        _("Wait"),
        _("Data"),
        body,
    )


def published_block(run: WorkflowRun) -> SafeString | str:
    """The run's published values as JSON."""
    return json_block(run.published or None)
