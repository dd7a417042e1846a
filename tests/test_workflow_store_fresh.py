"""The claims of steps not attempted yet (``FreshClaims``) against every workflow store.

PostgreSQL's store makes them in one statement each; the others keep the base class's
answers, which mean "cannot tell" (claim nothing, say a retry may be due, name no
queue) so that their callers claim through ``lock_ready_steps``. Each scenario states
one expected outcome: a store that implements a method must reach it, a store that
does not must give the documented fallback and write nothing, and on every store the
general claim (``lock_ready_steps``, ``live_claims``, ``take_slots``) agrees with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from pikku_django.dbclock import store_now_ms
from pikku_django.models import QueueClaim, StepAttempt, WorkflowRun, WorkflowStep
from pikku_django.workflows.control._rates import grow_slots, take_slots
from pikku_django.workflows.control.queues import Rate
from pikku_django.workflows.store import WorkflowStore
from pikku_django.workflows.store.base import FreshClaims
from tests.test_workflow_store import STORES, make_store

PAST, FUTURE = -60, 3600
FRESH = ("scheduled", "pending")
DEFAULT_LEASE, MAIL_LEASE = 5_000, 7_000


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> WorkflowStore:
    return make_store(request.param)


def S(name: str, **fields: Any) -> dict[str, Any]:
    """A step of a scenario: scheduled and due on ``default`` unless ``fields`` say
    otherwise (``due``: seconds from now or None; ``lease``: "lapsed", "live" or None;
    ``run``: "running", "cancelled" or "inline")."""
    return {"name": name, **fields}


RETRY = {"status": "failed", "attempt": 1, "retries": 2}
LAPSED = {"status": "running", "attempt": 1, "lease": "lapsed"}
LIVE = {"status": "running", "attempt": 1, "lease": "live"}


def implements(store: WorkflowStore, method: str) -> bool:
    """Whether ``store`` has its own ``method`` rather than the base class's fallback."""
    found = getattr(type(store), method) is not getattr(FreshClaims, method)
    if store.vendor == "postgresql":
        assert found, f"PostgresStore lost its one-statement {method}"
    return found


def lay(store: WorkflowStore, now: datetime, specs: list[dict[str, Any]]) -> dict[int, str]:
    """Write the scenario's steps, each on a run of its own, in order: name by id."""
    store_now = store_now_ms(store.using)
    leases = {"lapsed": store_now - 60_000, "live": store_now + 60_000}
    names = {}
    for spec in specs:
        fields = dict(spec)
        name, due = fields.pop("name"), fields.pop("due", PAST)
        run_as = fields.pop("run", "running")
        lease = fields.pop("lease", None)
        fields["available_at"] = None if due is None else now + timedelta(seconds=due)
        fields["lease_expires_at"] = leases.get(lease)
        fields.setdefault("kind", "queued")
        fields.setdefault("function", "fn")
        run = WorkflowRun.objects.using(store.using).create(
            workflow="wf",
            status="cancelled" if run_as == "cancelled" else "running",
            inline=run_as == "inline",
        )
        step = WorkflowStep.objects.using(store.using).create(run=run, name=name, **fields)
        names[step.id] = name
    return names


def state(store: WorkflowStore) -> dict[int, tuple[str, int]]:
    """Each step's status and attempt."""
    rows = WorkflowStep.objects.using(store.using).values_list("id", "status", "attempt")
    return {pk: (status, attempt) for pk, status, attempt in rows}


def fresh_in_claim_order(
    store: WorkflowStore, now: datetime, queues: list[str], exclude: Sequence[str] = ()
) -> list[WorkflowStep]:
    """The general claim's ready steps that are fresh, in its order (nothing claimed)."""
    with store.atomic():
        ready = store.lock_ready_steps(now, queues, 100, list(exclude))
    return [step for step in ready if step.status in FRESH]


def assert_claimed(
    store: WorkflowStore,
    before: dict[int, tuple[str, int]],
    claimed: list[tuple[WorkflowStep, int]],
    window: tuple[int, int],
) -> None:
    """Each claimed step runs as its next attempt under its lease, with its attempt's
    row; every other step is as it was."""
    after = state(store)
    ids = {step.id for step, _ in claimed}
    for step, lease in claimed:
        row = WorkflowStep.objects.using(store.using).get(id=step.id)
        assert (row.status, row.attempt) == ("running", before[step.id][1] + 1)
        assert step.attempt == row.attempt
        assert window[0] + lease <= row.lease_expires_at <= window[1] + lease
        attempt = StepAttempt.objects.using(store.using).get(step_id=step.id)
        assert (attempt.attempt, attempt.status, attempt.worker) == (row.attempt, "running", "w1")
    assert {k: v for k, v in after.items() if k not in ids} == {
        k: v for k, v in before.items() if k not in ids
    }
    attempts = StepAttempt.objects.using(store.using)
    assert attempts.count() == len(claimed)


ORDER = [S("a"), S("b", priority=5), S("c"), S("d", priority=5), S("e", priority=-3)]
QUEUES = [S("a"), S("m", queue="mail"), S("o", queue="other")]
#: (case, steps, queues served, queues left out, limit, the steps claimed in order)
FRESH_CASES: list[tuple[str, list[dict[str, Any]], list[str], list[str], int, list[str]]] = [
    ("priority first, then first in", ORDER, [], [], 10, ["b", "d", "a", "c", "e"]),
    ("at most the limit", ORDER, [], [], 2, ["b", "d"]),
    (
        "fresh and due only",
        [
            S("scheduled"),
            S("pending", status="pending"),
            S("not yet due", due=FUTURE),
            S("without a time", due=None),
            S("retry due", **RETRY),
            S("lapsed claim", **LAPSED),
            S("live claim", **LIVE),
            S("succeeded", status="succeeded", attempt=1),
            S("inline step", kind="inline"),
            S("of a cancelled run", run="cancelled"),
            S("of an inline run", run="inline"),
        ],
        [],
        [],
        10,
        ["scheduled", "pending"],
    ),
    ("the queues served", QUEUES, ["mail", "other"], [], 10, ["m", "o"]),
    ("the queues left out", QUEUES, [], ["mail"], 10, ["a", "o"]),
    ("served, less those left out", QUEUES, ["mail", "other"], ["mail"], 10, ["o"]),
]


@pytest.mark.parametrize(
    ("case", "specs", "queues", "exclude", "limit", "expected"),
    FRESH_CASES,
    ids=[case[0] for case in FRESH_CASES],
)
def test_claiming_fresh_steps(
    store: WorkflowStore,
    case: str,
    specs: list[dict[str, Any]],
    queues: list[str],
    exclude: list[str],
    limit: int,
    expected: list[str],
) -> None:
    now = timezone.now()
    names = lay(store, now, specs)
    general = [names[s.id] for s in fresh_in_claim_order(store, now, queues, exclude)]
    assert general[:limit] == expected, case
    before, low = state(store), store_now_ms(store.using)
    started = timezone.now()
    claimed = store.claim_fresh_steps(
        now,
        queues,
        limit,
        worker="w1",
        leases={"mail": MAIL_LEASE},
        default_lease_ms=DEFAULT_LEASE,
        exclude=exclude,
        started_at=started,
    )
    if not implements(store, "claim_fresh_steps"):
        assert claimed == [], case
    else:
        assert [names[step.id] for step, _ in claimed] == expected, case
        assert all(a.started_at == started for a in StepAttempt.objects.using(store.using))
    assert_claimed(store, before, claimed, (low, store_now_ms(store.using)))


def test_fresh_claims_take_each_queues_lease_capped_by_the_steps_timeout(
    store: WorkflowStore,
) -> None:
    now = timezone.now()
    specs = [
        S("default"),
        S("mail", queue="mail"),
        S("short", queue="mail", timeout=2.5),
        S("long", timeout=60),
        S("tiny", timeout=0.0001),
    ]
    names = lay(store, now, specs)
    claimed = store.claim_fresh_steps(
        now, [], 10, worker="w1", leases={"mail": MAIL_LEASE}, default_lease_ms=DEFAULT_LEASE
    )
    if not implements(store, "claim_fresh_steps"):
        assert claimed == []
        return
    leases = {names[step.id]: lease for step, lease in claimed}
    assert leases == {"default": 5_000, "mail": 7_000, "short": 2_500, "long": 5_000, "tiny": 1}


LIMITED = "lim"


def L(name: str, **fields: Any) -> dict[str, Any]:
    """A step of the limited queue."""
    return S(name, queue=LIMITED, **fields)


#: (case, steps, limit, concurrency, rate (count per 60 s) and the slots of it used
#: a moment ago, the steps claimed in order, the rate slots locked, the steps wanted)
LIMITED_CASES: list[
    tuple[str, list[dict[str, Any]], int, int | None, tuple[int, int] | None, list[str], int, int]
] = [
    (
        "the room a live claim leaves, in claim order",
        [L("held", **LIVE), L("a"), L("b"), L("c", priority=5)],
        10,
        3,
        None,
        ["c", "a"],
        0,
        2,
    ),
    (
        "a lapsed claim takes no room",
        [L("lapsed", **LAPSED), L("a"), L("b")],
        10,
        2,
        None,
        ["a", "b"],
        0,
        2,
    ),
    ("the caller's limit", [L("a"), L("b"), L("c")], 2, 5, None, ["a", "b"], 0, 2),
    ("no room", [L("held", **LIVE), L("a")], 10, 1, None, [], 0, 0),
    (
        "the queue's fresh steps only",
        [S("elsewhere"), L("retry", **RETRY), L("later", due=FUTURE), L("a")],
        10,
        5,
        None,
        ["a"],
        0,
        5,
    ),
    ("one step per free rate slot", [L("a"), L("b"), L("c")], 10, None, (3, 1), ["a", "b"], 2, 10),
    ("no free rate slot", [L("a")], 10, None, (2, 2), [], 0, 10),
    (
        "the room and the rate",
        [L("held", **LIVE), L("a"), L("b"), L("c")],
        10,
        3,
        (5, 0),
        ["a", "b"],
        2,
        2,
    ),
]


@pytest.mark.parametrize(
    ("case", "specs", "limit", "concurrency", "rated", "expected", "slots", "wanted"),
    LIMITED_CASES,
    ids=[case[0] for case in LIMITED_CASES],
)
def test_claiming_a_limited_queues_fresh_steps(
    store: WorkflowStore,
    case: str,
    specs: list[dict[str, Any]],
    limit: int,
    concurrency: int | None,
    rated: tuple[int, int] | None,
    expected: list[str],
    slots: int,
    wanted: int,
) -> None:
    now = timezone.now()
    names = lay(store, now, specs)
    rate = None if rated is None else Rate(rated[0], 60)
    if rate is not None:
        grow_slots(store, LIMITED, rate)
        used = QueueClaim.objects.using(store.using).filter(queue=LIMITED).order_by("slot")
        recent = list(used.values_list("id", flat=True)[: rated[1]])
        used.filter(id__in=recent).update(claimed_ms=store_now_ms(store.using))
    # The general claim counts the same room and slots, and takes the same steps.
    room = limit if concurrency is None else concurrency - store.live_claims(LIMITED)
    assert max(0, min(limit, room)) == wanted, case
    if rate is not None:
        with store.atomic():
            assert len(take_slots(store, LIMITED, rate, wanted)) == slots, case
            transaction.set_rollback(True, using=store.using)
    general = [names[s.id] for s in fresh_in_claim_order(store, now, [LIMITED])]
    assert general[: min(wanted, slots) if rate else wanted] == expected, case
    stamps = dict(QueueClaim.objects.using(store.using).values_list("id", "claimed_ms"))
    before, low = state(store), store_now_ms(store.using)
    got = store.claim_fresh_limited(
        now, LIMITED, limit, worker="w1", lease_ms=DEFAULT_LEASE, concurrency=concurrency, rate=rate
    )
    if not implements(store, "claim_fresh_limited"):
        assert got is None, case
        assert_claimed(store, before, [], (low, low))
        assert dict(QueueClaim.objects.using(store.using).values_list("id", "claimed_ms")) == stamps
        return
    assert got is not None
    assert ([names[s.id] for s, _ in got.steps], got.slots, got.wanted) == (expected, slots, wanted)
    assert all(lease == DEFAULT_LEASE for _, lease in got.steps)
    assert_claimed(store, before, got.steps, (low, store_now_ms(store.using)))
    # A rate slot is stamped per step claimed: the free ones were stamped 0.
    restamped = QueueClaim.objects.using(store.using).exclude(claimed_ms__in=set(stamps.values()))
    assert restamped.count() == (len(expected) if rate else 0), case


#: (case, steps, queues served, the queue of the first fresh step in claim order)
FIRST_CASES: list[tuple[str, list[dict[str, Any]], list[str], str | None]] = [
    ("the higher priority", [S("a"), S("m", queue="mail", priority=5)], [], "mail"),
    ("first in, within a priority", [S("m", queue="mail"), S("a")], [], "mail"),
    ("of the queues served", [S("m", queue="mail", priority=5), S("a")], ["default"], "default"),
    (
        "a retry ahead is not fresh",
        [S("r", queue="mail", priority=9, **RETRY), S("a")],
        [],
        "default",
    ),
    ("nothing fresh", [S("later", due=FUTURE), S("lapsed", **LAPSED)], [], None),
]


@pytest.mark.parametrize(
    ("case", "specs", "queues", "expected"), FIRST_CASES, ids=[case[0] for case in FIRST_CASES]
)
def test_the_queue_of_the_first_fresh_step(
    store: WorkflowStore,
    case: str,
    specs: list[dict[str, Any]],
    queues: list[str],
    expected: str | None,
) -> None:
    now = timezone.now()
    lay(store, now, specs)
    general = fresh_in_claim_order(store, now, queues)
    assert (general[0].queue if general else None) == expected, case
    found = store.first_fresh_queue(now, queues)
    assert found == (expected if implements(store, "first_fresh_queue") else None), case


#: (case, steps, queues served, whether a retry is due or a claim lapsed)
LOOK_CASES: list[tuple[str, list[dict[str, Any]], list[str], bool]] = [
    ("only fresh steps", [S("a"), S("b", status="pending")], [], False),
    ("a retry due", [S("a"), S("r", **RETRY)], [], True),
    ("a retry not yet due", [S("r", due=FUTURE, **RETRY)], [], False),
    ("a retry with no attempt left", [S("r", status="failed", attempt=3, retries=2)], [], False),
    ("a lapsed claim", [S("a"), S("l", **LAPSED)], [], True),
    ("a live claim", [S("l", **LIVE)], [], False),
    ("a parked claim", [S("p", status="running", attempt=1)], [], False),
    ("a retry due on a queue served", [S("r", queue="mail", **RETRY)], ["mail"], True),
    ("a retry due on another queue", [S("r", queue="mail", **RETRY)], ["default"], False),
    ("nothing", [], [], False),
]


@pytest.mark.parametrize(
    ("case", "specs", "queues", "expected"), LOOK_CASES, ids=[case[0] for case in LOOK_CASES]
)
def test_whether_a_retry_is_due_or_a_claim_lapsed(
    store: WorkflowStore,
    case: str,
    specs: list[dict[str, Any]],
    queues: list[str],
    expected: bool,
) -> None:
    now = timezone.now()
    lay(store, now, specs)
    with store.atomic():
        ready = store.lock_ready_steps(now, queues, 100)
    assert any(step.status not in FRESH for step in ready) == expected, case
    found = store.retries_or_lapsed_exist(now, queues)
    assert found is (expected if implements(store, "retries_or_lapsed_exist") else True), case
