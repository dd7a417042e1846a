"""``manage.py order_status``: show each fulfil_order run and its steps."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from pikku_django.models import WorkflowRun


class Command(BaseCommand):
    help = "Show every fulfil_order run, its status and output, and each of its steps."

    def handle(self, *args: Any, **options: Any) -> None:
        runs = WorkflowRun.objects.filter(workflow="fulfil_order").order_by("created_at")
        if not runs:
            self.stdout.write("No orders yet: python manage.py place_order 42 1999")
        for run in runs:
            style = self.style.SUCCESS if run.status == "completed" else self.style.WARNING
            self.stdout.write(style(f"Run {run.id}: {run.status}  output={run.output}"))
            for step in run.steps.order_by("id"):
                attempts = step.attempts.count()
                self.stdout.write(
                    f"  {step.name:<18} {step.kind:<7} {step.status:<10} "
                    f"attempts={attempts} result={step.result}"
                )
