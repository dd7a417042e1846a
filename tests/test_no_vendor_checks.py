"""Outside the store, the lease dialects and the modules that hold SQL per database, no
code asks which database it is on: it asks what the store (or :mod:`pikku_django.wakeups`)
says the database can do."""

from __future__ import annotations

import ast
from pathlib import Path

import pikku_django

ROOT = Path(pikku_django.__file__).parent

#: Where asking the vendor is the job: each holds what differs by database.
DIALECTS = (
    "workflows/store/",  # the workflow tables' operations, per database
    "leases/",  # the lease statements, per database
    "migrations/",  # schema that differs by database
    "wakeups/channels.py",  # which database carries notifications
    "webhooks/sql.py",  # the webhook tables' statements, per database
    "webhooks/digests.py",  # the digest claim, per database
    "workflows/control/pauses.py",  # the open-transactions query, per database
    "dbclock.py",  # the clock's SQL, per database
    "prepared.py",  # server-side prepared statements (PostgreSQL's driver)
    "pooling.py",  # which databases a PostgreSQL pooler (PgBouncer) can stand in front of
)


def vendor_questions(source: str) -> list[int]:
    """The lines of ``source`` that ask which database they are on: a comparison with,
    a lookup by or a call with a connection's or store's ``vendor`` (or a name
    ``vendor``); showing it in an f-string is not asking."""
    tree = ast.parse(source)
    shown = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.FormattedValue) and isinstance(node.value, ast.Attribute)
    }
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "vendor" and id(node) not in shown:
            if isinstance(node.ctx, ast.Load):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Name) and o.id == "vendor" for o in operands):
                lines.append(node.lineno)
    return sorted(set(lines))


def _offending() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(DIALECTS):
            continue
        for line in vendor_questions(path.read_text(encoding="utf-8")):
            found.append(f"pikku_django/{relative}:{line}")
    return found


def test_the_detector_finds_each_way_of_asking() -> None:
    source = (
        "if connection.vendor == 'postgresql': pass\n"
        "x = store.vendor != 'sqlite'\n"
        "sql = BY_VENDOR.get(connections[using].vendor)\n"
        "f(term, connections[using].vendor)\n"
        "if vendor == 'mysql': pass\n"
        "print(f'{store.vendor} started')\n"
        "vendor_name = 'x'\n"
    )
    assert vendor_questions(source) == [1, 2, 3, 4, 5]


def test_no_code_outside_the_dialects_asks_which_database_it_is_on() -> None:
    offending = _offending()
    assert offending == [], (
        "ask a capability the store or pikku_django.wakeups declares instead: "
        + ", ".join(offending)
    )
