"""Workflows the fork tests re-run: a charge, a transactional step, a child run, an
event and a last step; and a parallel group. Each step counts its calls."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pikku_django.workflows import WorkflowContext, step, workflow

#: How often each step function ran, in this process.
CALLS: Counter[str] = Counter()

ORDER = "fk_order"
FANOUT = "fk_fanout"


@step(name="fk_charge")
def fk_charge(data: Any) -> Any:
    CALLS["charge"] += 1
    return {"charged": data["n"] * 10}


@step(name="fk_record", transactional=True)
def fk_record(data: Any) -> Any:
    CALLS["record"] += 1
    return data["charged"] + 1


@step(name="fk_double")
def fk_double(data: Any) -> Any:
    CALLS["double"] += 1
    return data["n"] * 2


@step(name="fk_ship")
def fk_ship(data: Any) -> Any:
    CALLS["ship"] += 1
    return {"shipped": data["n"], "approved_by": data["by"]}


@workflow(name="fk_child")
def fk_child(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("double", fk_double, {"n": inp["n"]})


@workflow(name=ORDER, version="1")
def fk_order(ctx: WorkflowContext, inp: Any) -> Any:
    charged = ctx.do("charge", fk_charge, {"n": inp["n"]})
    ctx.set_event("charged", charged)
    recorded = ctx.do("record", fk_record, charged)
    doubled = ctx.do("child", "fk_child", {"n": recorded})
    approval = ctx.wait_for_event("approve")
    return ctx.do("ship", fk_ship, {"n": doubled, "by": approval["by"]})


@workflow(name=FANOUT, version="1")
def fk_fanout(ctx: WorkflowContext, inp: Any) -> Any:
    first = ctx.do("charge", fk_charge, {"n": inp["n"]})
    group = ctx.parallel("both")
    group.do("left", fk_double, {"n": 1})
    group.do("right", fk_double, {"n": 2})
    left, right = group.join()
    return ctx.do("ship", fk_ship, {"n": first["charged"] + left + right, "by": "fanout"})
