"""A one-step workflow whose step blocks on its first attempt only.

The first attempt writes its pid to the marker file named in the input and then
blocks (the benchmark SIGKILLs its worker meanwhile); any later attempt finds
the marker and returns at once, so the second attempt's completion time is the
recovery time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pikku_django.workflows import WorkflowContext, step, workflow

QUEUE = "bench-recovery"


@step(name="bench_recovery.block_first", queue=QUEUE, retries=3)
def block_first(data: dict[str, Any]) -> dict[str, Any]:
    marker = Path(data["started"])
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(data.get("block", 600))
    return {"pid": os.getpid()}


@workflow(name="bench_recovery.blocked")
def blocked(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.do("work", "bench_recovery.block_first", input)
