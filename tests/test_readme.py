"""Every code sample in README.md and on every docs/ page runs, and the reference
tables match the code.

One test per fenced block, named after its page, language and line:

* ``python`` blocks are checked by ruff's pyflakes rules (undefined names, unused
  imports), then executed in a fresh namespace inside a test with a real database
  (``transaction=True``), after the module samples above them on their page
  (``# billing/workflows.py`` and the like), and those of the pages it says it uses,
  have been installed as importable modules, as they would be in a project.
  Every ``test_*`` function a block defines is then called. A block that
  defines pytest test classes (the conformance suites) is run by pytest in a process
  of its own. ``# settings.py`` blocks are executed and their ``PIKKU``, ``CACHES``,
  ``DATABASES`` and ``TASKS`` put through pikku_django's system checks; ``# urls.py`` blocks become
  the URLconf and must route to pikku_django's views.
* ``sh`` blocks: each command must be a real ``manage.py`` command whose parser accepts
  the arguments shown, a Makefile target, a file in the repository, an extra of
  pikku-django, a URL of the app, or one of the few system tools listed in
  ``readme_support.EXTERNAL_TOOLS``.
* ``ini`` blocks are parsed as systemd units, and their ``ExecStart`` checked as above.
* ``toml`` blocks are a ``pyproject.toml``'s pytest section, naming a settings module.
* ``text`` blocks are output or a directory tree: not run (there is nothing to run),
  but they may not hide a command, and the tree under "Layout" must exist.

Registrations the samples make (workflows, steps, webhook sources, handlers) and the
modules they install are removed after each test, so they never reach other tests.
"""

from __future__ import annotations

import ast
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import get_commands, load_command_class
from django.test import override_settings
from django.urls import resolve, reverse

from pikku_django.conf import DEFAULTS
from pikku_django.webhooks import sources as webhook_sources
from pikku_django.workflows import registry
from tests import readme_support as support

BLOCKS = support.all_blocks()
DOCS = support.DOCS
PYTHON = [b for b in BLOCKS if b.language == "python"]
SHELL = [b for b in BLOCKS if b.language == "sh"]
INI = [b for b in BLOCKS if b.language == "ini"]
TOML = [b for b in BLOCKS if b.language == "toml"]
TEXT = [b for b in BLOCKS if b.language == "text"]


def ids(blocks: list[support.Block]) -> list[str]:
    return [b.id for b in blocks]


@pytest.fixture
def isolated() -> Iterator[support.ReadmeModules]:
    """Undo what the samples register, and the modules they install."""
    tables: list[dict[str, Any]] = [
        registry._workflows,
        registry._steps,
        webhook_sources._sources,
        webhook_sources._handlers,
    ]
    saved = [dict(table) for table in tables]
    modules = support.ReadmeModules()
    try:
        yield modules
    finally:
        modules.remove()
        for table, copy in zip(tables, saved, strict=True):
            table.clear()
            table.update(copy)


@pytest.fixture
def no_dev_webhooks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Development registration writes a file next to manage.py: not from a test.
    monkeypatch.delenv("PIKKU_DEV_WEBHOOK_URL", raising=False)


# -- the blocks ---------------------------------------------------------------------


def test_every_block_has_a_language_this_test_checks() -> None:
    assert support.read_blocks(), "README.md has no code blocks"
    unknown = [(b.where, b.language) for b in BLOCKS if b.language not in support.LANGUAGES]
    assert not unknown, (
        f"blocks (where, language) this test does not know how to check: {unknown}; "
        f"use one of {sorted(support.LANGUAGES)}"
    )


def test_every_python_block_is_valid_python() -> None:
    for block in PYTHON:
        try:
            ast.parse(block.code)
        except SyntaxError as exc:
            raise AssertionError(f"{block.where}: {exc}") from exc


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("block", PYTHON, ids=ids(PYTHON))
@pytest.mark.usefixtures("no_dev_webhooks")
def test_python_sample_runs(
    block: support.Block, isolated: support.ReadmeModules, tmp_path: Path
) -> None:
    findings = support.ruff_findings(block)
    assert not findings, f"ruff finds problems in the sample:\n{findings}"
    if block.defines_test_classes():
        support.run_test_classes(block, tmp_path)
        return
    for earlier in support.prerequisites(block, BLOCKS):
        isolated.install(earlier)
    if block.kind == "settings":
        namespace: dict[str, Any] = {"__name__": f"readme_settings_{block.line}"}
        exec(block.compiled(), namespace)  # noqa: S102  (the project's own sample)
        support.check_settings_namespace(namespace, support.readme_apps(BLOCKS))
        return
    if block.kind == "urls":
        check_urls_sample(block, isolated)
        return
    if block.kind == "module":
        namespace = isolated.install(block).__dict__
    else:
        namespace = {"__name__": f"readme_snippet_{block.line}"}
        exec(block.compiled(), namespace)  # noqa: S102  (the project's own sample)
    called = support.call_tests(namespace, block.source)
    if block.path and block.path.rsplit("/", 1)[-1].startswith("test_"):
        assert called, "a test module sample defines no test_* function"


def check_urls_sample(block: support.Block, isolated: support.ReadmeModules) -> None:
    """The URLconf sample routes to pikku_django as the samples' tests expect."""
    from pikku_django.checks import check_urls_included
    from pikku_django.views import run_status

    run_id = uuid.uuid4()
    expected = reverse("pikku_django:run-status", args=[run_id])  # under tests/urls.py
    module = isolated.install(block, f"readme_urls_{block.line}")
    with override_settings(ROOT_URLCONF=module.__name__):
        url = reverse("pikku_django:run-status", args=[run_id])
        assert resolve(url).func is run_status
        assert check_urls_included() == []
    assert url == expected, "the README mounts the URLs elsewhere than its samples post to"


@pytest.mark.parametrize("block", SHELL, ids=ids(SHELL))
def test_shell_sample_names_real_commands(block: support.Block) -> None:
    support.check_shell_block(block, support.unit_names(BLOCKS))


@pytest.mark.parametrize("block", INI, ids=ids(INI))
def test_systemd_unit_parses_and_runs_a_real_command(block: support.Block) -> None:
    support.check_ini_block(block)


@pytest.mark.parametrize("block", TOML, ids=ids(TOML))
def test_pyproject_sample_sets_up_pytest_django(block: support.Block) -> None:
    support.check_toml_block(block)


@pytest.mark.parametrize("block", TEXT, ids=ids(TEXT))
def test_text_block_is_output_not_a_hidden_command(block: support.Block) -> None:
    support.check_text_block(block)
    if block.heading == "Layout":
        missing = [p for p in support.layout_paths(block) if not p.exists()]
        assert not missing, f"the layout names paths that do not exist: {missing}"


# -- the reference tables -----------------------------------------------------------


def test_settings_table_lists_exactly_the_defaults() -> None:
    rows = support.table_rows(support.section("Settings reference", page("reference/settings.md")))
    documented: dict[str, Any] = {}
    for cells in rows:
        key = support.unquote(cells[0])
        assert key not in documented, f"{key} is listed twice"
        documented[key] = ast.literal_eval(support.unquote(cells[1]))
        assert cells[2], f"{key} has no meaning"
    assert list(documented) == list(DEFAULTS), (
        "the settings table must list DEFAULTS' keys in their order; "
        f"missing {sorted(set(DEFAULTS) - set(documented))}, "
        f"unknown {sorted(set(documented) - set(DEFAULTS))}"
    )
    for key, default in DEFAULTS.items():
        shown = documented[key]
        assert (type(shown), shown) == (type(default), default), (
            f"{key}: the README says {shown!r}, conf.py {default!r}"
        )


def code_check_ids() -> set[str]:
    found: set[str] = set()
    for path in (support.ROOT / "pikku_django").rglob("*.py"):
        found |= set(re.findall(r"pikku_django\.[EWI]\d{3}", path.read_text(encoding="utf-8")))
    return found


def test_system_checks_table_lists_exactly_the_checks() -> None:
    rows = support.table_rows(support.section("System checks", page("reference/checks.md")))
    documented = [support.unquote(cells[0]) for cells in rows]
    assert len(documented) == len(set(documented)), "a check is listed twice"
    assert set(documented) == code_check_ids(), (
        f"missing {sorted(code_check_ids() - set(documented))}, "
        f"not in the code {sorted(set(documented) - code_check_ids())}"
    )


def command_options(parser: Any) -> tuple[set[str], set[str]]:
    """A command's own long options and subcommands, through its subparsers."""
    import argparse

    options: set[str] = set()
    subcommands: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                subcommands.add(name)
                sub_options, sub_commands = command_options(sub)
                options |= sub_options
                subcommands |= sub_commands
        options |= {
            o for o in action.option_strings if o.startswith("--")
        } - support.DJANGO_COMMON_OPTIONS
    return options, subcommands


def pikku_commands() -> dict[str, Any]:
    return {
        name: load_command_class(app, name).create_parser("manage.py", name)
        for name, app in get_commands().items()
        if app == "pikku_django"
    }


def test_every_command_and_option_is_documented() -> None:
    commands = pikku_commands()
    reference = page("reference/commands.md")
    documented = {
        title
        for title in support.headings(support.section("Management commands", reference))
        if title.startswith("pikku_")
    }
    assert documented == set(commands), (
        f"commands without a section: {sorted(set(commands) - documented)}; "
        f"sections for no command: {sorted(documented - set(commands))}"
    )
    for name, parser in commands.items():
        text = support.section(name, reference)
        options, subcommands = command_options(parser)
        missing = {o for o in options if not re.search(rf"{re.escape(o)}\b", text)}
        assert not missing, f"{name}: options the README leaves out: {sorted(missing)}"
        missing_subcommands = {s for s in subcommands if not re.search(rf"\b{s}\b", text)}
        assert not missing_subcommands, f"{name}: subcommands left out: {missing_subcommands}"
        unknown = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text)) - options
        assert not unknown, f"{name}: the README shows options it does not have: {unknown}"


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def api_sections() -> list[tuple[str, list[str]]]:
    """Each ``::: module`` of the Python API page and the members it lists (none: all)."""
    sections = re.split(r"^::: ", page("reference/api.md"), flags=re.MULTILINE)[1:]
    return [
        (section.split("\n", 1)[0].strip(), re.findall(r"^ {8}- (\w+)$", section, re.MULTILINE))
        for section in sections
    ]


@pytest.mark.once  # griffe reads the source: the same on every Django
def test_the_api_page_documents_every_exported_name() -> None:
    """A module's ``__all__`` is listed in full, and each name listed is found by
    mkdocstrings (griffe) with a docstring: a name it cannot resolve is left out of
    the page without an error, even under ``--strict``."""
    import importlib

    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(support.ROOT)])
    problems = []
    for module_name, members in api_sections():
        exported = getattr(importlib.import_module(module_name), "__all__", None)
        if members and exported is not None and set(members) != set(exported):
            problems.append(
                f"{module_name}: left out {sorted(set(exported) - set(members))}, "
                f"not exported {sorted(set(members) - set(exported))}"
            )
        top = loader.load(module_name.split(".", 1)[0])
        module = top[module_name.split(".", 1)[1]]
        for name in members:
            try:
                found = module[name]
                target = found.final_target if found.is_alias else found
            except (KeyError, griffe.AliasResolutionError):
                problems.append(f"{module_name}.{name}: mkdocstrings cannot find it")
                continue
            if not target.docstring:
                problems.append(f"{module_name}.{name}: no docstring")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("document", support.documents(), ids=support.relative)
def test_links_point_at_files_and_headings(document: Path) -> None:
    """Links to a heading, a page or a file of the repository lead somewhere."""
    body = support.strip_blocks(support.readme_text(document))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if re.match(r"[a-z]+:", target):
            continue  # an address outside the repository
        path_part, _, anchor = target.partition("#")
        linked = (document.parent / path_part).resolve() if path_part else document
        if not linked.exists():
            broken.append(target)
            continue
        if anchor and linked.suffix == ".md":
            slugs = {support.github_slug(t) for t in support.headings(linked.read_text())}
            if anchor not in slugs:
                broken.append(target)
    assert not broken, f"links that lead nowhere: {broken}"


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = support.MKDOCS_YML.read_text(encoding="utf-8")
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    listed = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, re.MULTILINE))
    assert pages == listed, (
        f"pages not in mkdocs.yml's nav: {sorted(pages - listed)}; "
        f"nav entries with no page: {sorted(listed - pages)}"
    )


def test_the_readme_test_sample_says_what_pytest_needs() -> None:
    """The README's pytest sample links to the section saying what runs it: pytest,
    pytest-django and the DJANGO_SETTINGS_MODULE it needs."""
    setup = support.section("Setting up pytest", page("guides/testing.md"))
    assert "pip install pytest pytest-django" in setup
    assert [b.source for b in TOML] == [DOCS / "guides" / "testing.md"]
    assert "DJANGO_SETTINGS_MODULE" in TOML[0].code
    text = support.readme_text()
    assert "@pytest.mark.django_db" in text
    assert '"Setting up pytest" in `docs/guides/testing.md`' in text


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = support.readme_text()
    assert len(text.splitlines()) <= 320, "the README grows past ~300 lines: move it to docs/"
    first_screen = "\n".join(text.splitlines()[:30])
    assert "make demo" in first_screen
    assert "make test" in first_screen
