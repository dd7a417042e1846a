"""A GitHub-style webhook source: each signed ``push`` starts a deploy.

It is off until someone enables it (admin: Pikku > Trigger sources > Enable, or
``manage.py pikku_sources enable github --base-url http://127.0.0.1:8000/pikku/``).
Its secret is the credential ``githubWebhookSecret``.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse

from deploys.workflows import deploy
from pikku_django.webhooks import (
    ReceiveContext,
    Received,
    WebhookEvent,
    WebhookSource,
    register_source,
    start_workflow_on,
)
from pikku_django.webhooks.presets import GitHub


def receive(request: HttpRequest, ctx: ReceiveContext) -> Any:
    """Turn a verified GitHub delivery into events (``ping`` is only answered)."""
    kind = request.headers.get("X-GitHub-Event", "")
    if kind == "ping" or not ctx.body:
        return Received(response=JsonResponse({"pong": True}))
    payload = ctx.json()
    return [WebhookEvent(kind, id=ctx.delivery_id, data=payload)]


def is_push(data: Any) -> bool:
    """A push names the branch and the commit."""
    return isinstance(data, dict) and isinstance(data.get("ref"), str) and "after" in data


github = register_source(
    WebhookSource(name="github", verify=GitHub(), receive=receive, events={"push": is_push})
)
start_workflow_on("github:push", deploy)
