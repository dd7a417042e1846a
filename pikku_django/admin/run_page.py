"""What a run's admin page shows beyond its fields: the step timeline and the run tree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from pikku_django.admin.formatting import (
    admin_link,
    error_part,
    format_duration,
    format_time,
    pretty_json,
    status_badge,
    without_traceback,
    workflow_title,
)
from pikku_django.admin.parallel_lanes import ParallelLanes, parallel_lanes
from pikku_django.admin.timeline import Chart, layout, step_rows
from pikku_django.dbclock import store_now_ms
from pikku_django.models import StepAttempt, StepKind, WorkflowRun, WorkflowStep

#: How far the tree reaches: ancestors walked up, and runs shown in all.
TREE_DEPTH = 25
TREE_RUNS = 200


def lease_left_ms(step: WorkflowStep, now_ms: int | None) -> int | None:
    """Milliseconds left on the step's lease (negative once lapsed); None without one."""
    if step.lease_expires_at is None or now_ms is None:
        return None
    return int(step.lease_expires_at) - int(now_ms)


def format_lease_left(left: int | None) -> str:
    if left is None:
        return "-"
    if left > 0:
        return _("%(ms)s ms") % {"ms": f"{left:,}"}
    return _("lapsed %(ms)s ms ago") % {"ms": f"{-left:,}"}


@dataclass(frozen=True)
class AttemptEntry:
    """One attempt of a step as the run page shows it."""

    attempt: StepAttempt
    badge: SafeString
    started: str
    finished: str
    duration: str


@dataclass(frozen=True)
class TimelineEntry:
    """One step of a run as the run page shows it."""

    step: WorkflowStep
    attempts: list[AttemptEntry]
    badge: SafeString
    attempts_label: str
    started: str
    duration: str
    lease_left: str
    lease_live: bool
    error_type: str
    error_message: str
    input_json: str | None
    result_json: str | None
    error_json: str | None
    error_traceback: str
    child_link: SafeString | None
    #: A parallel group's branches, side by side (they are not entries of their own).
    lanes: ParallelLanes | None = None


def attempt_entry(attempt: StepAttempt) -> AttemptEntry:
    ended = attempt.finished_at
    return AttemptEntry(
        attempt=attempt,
        badge=status_badge(attempt.status, attempt.get_status_display()),
        started=format_time(attempt.started_at),
        finished=format_time(ended),
        duration=format_duration(ended - attempt.started_at) if ended else "-",
    )


def child_link(child: WorkflowRun) -> SafeString:
    """A link to a child run, named as the lists name it, with its status."""
    title = workflow_title(child.workflow, child.idempotency_key)
    return format_html(
        "{} {}",
        admin_link(child, format_html("{} <code>{}</code>", title, str(child.pk)[:8])),
        status_badge(child.status, child.get_status_display()),
    )


def load_steps(run: WorkflowRun, using: str) -> list[WorkflowStep]:
    """The run's steps by id, their child runs joined and their attempts prefetched:
    one query for each of the three tables, however many steps the run has."""
    return list(
        WorkflowStep.objects.using(using)
        .of_run(run.pk)
        .select_related("child_run")
        .prefetch_related("attempts")
        .order_by("id")
    )


def timeline_chart(run: WorkflowRun, steps: Sequence[WorkflowStep]) -> Chart | None:
    """The run's steps on a time axis, as of now (see :mod:`pikku_django.admin.timeline`)."""
    return layout(step_rows(steps), timezone.now(), start=run.created_at)


def build_timeline(
    run: WorkflowRun, using: str, steps: Sequence[WorkflowStep] | None = None
) -> list[TimelineEntry]:
    """The run's steps in the order the workflow reached them, each with its attempts
    (``steps``: as :func:`load_steps` read them, if it did already)."""
    if steps is None:
        steps = load_steps(run, using)
    now = store_now_ms(using) if any(s.lease_expires_at is not None for s in steps) else None
    branches: dict[int, list[WorkflowStep]] = {}
    for step in steps:
        if step.group_id is not None:
            branches.setdefault(step.group_id, []).append(step)
    entries = []
    for step in steps:
        if step.group_id is not None:
            continue
        left = lease_left_ms(step, now)
        entries.append(
            TimelineEntry(
                step=step,
                attempts=[
                    attempt_entry(a) for a in sorted(step.attempts.all(), key=lambda a: a.attempt)
                ],
                badge=status_badge(step.status, step.get_status_display()),
                attempts_label=f"{step.attempt}/{step.attempts_allowed}",
                started=format_time(step.created_at),
                duration=format_duration(step.updated_at - step.created_at),
                lease_left=format_lease_left(left),
                lease_live=left is not None and left > 0,
                error_type=error_part(step.error, "type"),
                error_message=error_part(step.error, "message"),
                input_json=None if step.input is None else pretty_json(step.input),
                result_json=None if step.result is None else pretty_json(step.result),
                error_json=None
                if step.error is None
                else pretty_json(without_traceback(step.error)),
                error_traceback=error_part(step.error, "traceback"),
                child_link=child_link(step.child_run) if step.child_run is not None else None,
                lanes=parallel_lanes(branches.get(step.pk, []), _branch_link)
                if step.kind == StepKind.PARALLEL
                else None,
            )
        )
    return entries


def _branch_link(step: WorkflowStep) -> SafeString | None:
    return child_link(step.child_run) if step.child_run is not None else None


# -- the tree of parent and child runs --------------------------------------------------


@dataclass
class TreeNode:
    """A run in the tree, reached from its parent through the step ``via``."""

    run: WorkflowRun
    via: str = ""
    children: list[TreeNode] = field(default_factory=list)


def run_tree(run: WorkflowRun, using: str) -> TreeNode | None:
    """The tree of runs that ``run`` belongs to, from its root; None when it has no family."""
    steps = WorkflowStep.objects.using(using)
    root, via, seen = run, "", {run.pk}
    for _depth in range(TREE_DEPTH):
        parent = steps.filter(child_run_id=root.pk).select_related("run").order_by("id").first()
        if parent is None or parent.run_id in seen:
            break
        root, via = parent.run, ""
        seen.add(root.pk)
    top = TreeNode(root, via)
    level, count = [top], 1
    while level and count < TREE_RUNS:
        by_run = {node.run.pk: node for node in level}
        found = (
            steps.filter(run_id__in=list(by_run), child_run__isnull=False)
            .select_related("child_run")
            .order_by("id")
        )
        level = []
        for step in found:
            child = step.child_run
            if child is None or child.pk in {n.run.pk for n in level} or count >= TREE_RUNS:
                continue
            node = TreeNode(child, step.name)
            by_run[step.run_id].children.append(node)
            level.append(node)
            count += 1
    if top.run.pk == run.pk and not top.children:
        return None
    return top


def render_tree(node: TreeNode, current: WorkflowRun) -> SafeString:
    """The tree as nested lists: each run linked, with its status; ``current`` in bold."""
    title = workflow_title(node.run.workflow, node.run.idempotency_key)
    if node.run.pk == current.pk:
        label = format_html(
            '<span class="pikku-this">{} <code>{}</code></span>', title, str(node.run.pk)[:8]
        )
    else:
        label = admin_link(node.run, format_html("{} <code>{}</code>", title, str(node.run.pk)[:8]))
    via = format_html(' <span class="help">({} {})</span>', _("step"), node.via) if node.via else ""
    children = (
        format_html(
            "<ul>{}</ul>",
            format_html_join("", "{}", ((render_tree(c, current),) for c in node.children)),
        )
        if node.children
        else ""
    )
    return format_html(
        '<li data-run="{}">{} {}{}{}</li>',
        node.run.pk,
        label,
        status_badge(node.run.status, node.run.get_status_display()),
        via,
        children,
    )


def tree_html(run: WorkflowRun, using: str) -> SafeString | None:
    return family(run, using).html


@dataclass(frozen=True)
class Family:
    """The run's tree as the page draws it, and whether another run in it may still change."""

    html: SafeString | None
    #: True while a run of the tree other than the page's own is not finished: its
    #: changes reach the page only by drawing the tree again.
    live: bool


def _others_live(node: TreeNode, current: WorkflowRun) -> bool:
    if node.run.pk != current.pk and not node.run.is_terminal:
        return True
    return any(_others_live(child, current) for child in node.children)


def family(run: WorkflowRun, using: str) -> Family:
    """The tree of parent and child runs around ``run``; no markup when it has no family."""
    tree = run_tree(run, using)
    if tree is None:
        return Family(None, live=False)
    html = format_html('<ul class="pikku-tree" id="pikku-run-tree">{}</ul>', render_tree(tree, run))
    return Family(html, live=_others_live(tree, run))


# -- forks: the run a run was re-run from, and the runs re-run from it ------------------

#: How many of a run's forks its page lists.
FORKS_SHOWN = 50


@dataclass(frozen=True)
class ForkLinks:
    """The run's fork lineage as its page shows it."""

    #: "Forked from <original> at step <name>", or None for a run started afresh.
    forked_from: SafeString | None
    #: Links to the runs forked from this one, newest first, each with its step.
    forks: list[SafeString]
    #: The ids of the steps a fork kept from its original (copies, not run here).
    kept: frozenset[int] = frozenset()


def _run_label(run: WorkflowRun) -> SafeString:
    title = workflow_title(run.workflow, run.idempotency_key)
    return format_html("{} <code>{}</code>", title, str(run.pk)[:8])


def fork_links(run: WorkflowRun, using: str) -> ForkLinks:
    """The run's original (if it is a fork) and its own forks, linked."""
    forked_from = None
    if run.forked_from_id is not None:
        original = WorkflowRun.objects.using(using).filter(pk=run.forked_from_id).first()
        forked_from = format_html(
            "{} {} {} <strong>{}</strong>",
            _("Forked from"),
            admin_link(original, _run_label(original)) if original else run.forked_from_id,
            _("at step"),
            run.forked_at_step,
        )
    forks = [
        format_html(
            "{} {} {} <strong>{}</strong>",
            admin_link(fork, _run_label(fork)),
            status_badge(fork.status, fork.get_status_display()),
            _("from step"),
            fork.forked_at_step,
        )
        for fork in WorkflowRun.objects.using(using)
        .filter(forked_from_id=run.pk)
        .order_by("-created_at")[:FORKS_SHOWN]
    ]
    return ForkLinks(forked_from, forks, kept_steps(run, using))


def kept_steps(run: WorkflowRun, using: str) -> frozenset[int]:
    """The ids of a fork's steps kept from its original: those recorded before the
    step it was forked at (all of them until that step is recorded again)."""
    if not run.forked_at_step:
        return frozenset()
    kept = []
    steps = WorkflowStep.objects.using(using).filter(run_id=run.pk).order_by("id")
    for step_id, name in steps.values_list("id", "name"):
        if name == run.forked_at_step:
            break
        kept.append(step_id)
    return frozenset(kept)


__all__ = [
    "Family",
    "ForkLinks",
    "TimelineEntry",
    "build_timeline",
    "family",
    "fork_links",
    "load_steps",
    "run_tree",
    "timeline_chart",
    "tree_html",
]
