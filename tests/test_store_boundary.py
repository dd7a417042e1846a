"""The workflow store is the one boundary for writes to the workflow tables.

The package's source is read (``ast``, nothing imported or run): outside
``workflows/store/``, the migrations and the lease backends (``leases/``, which own
the lease table that run leases are rows of), no module may write a workflow table
(runs, steps, attempts, events, parallel groups, rate claims, queue pauses, leases)
through the ORM, nor execute SQL of its own where it works with one. Each violation
is printed as ``path:line: what``.

What counts as a write: ``update``, ``create``, ``delete``, ``save``, ``bulk_*``,
``get_or_create`` and ``update_or_create`` called on a workflow model's manager
(``WorkflowRun.objects``), on what the store or the engine hands out
(``store.runs()``, ``.steps()``, ``.attempts()``, ``.worker_runs()``, ``.events()``),
on a name bound to one of those (also through ``filter``, ``get``, ``first``, a
``for`` loop, a model's constructor or a parameter annotated with the model), or on
a deletion collector fed one. SQL: ``cursor()`` and a cursor's ``execute`` in a
module that names a workflow model, table or store accessor.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pikku_django"

#: Where writes to the workflow tables belong.
ALLOWED = ("workflows/store/", "migrations/", "leases/")

#: The workflow tables' models (``pikku_django/models/``).
MODELS = frozenset(
    {
        "WorkflowRun",
        "WorkflowStep",
        "StepAttempt",
        "WorkflowEvent",
        "QueueClaim",
        "QueuePause",
        "Lease",
    }
)
TABLES = (
    "pikku_workflow_run",
    "pikku_workflow_step",
    "pikku_step_attempt",
    "pikku_workflow_event",
    "pikku_queue_claim",
    "pikku_queue_pause",
    "pikku_lease",
)
#: ``pikku_django.prepared``'s functions that run SQL (the bulk starts', the claims'...).
PREPARED = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "prepared.")
    for name in ("fetch", "fetch_one", "fetch_on", "fetch_nothing_on")
)
#: Methods handing out a workflow table's QuerySet (the store's and the engine's).
ACCESSORS = frozenset({"runs", "steps", "attempts", "worker_runs", "events"})
WRITES = frozenset(
    {
        "update",
        "create",
        "delete",
        "save",
        "bulk_create",
        "bulk_update",
        "get_or_create",
        "update_or_create",
    }
)
#: QuerySet methods whose result is still rows of the same table.
ROWS = frozenset(
    {
        "filter",
        "exclude",
        "using",
        "all",
        "select_for_update",
        "only",
        "defer",
        "order_by",
        "annotate",
        "alias",
        "select_related",
        "prefetch_related",
        "distinct",
        "none",
        "get",
        "first",
        "last",
        "latest",
        "earliest",
        "iterator",
    }
)

#: Modules let off while their writes move into the store, each named with what is
#: left to move (none now); one leaves once it no longer writes.
PENDING: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _names(node: ast.AST) -> set[str]:
    """The model names an annotation mentions (also as a string)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval")
        except SyntaxError:
            return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


class _Scan(ast.NodeVisitor):
    """The writes of one module, by a per-function flow of names bound to rows."""

    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.found: list[Violation] = []
        self.models = set(MODELS)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "models" in node.module:
                for alias in node.names:
                    if alias.name in MODELS and alias.asname:
                        self.models.add(alias.asname)
        self.tables = self._touches_tables(tree)
        self.bound: list[set[str]] = [set()]
        #: Names bound to a cursor (``with connection.cursor() as name``).
        self.cursors: set[str] = set()

    def _touches_tables(self, tree: ast.Module) -> bool:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in self.models:
                return True
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and any(table in node.value for table in TABLES)
            ):
                return True
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ACCESSORS
            ):
                return True
        return False

    # -- what is rows of a workflow table ----------------------------------------

    def rows(self, node: ast.AST) -> bool:
        """Whether ``node`` evaluates to a workflow table's rows (a QuerySet, a
        manager, or model instances)."""
        if isinstance(node, ast.Name):
            return any(node.id in scope for scope in self.bound)
        if isinstance(node, ast.Attribute):
            if node.attr in ("objects", "_default_manager", "_base_manager"):
                return isinstance(node.value, ast.Name) and node.value.id in self.models
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return f"self.{node.attr}" in self.bound[-1]
            # A related manager of a row: ``run.steps``, ``run.events``.
            return node.attr in ACCESSORS and self.rows(node.value)
        if isinstance(node, ast.Subscript):
            return self.rows(node.value)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                if func.id in self.models:
                    return True
                if func.id in ("list", "iter", "reversed", "sorted") and node.args:
                    return self.rows(node.args[0])
                return False
            if isinstance(func, ast.Attribute):
                if func.attr in ACCESSORS and not node.args:
                    return True
                if func.attr in ROWS:
                    return self.rows(func.value)
        return False

    def bind(self, target: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self.bound[-1].add(target.id)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            self.bound[-1].add(f"self.{target.attr}")
        elif isinstance(target, (ast.Tuple, ast.List)):
            for item in target.elts:
                self.bind(item)

    # -- scopes ----------------------------------------------------------------

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        scope: set[str] = set()
        args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        for arg in args:
            if arg.annotation is not None and _names(arg.annotation) & self.models:
                scope.add(arg.arg)
        self.bound.append(scope)
        self.generic_visit(node)
        self.bound.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        if self.rows(node.value) or self._collector(node.value):
            for target in node.targets:
                self.bind(target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        typed = bool(_names(node.annotation) & self.models)
        if typed or (node.value is not None and self.rows(node.value)):
            self.bind(node.target)

    def _loop(self, node: ast.For | ast.AsyncFor | ast.comprehension) -> None:
        if self.rows(node.iter):
            self.bind(node.target)

    def visit_For(self, node: ast.For) -> None:
        self._loop(node)
        self.generic_visit(node)

    visit_AsyncFor = visit_For  # type: ignore[assignment]

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._loop(node)
        self.generic_visit(node)

    def visit_withitem(self, node: ast.withitem) -> None:
        self.generic_visit(node)
        if node.optional_vars is not None and self._cursor(node.context_expr):
            self.bind_cursor(node.optional_vars)

    def _collector(self, node: ast.AST) -> bool:
        """A deletion collector whose origin is a workflow table's rows."""
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id.endswith("Collector")
            and any(self.rows(k.value) for k in node.keywords)
        )

    # -- SQL -------------------------------------------------------------------

    def bind_cursor(self, target: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self.cursors.add(target.id)

    @staticmethod
    def _cursor(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "cursor"
        )

    # -- writes ----------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        if self.tables and _name(func) in PREPARED:
            self.found.append(Violation(self.path, node.lineno, f"SQL: {ast.unparse(func)}()"))
        if not isinstance(func, ast.Attribute):
            return
        if func.attr in WRITES and self.rows(func.value):
            receiver = ast.unparse(func.value)
            if len(receiver) > 60:
                receiver = receiver[:57] + "..."
            self.found.append(Violation(self.path, node.lineno, f"{receiver}.{func.attr}()"))
        elif (
            func.attr == "collect"
            and isinstance(func.value, ast.Name)
            and any(self.rows(arg) for arg in node.args)
        ):
            self.bound[-1].add(func.value.id)
        if not self.tables:
            return
        if self._cursor(node) or (
            func.attr == "execute"
            and isinstance(func.value, ast.Name)
            and (func.value.id in self.cursors or "cursor" in func.value.id)
        ):
            self.found.append(Violation(self.path, node.lineno, f"SQL: {ast.unparse(func)}()"))


def _name(func: ast.AST) -> str | None:
    """The name a call is made by (``fetch`` of ``fetch(...)`` or ``prepared.fetch(...)``)."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id + "." + func.attr if func.value.id == "prepared" else None
    return None


def scan(path: str, source: str) -> list[Violation]:
    """The writes to workflow tables (and SQL) in one module's ``source``."""
    tree = ast.parse(source)
    found = _Scan(path, tree)
    found.visit(tree)
    return sorted(set(found.found), key=lambda v: v.line)


def modules() -> Iterator[tuple[str, Path]]:
    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(PACKAGE).as_posix()
        if not path.startswith(ALLOWED):
            yield path, file


def violations() -> list[Violation]:
    found: list[Violation] = []
    for path, file in modules():
        found.extend(scan(path, file.read_text()))
    return found


def test_no_module_outside_the_store_writes_a_workflow_table() -> None:
    found = [v for v in violations() if v.path not in PENDING]
    for violation in found:
        print(violation)
    assert not found, "Writes to the workflow tables outside the store:\n" + "\n".join(
        map(str, found)
    )


def test_every_pending_module_still_writes() -> None:
    """A module that no longer writes leaves :data:`PENDING` (so the set only shrinks)."""
    writing = {v.path for v in violations()}
    assert not PENDING - writing, f"No longer writing, drop from PENDING: {PENDING - writing}"


CAUGHT = [
    ("store.runs().filter(id=1).update(wake_at=None)", "store.runs().filter(id=1).update()"),
    ("self.store.attempts().update_or_create(step_id=1)", "update_or_create()"),
    ("WorkflowRun.objects.using(a).bulk_create(rows)", "bulk_create()"),
    ("rows = QueuePause.objects.using(a)\nrows.create(queue='q')", "rows.create()"),
    ("w = s.steps().filter(x=1)\nw.update(status='failed')", "w.update()"),
    ("run = WorkflowRun(workflow='w')\nrun.save()", "run.save()"),
    ("def f(step: WorkflowStep) -> None:\n    step.delete()", "step.delete()"),
    ("def f(r: 'WorkflowRun | None') -> None:\n    r.save()", "r.save()"),
    ("for s in engine.steps().filter(a=1):\n    s.save()", "s.save()"),
    ("def f(run: WorkflowRun) -> None:\n    run.steps.filter(a=1).update(b=2)", "update()"),
    ("o = QueueClaim.objects.filter(q=1)\no.delete()", "o.delete()"),
    ("from pikku_django.models import Lease as L\nL.objects.filter().delete()", "delete()"),
    ("c = Collector(using=u, origin=WorkflowRun.objects.all())\nc.delete()", "c.delete()"),
    ("runs = WorkflowRun.objects.all()\nc = C(using=u)\nc.collect(runs)\nc.delete()", "delete"),
    ("x = store.runs()\nwith conn.cursor() as cur:\n    cur.execute('x')", "SQL: cur.execute"),
    ("c = connections['a'].cursor()\nWorkflowRun", "SQL: connections['a'].cursor()"),
    (
        "from pikku_django.prepared import fetch\n"
        "fetch('default', 'INSERT INTO pikku_workflow_run (id) SELECT unnest(%s)', [ids])",
        "SQL: fetch()",
    ),
    ("x = store.steps()\nprepared.fetch_one(u, sql, [])", "SQL: prepared.fetch_one()"),
]


@pytest.mark.parametrize(("source", "what"), CAUGHT, ids=[w for _, w in CAUGHT])
def test_the_scan_catches(source: str, what: str) -> None:
    found = scan("x.py", source)
    assert any(what in v.what for v in found), found


PASSED = [
    "store.runs().filter(id=1).values_list('id').first()",
    "values = dict(store.runs().values_list('published', flat=True).first())\nvalues.update(a=1)",
    "self.execution.execute(claimed)",
    "context.update(extra)",
    "store.cancel_run(run_id)",
    "with conn.cursor() as cur:\n    cur.execute('SELECT 1')",  # touches no workflow table
]


@pytest.mark.parametrize("source", PASSED)
def test_the_scan_passes(source: str) -> None:
    assert scan("x.py", source) == []
