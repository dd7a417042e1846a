"""Webhook sources declared for the tests (module import registers them)."""

from __future__ import annotations

import json
from typing import Any

from django.http import JsonResponse

from pikku_django.webhooks import (
    Received,
    WebhookEvent,
    WebhookSource,
    on_webhook,
    register_source,
    start_workflow_on,
)
from pikku_django.webhooks.presets import GitHub
from pikku_django.workflows import workflow

handled: list[dict[str, Any]] = []


def receive_github(request: Any, ctx: Any) -> Any:
    if not ctx.body:
        return JsonResponse({"hello": "handshake"})
    event = request.headers.get("X-GitHub-Event", "")
    if event == "ping":
        return Received(response=JsonResponse({"pong": True}))
    return [WebhookEvent(event, id=ctx.delivery_id, data=json.loads(ctx.body))]


def receive_any(request: Any, ctx: Any) -> Any:
    """Claims an event even without a body: must be refused."""
    return [WebhookEvent("push", id="x", data={})]


github = register_source(
    WebhookSource(
        name="wh-github",
        verify=GitHub(),
        receive=receive_github,
        events={
            "push": lambda data: isinstance(data, dict) and "ref" in data,
            "issues": None,
            "unbound": None,
        },
    )
)
sneaky = register_source(
    WebhookSource(name="wh-sneaky", verify=GitHub(), receive=receive_any, events={"push": None})
)


@on_webhook("wh-github:issues")
def on_issue(event: dict[str, Any]) -> str:
    handled.append(event)
    return f"issue {event['data'].get('number')}"


@workflow(name="wh.deploy")
def deploy(ctx: Any, event: dict[str, Any]) -> dict[str, Any]:
    return {"deployed": event["data"]["ref"], "delivery": event["id"]}


start_workflow_on("wh-github:push", deploy)
start_workflow_on("wh-sneaky:push", deploy)
