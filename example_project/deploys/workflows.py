"""The deploy story: build, test, migrate (a child workflow), a canary pause, a human
approval, then production."""

from __future__ import annotations

import logging
import time
from typing import Any

from pikku_django.workflows import WorkflowContext, step, workflow

logger = logging.getLogger(__name__)


@step(retries=2, retry_delay="1s")
def build(data: dict[str, Any]) -> dict[str, Any]:
    """Build an image for the pushed commit."""
    time.sleep(0.3)
    return {"image": f"shop:{data['commit'][:7]}"}


@step
def run_tests(data: dict[str, Any]) -> dict[str, Any]:
    """Run the test suite against the image."""
    time.sleep(0.3)
    return {"passed": 128, "image": data["image"]}


@step
def apply_migrations(data: dict[str, Any]) -> list[str]:
    """Apply the database migrations the image carries."""
    return ["0042_add_discounts"]


@step
def release(data: dict[str, Any]) -> dict[str, Any]:
    """Point an environment at the image."""
    return {"environment": data["environment"], "image": data["image"]}


@workflow
def migrate_database(ctx: WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """A child workflow: back up, then migrate."""
    ctx.do("backup", lambda: "backup-ok")
    applied = ctx.do("migrate", apply_migrations, data)
    return {"applied": applied}


@workflow
def deploy(ctx: WorkflowContext, event: dict[str, Any]) -> dict[str, Any]:
    """Deploy a pushed commit to staging, and to production once someone approves."""
    push = event["data"]
    commit = push["after"]
    image = ctx.do("build", build, {"commit": commit})["image"]
    ctx.do("test", run_tests, {"image": image})
    migrations = ctx.do("migrate database", migrate_database, {"image": image})
    ctx.do("release to staging", release, {"environment": "staging", "image": image})
    ctx.sleep("canary on staging", "3s")
    approval = ctx.suspend(f"Approve {image} for production")
    production = ctx.do(
        "release to production", release, {"environment": "production", "image": image}
    )
    return {
        "commit": commit,
        "image": image,
        "migrations": migrations["applied"],
        "approved_with": approval,
        "released": production,
    }
