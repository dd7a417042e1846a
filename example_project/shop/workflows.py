"""The shop's workflows: an order that is charged, packed, and shipped after a pause.

Start one from the shell and watch ``python manage.py pikku_worker`` finish it::

    python manage.py shell -c "from pikku_django import start_workflow; \\
        print(start_workflow('fulfil_order', {'order': 42, 'amount': 1999}).id)"
    python manage.py pikku_worker --until-idle
"""

from __future__ import annotations

import logging
from typing import Any

from pikku_django.workflows import WorkflowContext, step, workflow

logger = logging.getLogger(__name__)


@step(retries=3, retry_delay="1s", backoff="exponential")
def charge_card(data: dict[str, Any]) -> dict[str, Any]:
    """Charge the customer (a real app would call its payment provider here)."""
    logger.info("Charging %s cents for order %s", data["amount"], data["order"])
    return {"charge_id": f"ch_{data['order']}", "amount": data["amount"]}


@step
def pack_parcel(data: dict[str, Any]) -> str:
    """Pack the order; returns the parcel's label."""
    logger.info("Packing order %s", data["order"])
    return f"PARCEL-{data['order']}"


@step(queue="shipping")
def ship_parcel(data: dict[str, Any]) -> dict[str, Any]:
    """Hand the parcel to the carrier."""
    logger.info("Shipping %s", data["parcel"])
    return {"tracking": f"TRACK-{data['parcel']}"}


@step
def refund(data: dict[str, Any]) -> None:
    """Compensation: undo the charge when a later step fails for good."""
    logger.info("Refunding after %s failed: %s", data["step"], data["error"]["message"])


@workflow
def fulfil_order(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    """Charge, pack, wait a moment for the courier, and ship."""
    charge = ctx.do("charge", charge_card, order)
    parcel = ctx.do("pack", pack_parcel, order)
    ctx.sleep("wait for courier", "2s")
    shipment = ctx.do("ship", ship_parcel, {"parcel": parcel}, on_error=refund)
    return {"order": order["order"], "charge": charge["charge_id"], **shipment}
