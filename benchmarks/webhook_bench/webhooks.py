"""The benchmark's webhook source: the GitHub preset, one ``push`` event per request."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from pikku_django.webhooks import (
    ReceiveContext,
    WebhookSource,
    register_source,
    start_workflow_on,
)
from pikku_django.webhooks.presets import GitHub
from webhook_bench.workflows import WORKFLOW

SOURCE = "bench-github"


def receive(request: HttpRequest, ctx: ReceiveContext) -> Any:
    """The event named by ``X-GitHub-Event``, keyed by the delivery id, with the JSON body."""
    event = request.headers.get("X-GitHub-Event", "")
    return [ctx.body_event(event, id=ctx.delivery_id)]


source = register_source(
    WebhookSource(name=SOURCE, verify=GitHub(), receive=receive, events={"push": None})
)
start_workflow_on(f"{SOURCE}:push", WORKFLOW)
