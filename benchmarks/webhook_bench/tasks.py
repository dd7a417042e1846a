"""The Procrastinate task of the ``defer`` baseline (found by procrastinate.contrib.django,
which imports every installed app's ``tasks`` module)."""

from __future__ import annotations

from procrastinate.contrib.django import app


@app.task(name="webhook_bench.handle_delivery")
def handle_delivery(delivery: str) -> None:
    """What a worker would do with the stored delivery (the benchmark runs no worker)."""
    return None
