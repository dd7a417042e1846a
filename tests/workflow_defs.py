"""Workflows and step functions registered for tests/test_workflows.py.

Registered names are global to the process, so every name here starts with
``wft_``. Each test passes a unique ``tag`` in its input, and the functions
count their calls in :data:`CALLS` under that tag, so the same test on
another database (or another test) never sees them.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from django.contrib.auth.models import Group

from pikku_django.workflows import StepFailedError, WorkflowContext, step, workflow


class Calls:
    """A thread-safe counter of calls, keyed by tuples that start with a test's tag."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[Any, ...]] = Counter()
        self._log: list[tuple[Any, ...]] = []

    def hit(self, *key: Any) -> int:
        with self._lock:
            self._counts[key] += 1
            self._log.append(key)
            return self._counts[key]

    def count(self, *key: Any) -> int:
        with self._lock:
            return self._counts[key]

    def for_tag(self, tag: str) -> dict[tuple[Any, ...], int]:
        """Every key of ``tag`` (without the tag) and its count."""
        with self._lock:
            return {k[1:]: n for k, n in self._counts.items() if k[0] == tag}

    def log(self, tag: str) -> list[tuple[Any, ...]]:
        """The calls of ``tag`` in the order they happened (without the tag)."""
        with self._lock:
            return [k[1:] for k in self._log if k[0] == tag]


CALLS = Calls()


# -- steps ---------------------------------------------------------------------------


@step(name="wft_add_one")
def add_one(data: dict[str, Any]) -> int:
    CALLS.hit(data["tag"], "add_one", data["n"])
    return data["n"] + 1


@step(name="wft_always_fails")
def always_fails(data: dict[str, Any]) -> None:
    CALLS.hit(data["tag"], "always_fails")
    raise ValueError(f"boom {data['tag']}")


@step(name="wft_fails_then_succeeds")
def fails_then_succeeds(data: dict[str, Any]) -> str:
    n = CALLS.hit(data["tag"], "fails_then_succeeds")
    if n <= data["failures"]:
        raise RuntimeError(f"flaky attempt {n}")
    return f"ok after {n}"


@step(name="wft_refund")
def refund(data: dict[str, Any]) -> str:
    # The failed step's error names the tag: "boom <tag>".
    tag = data["error"]["message"].split()[-1]
    CALLS.hit(tag, "refund", data["step"], data["error"]["type"])
    return "refunded"


@step(name="wft_returns_set")
def returns_set(data: dict[str, Any]) -> set[int]:
    CALLS.hit(data["tag"], "returns_set")
    return {1, 2, 3}


@step(name="wft_record")
def record(data: dict[str, Any]) -> dict[str, Any]:
    CALLS.hit(data["tag"], "record", data.get("key"))
    return {"recorded": data.get("key")}


@step(name="wft_create_group", transactional=True)
def create_group(data: dict[str, Any]) -> int:
    """Writes a row in the engine's database, then returns its id."""
    CALLS.hit(data["tag"], "create_group")
    group = Group.objects.using(data["database"]).create(name=data["group"])
    return group.pk


@step(name="wft_count")
def count(data: dict[str, Any]) -> int:
    CALLS.hit(data["tag"], data["run"], data["step"])
    return data["run"]


# -- workflows -----------------------------------------------------------------------


@workflow(name="wft_memo")
def memo_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> dict[str, Any]:
    tag = inp["tag"]
    CALLS.hit(tag, "pass")
    a = ctx.do("first", add_one, {"tag": tag, "n": 1})
    b = ctx.do("second", "wft_add_one", {"tag": tag, "n": a})  # by name

    def times_ten() -> int:
        CALLS.hit(tag, "times_ten")
        return b * 10

    c = ctx.do("inline", times_ten)
    ctx.sleep("nap", "5min")
    d = ctx.do("third", add_one, {"tag": tag, "n": c})
    return {"a": a, "b": b, "c": c, "d": d}


@workflow(name="wft_retrying")
def retrying_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    """``inp["options"]`` are passed to ``ctx.do`` (retries, retry_delay, backoff)."""
    return ctx.do("flaky", always_fails, {"tag": inp["tag"]}, **inp.get("options", {}))


@workflow(name="wft_recovering")
def recovering_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do(
        "flaky",
        fails_then_succeeds,
        {"tag": inp["tag"], "failures": inp["failures"]},
        **inp.get("options", {}),
    )


@workflow(name="wft_nap")
def nap_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> dict[str, Any]:
    tag = inp["tag"]
    CALLS.hit(tag, "pass")
    before = ctx.do("before", record, {"tag": tag, "key": "before"})
    ctx.sleep("nap", "1h")
    after = ctx.do("after", record, {"tag": tag, "key": "after"})
    return {"before": before, "after": after}


@workflow(name="wft_approval")
def approval_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> dict[str, Any]:
    CALLS.hit(inp["tag"], "pass")
    first = ctx.suspend("need approval")
    second = ctx.suspend("need a second look")  # the same name again: suspend#1
    return {"first": first, "second": second}


@workflow(name="wft_one_step")
def one_step_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    CALLS.hit(inp["tag"], "pass")
    return ctx.do("work", record, {"tag": inp["tag"], "key": "work"})


@workflow(name="wft_child")
def child_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> dict[str, Any]:
    n = ctx.do("add", add_one, {"tag": inp["tag"], "n": inp["n"]})
    return {"child_got": inp["n"], "plus_one": n}


@workflow(name="wft_parent")
def parent_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> dict[str, Any]:
    got = ctx.do("child", child_wf, {"tag": inp["tag"], "n": inp["n"]})
    again = ctx.do("child", "wft_child", {"tag": inp["tag"], "n": got["plus_one"]})
    return {"first": got, "second": again}


@workflow(name="wft_failing_child")
def failing_child_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> None:
    ctx.do("fails", always_fails, {"tag": inp["tag"]}, retries=0)


@workflow(name="wft_parent_of_failing")
def parent_of_failing_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> None:
    try:
        ctx.do("child", failing_child_wf, {"tag": inp["tag"]})
    except StepFailedError as exc:
        CALLS.hit(inp["tag"], "parent saw", exc.error.get("type"))
        raise


@workflow(name="wft_compensated")
def compensated_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> None:
    tag = inp["tag"]
    CALLS.hit(tag, "pass")
    try:
        ctx.do("charge", always_fails, {"tag": tag}, retries=1, on_error=refund)
    except StepFailedError:
        CALLS.hit(tag, "error reached the workflow")
        raise


@workflow(name="wft_compensated_inline")
def compensated_inline_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> None:
    tag = inp["tag"]

    def undo(data: dict[str, Any]) -> str:
        status = type(ctx.run).objects.using(ctx.run._state.db).get(id=ctx.run_id).status
        CALLS.hit(tag, "undo", data["step"], status)
        return "undone"

    ctx.do("charge", always_fails, {"tag": tag}, retries=0, queued=False, on_error=undo)


@workflow(name="wft_inline_everything")
def inline_everything_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> dict[str, Any]:
    tag = inp["tag"]
    queued = ctx.do("queued", add_one, {"tag": tag, "n": 1})
    flaky = ctx.do(
        "flaky",
        fails_then_succeeds,
        {"tag": tag, "failures": 2},
        retry_delay="30s",
        backoff="exponential",
    )

    def flaky_inline() -> str:
        n = CALLS.hit(tag, "flaky_inline")
        if n < 3:
            raise RuntimeError(f"inline attempt {n}")
        return f"inline ok after {n}"

    inline = ctx.do("flaky_inline", flaky_inline, retry_delay=10)
    ctx.sleep("nap", "1h")
    child = ctx.do("child", child_wf, {"tag": tag, "n": 10})
    sleepy = ctx.do("sleepy", sleepy_child_wf, {"tag": tag, "n": 20})
    return {"queued": queued, "flaky": flaky, "inline": inline, "child": child, "sleepy": sleepy}


@workflow(name="wft_sleepy_child")
def sleepy_child_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    """Sleeps, then waits for a grandchild."""
    ctx.sleep("nap", "10min")
    return ctx.do("grandchild", child_wf, inp)


@workflow(name="wft_parent_of_approval")
def parent_of_approval_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do("child", approval_wf, {"tag": inp["tag"]})


@workflow(name="wft_flaky_inline")
def flaky_inline_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    tag = inp["tag"]

    def flaky() -> str:
        n = CALLS.hit(tag, "flaky")
        if n < 3:
            raise RuntimeError(f"inline attempt {n}")
        return f"ok after {n}"

    return ctx.do("flaky", flaky, retry_delay=5, backoff="exponential")


@workflow(name="wft_on_queue")
def on_queue_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do("work", record, {"tag": inp["tag"], "key": "work"}, queue=inp["queue"])


@workflow(name="wft_nondeterministic")
def nondeterministic_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    # Wrong on purpose: the function chosen depends on how often it was replayed.
    first_pass = CALLS.hit(inp["tag"], "pass") == 1
    return ctx.do("s", add_one if first_pass else record, {"tag": inp["tag"], "n": 1})


@workflow(name="wft_missing_function")
def missing_function_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do("x", inp["function"], {"tag": inp["tag"], "key": "late"})


@workflow(name="wft_not_json")
def not_json_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do("bad", returns_set, {"tag": inp["tag"]})


@workflow(name="wft_not_json_inline")
def not_json_inline_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do("bad", lambda: object())


@workflow(name="wft_not_json_output")
def not_json_output_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return {"when": ctx}


@workflow(name="wft_repeats")
def repeats_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> list[Any]:
    tag = inp["tag"]
    out = [ctx.do("item", add_one, {"tag": tag, "n": n}) for n in range(3)]
    ctx.sleep("pause", 0)
    ctx.sleep("pause", "0s")
    out.append(ctx.do("item", lambda: "inline"))
    return out


@workflow(name="wft_hash_in_name")
def hash_in_name_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do("item#1", add_one, {"tag": inp["tag"], "n": 1})


@workflow(name="wft_bad_sleep")
def bad_sleep_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> None:
    ctx.sleep("nap", inp["duration"])


@workflow(name="wft_bad_retry_delay")
def bad_retry_delay_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> None:
    ctx.do("x", add_one, {"tag": inp["tag"], "n": 1}, retry_delay=inp["delay"])


@workflow(name="wft_bad_step_input")
def bad_step_input_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> None:
    ctx.do("x", add_one, {"tag": inp["tag"], "n": {1, 2}})


@workflow(name="wft_transactional")
def transactional_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do("create", create_group, inp)


@workflow(name="wft_many")
def many_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> int:
    tag, run = inp["tag"], inp["run"]
    a = ctx.do("a", count, {"tag": tag, "run": run, "step": "a"})
    b = ctx.do("b", count, {"tag": tag, "run": run, "step": "b"})
    ctx.sleep("blink", 0)
    c = ctx.do("c", count, {"tag": tag, "run": run, "step": "c"})
    return a + b + c
