"""A fan-out of child runs for worker processes (tests/test_parallel_workers.py)."""

from typing import Any

from pikku_django.workflows import WorkflowContext, workflow


def square(n: int) -> int:
    return n * n


@workflow(name="testapp.fan_child")
def fan_child(ctx: WorkflowContext, n: int) -> int:
    return int(ctx.do("square", square, n))


@workflow(name="testapp.fan_out")
def fan_out(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    group = ctx.parallel("children")
    for n in range(int(input["children"])):
        group.do("child", fan_child, n)
    return group.join()
