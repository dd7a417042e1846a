"""``manage.py place_order ORDER AMOUNT``: start the fulfil_order workflow."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from pikku_django.workflows import start_workflow


class Command(BaseCommand):
    help = (
        "Start the fulfil_order workflow for an order and print its run id. Nothing runs "
        "until a worker picks it up: python manage.py pikku_worker"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("order", type=int, help="The order number.")
        parser.add_argument("amount", type=int, help="The amount to charge, in cents.")

    def handle(self, *args: Any, order: int, amount: int, **options: Any) -> None:
        run = start_workflow(
            "fulfil_order", {"order": order, "amount": amount}, idempotency_key=f"order-{order}"
        )
        self.stdout.write(f"Order {order}: workflow run {run.id} is {run.status}.")
        self.stdout.write("Start a worker to run it: python manage.py pikku_worker --until-idle")
