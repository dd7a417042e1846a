"""The workflow each accepted push starts (nothing runs it during the benchmark)."""

from __future__ import annotations

from typing import Any

from pikku_django.workflows import WorkflowContext, workflow

WORKFLOW = "webhook_bench.push"


@workflow(name=WORKFLOW)
def on_push(ctx: WorkflowContext, event: dict[str, Any]) -> str:
    return str(event["id"])
