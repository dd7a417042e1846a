"""Reading README.md and every docs/ page for tests/test_readme.py: their code blocks,
sections and tables, and the checkers for each kind of sample.

A page's samples build on the module samples above them on the same page; a page whose
samples also use another page's modules says so in a comment of its own,
``<!-- samples use: guides/workflows.md -->`` (paths under docs/).

A fenced block's language decides how it is checked:

* ``python`` is executed (see :func:`run_python_block`). Its first line may name the
  file it stands for (``# billing/workflows.py``): ``settings.py`` samples are executed
  and their settings checked, ``urls.py`` samples are installed as the URLconf, and any
  other path becomes an importable module that later samples may import.
* ``sh`` lines must be commands this project knows (:func:`check_shell_block`).
* ``ini`` is parsed as a systemd unit (:func:`check_ini_block`).
* ``toml`` is a ``pyproject.toml`` section for pytest (:func:`check_toml_block`).
* ``text`` is program output or a directory tree, shown for reading: it is not run,
  but it may not hide a command (:func:`check_text_block`), and the tree under
  "Layout" must exist.
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXAMPLE_PROJECT = ROOT / "example_project"
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"


def documents() -> list[Path]:
    """Every Markdown file whose samples the suite runs: the READMEs, then docs/."""
    return [README, EXAMPLE_PROJECT / "README.md", *sorted(DOCS.rglob("*.md"))]


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


#: Languages a block may have, and how each is checked.
LANGUAGES = {
    "python": "executed",
    "sh": "each command line checked against the project",
    "ini": "parsed as a systemd unit",
    "toml": "parsed as a pyproject.toml's pytest section",
    "text": "output or a directory tree, shown for reading; never a command",
}

#: Commands outside this project that a shell sample may use, and why they are not run.
EXTERNAL_TOOLS = {
    "apt-get": "installs system packages",
    "systemctl": "manages a systemd unit (its unit file is checked as an ini sample)",
}

#: What a `pip install` sample may install besides pikku-django: the test tools a project's
#: own tests need (they are in the dev extra, so this project's suite runs on them too).
TEST_TOOLS = ("pytest", "pytest-django")

#: Virtualenvs `make` creates, whose tools samples call by path.
VIRTUALENVS = (".venv/bin/", ".venv-latest/bin/")

#: Environment variables a shell sample may set besides the PIKKU_* ones in the code.
KNOWN_ENV = {"CI", "DJANGO_SETTINGS_MODULE"}

#: Options every Django command has; the README does not list them per command.
DJANGO_COMMON_OPTIONS = {
    "-h",
    "--help",
    "--version",
    "-v",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}

_FENCE = re.compile(r"^```(?P<lang>[^`\s]*)\s*$")
_HEADING = re.compile(r"^(?P<level>#{1,6})\s+(?P<title>.+?)\s*$")
_PATH_HEADER = re.compile(r"^#\s+(?P<path>[\w./-]+\.(?:py|service|toml))\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    language: str
    code: str
    line: int  # the document's line of the block's first code line
    heading: str  # the nearest heading above it
    source: Path = README

    @property
    def where(self) -> str:
        return f"{relative(self.source)} line {self.line}"

    @property
    def id(self) -> str:
        name = relative(self.source).removeprefix("docs/").removesuffix(".md")
        return f"{name}:{self.language or 'none'}-line{self.line}"

    @property
    def path(self) -> str | None:
        """The file the block stands for, from a first line such as ``# billing/views.py``."""
        first = self.code.split("\n", 1)[0]
        match = _PATH_HEADER.match(first)
        return match["path"] if match else None

    @property
    def kind(self) -> str:
        """``settings``, ``urls``, ``module`` or ``snippet`` (python blocks)."""
        path = self.path
        if path is None:
            return "snippet"
        name = path.rsplit("/", 1)[-1]
        if name == "settings.py":
            return "settings"
        if name == "urls.py":
            return "urls"
        return "module"

    @property
    def module_name(self) -> str:
        assert self.path is not None
        return self.path.removesuffix(".py").replace("/", ".")

    def compiled(self) -> types.CodeType:
        """The code compiled so that tracebacks point at the document's lines."""
        return compile("\n" * (self.line - 1) + self.code, str(self.source), "exec")

    def defines_test_classes(self) -> bool:
        tree = ast.parse(self.code)
        return any(
            isinstance(node, ast.ClassDef) and node.name.startswith("Test") for node in tree.body
        )


def readme_text(source: Path = README) -> str:
    return source.read_text(encoding="utf-8")


def read_blocks(text: str | None = None, source: Path = README) -> list[Block]:
    """Every fenced block, in order; a fence left open is an error."""
    lines = (readme_text(source) if text is None else text).split("\n")
    blocks: list[Block] = []
    heading = ""
    i = 0
    while i < len(lines):
        heading_match = _HEADING.match(lines[i])
        if heading_match:
            heading = heading_match["title"]
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{relative(source)} line {i + 1}: a code block is never closed")
        code = "\n".join(lines[start:end])
        blocks.append(Block(fence["lang"], code, start + 1, heading, source))
        i = end + 1
    return blocks


def all_blocks() -> list[Block]:
    """The blocks of every document, document by document."""
    return [block for path in documents() for block in read_blocks(source=path)]


_USES = re.compile(r"<!--\s*samples use:\s*(?P<pages>[^>]*?)\s*-->")


def pages_used(source: Path) -> list[Path]:
    """The docs pages whose module samples ``source``'s samples also use."""
    found = []
    for match in _USES.finditer(readme_text(source)):
        for name in match["pages"].replace(",", " ").split():
            page = DOCS / name
            assert page.is_file(), f"{relative(source)}: samples use {name}, which does not exist"
            found.append(page)
    return found


def strip_blocks(text: str) -> str:
    """A document with its code blocks blanked out (line numbers kept)."""
    out: list[str] = []
    inside = False
    for line in text.split("\n"):
        if not inside and _FENCE.match(line):
            inside = True
        elif inside and line.rstrip() == "```":
            inside = False
        else:
            out.append("" if inside else line)
            continue
        out.append("")
    return "\n".join(out)


def section(title: str, text: str | None = None) -> str:
    """The text under the heading ``title`` up to the next heading of its level or above."""
    lines = (readme_text() if text is None else text).split("\n")
    inside_code = False
    start = level = None
    for i, line in enumerate(lines):
        if _FENCE.match(line) and not inside_code:
            inside_code = True
            continue
        if inside_code:
            inside_code = line.rstrip() != "```"
            continue
        match = _HEADING.match(line)
        if not match:
            continue
        if start is None and match["title"] == title:
            start, level = i + 1, len(match["level"])
        elif start is not None and level is not None and len(match["level"]) <= level:
            return "\n".join(lines[start:i])
    if start is None:
        raise AssertionError(f"no section {title!r}")
    return "\n".join(lines[start:])


def headings(text: str | None = None) -> list[str]:
    body = strip_blocks(readme_text() if text is None else text)
    return [m["title"] for line in body.split("\n") if (m := _HEADING.match(line))]


def github_slug(title: str) -> str:
    """The anchor GitHub gives a heading."""
    slug = title.strip().lower()
    slug = re.sub(r"[^\w\- ]", "", slug)
    return slug.replace(" ", "-")


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the first Markdown table in ``text`` (header excluded)."""
    rows: list[list[str]] = []
    started = False
    for line in text.split("\n"):
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not started:
                started = True
                continue  # the header
            if all(set(c) <= set("-: ") for c in cells):
                continue  # the separator
            rows.append(cells)
        elif started:
            break
    return rows


def unquote(cell: str) -> str:
    """A table cell without its backticks."""
    assert cell.startswith("`"), f"not a `code` cell: {cell!r}"
    assert cell.endswith("`"), f"not a `code` cell: {cell!r}"
    return cell[1:-1]


# -- python -------------------------------------------------------------------------


class ReadmeModules:
    """The documents' module samples, installed in ``sys.modules`` while a test runs."""

    def __init__(self) -> None:
        self.installed: list[str] = []

    def install(self, block: Block, name: str | None = None) -> types.ModuleType:
        """Execute ``block`` as the module ``name`` (by default, the path it names)."""
        name = name or block.module_name
        parts = name.split(".")
        for i in range(1, len(parts)):
            package = ".".join(parts[:i])
            if package not in sys.modules:
                module = types.ModuleType(package)
                module.__path__ = []  # a namespace package of sample modules
                sys.modules[package] = module
                self.installed.append(package)
        module = types.ModuleType(name)
        module.__file__ = f"{block.source}:{block.line}"
        sys.modules[name] = module
        self.installed.append(name)
        exec(block.compiled(), module.__dict__)  # noqa: S102  (the project's own sample)
        return module

    def remove(self) -> None:
        for name in reversed(self.installed):
            sys.modules.pop(name, None)
        self.installed.clear()


def readme_apps(blocks: list[Block]) -> set[str]:
    """Top-level packages of the module samples (the documents' example apps)."""
    return {
        b.module_name.split(".")[0] for b in blocks if b.language == "python" and b.kind == "module"
    }


def prerequisites(block: Block, blocks: list[Block]) -> list[Block]:
    """The module samples a reader has written by ``block``: those of the pages its page
    says it uses, then those above it on its own page."""
    used = pages_used(block.source)
    return [
        b
        for b in blocks
        if b.language == "python"
        and b.kind == "module"
        and not b.defines_test_classes()
        and (b.source in used or (b.source == block.source and b.line < block.line))
    ]


def call_tests(namespace: dict[str, Any], source: Path = README) -> list[str]:
    """Call every ``test_*`` function the sample itself defines; their names."""
    called = []
    for name, value in list(namespace.items()):
        code = getattr(getattr(value, "__wrapped__", value), "__code__", None)
        if name.startswith("test_") and code is not None and code.co_filename == str(source):
            value()
            called.append(name)
    return called


def ruff_findings(block: Block) -> str:
    """Pyflakes-class findings (undefined names, unused imports...) of a python sample."""
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        raise AssertionError(f"ruff is not installed next to {sys.executable}")
    done = subprocess.run(  # noqa: S603
        [
            str(ruff),
            "check",
            "--isolated",
            "--no-cache",
            "--select",
            "F",
            "--output-format",
            "concise",
            "--stdin-filename",
            f"{relative(block.source)}-line{block.line}.py",
            "-",
        ],
        input="\n" * (block.line - 1) + block.code + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def run_test_classes(block: Block, tmp_path: Path) -> str:
    """Run a sample that defines pytest test classes with pytest, in a process of its own."""
    test_file = tmp_path / f"test_readme_line{block.line}.py"
    test_file.write_text(block.code + "\n", encoding="utf-8")
    done = subprocess.run(  # noqa: S603
        [
            sys.executable,
            "-m",
            "pytest",
            str(test_file),
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(ROOT),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    summary = done.stdout.strip().rsplit("\n", 1)[-1]
    if done.returncode != 0 or "skipped" in summary or " passed" not in summary:
        raise AssertionError(
            f"{block.where}: pytest on the sample did not pass cleanly:\n"
            + done.stdout[-4000:]
            + done.stderr[-2000:]
        )
    return summary


def check_settings_namespace(namespace: dict[str, Any], apps: set[str]) -> None:
    """A settings sample sets known keys, names real apps, and passes the system checks."""
    from django.test import override_settings

    from pikku_django import checks
    from pikku_django.conf import DEFAULTS
    from pikku_django.tasks.checks import check_task_backends

    found = {k: v for k, v in namespace.items() if k.isupper()}
    assert found, "a settings sample sets no setting"
    pikku = found.get("PIKKU")
    if pikku is not None:
        assert isinstance(pikku, dict), "PIKKU must be a dict"
        unknown = set(pikku) - set(DEFAULTS)
        assert not unknown, f"PIKKU keys that pikku_django does not know: {sorted(unknown)}"
    installed = found.get("INSTALLED_APPS")
    if installed is not None:
        assert "pikku_django" in installed, "the INSTALLED_APPS sample leaves out pikku_django"
        for app in installed:
            if app not in apps:
                assert importlib.util.find_spec(app) is not None, f"no app {app!r}"
    overrides = {k: found[k] for k in ("PIKKU", "CACHES", "DATABASES", "TASKS") if k in found}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Django warns that DATABASES is overridden
        with override_settings(**overrides):
            messages = [
                message
                for check in (
                    checks.check_settings,
                    checks.check_lease_backend,
                    checks.check_workflow_database,
                    checks.check_workflow_settings,
                    check_task_backends,
                )
                for message in check()
            ]
    assert not messages, f"the system checks object to the settings sample: {messages}"


# -- shell --------------------------------------------------------------------------


def shell_commands(code: str) -> Iterator[list[str]]:
    """Each command of a shell sample as tokens (comments dropped, lines joined)."""
    logical: list[str] = []
    pending = ""
    for raw in code.split("\n"):
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        logical.append(line)
    for line in logical:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        command: list[str] = []
        redirect = False
        for token in lexer:
            if token in (";", "&&", "||", "|", "&"):
                if command:
                    yield command
                command = []
            elif token in ("<", ">", ">>"):
                redirect = True  # the file after it is the shell's, not the command's
            elif redirect:
                redirect = False
            else:
                command.append(token)
        if command:
            yield command


@dataclass
class ShellContext:
    """What running a shell sample has changed so far (its directory)."""

    cwd: Path = ROOT


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {
        m[1]
        for m in re.finditer(r"^([A-Za-z0-9][\w.-]*)\s*:(?!=)", text, re.MULTILINE)
        if "/" not in m[1]
    }


def pyproject_extras() -> set[str]:
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["project"]["optional-dependencies"])


def dev_requirements() -> set[str]:
    """The names of the distributions the dev extra requires."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dev = data["project"]["optional-dependencies"]["dev"]
    return {re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0] for requirement in dev}


def repository_source() -> str:
    """The text of the project's code, for names a sample may mention."""
    parts = []
    for folder in ("pikku_django", "tests", "benchmarks", "example_project"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "test_readme.py":
                parts.append(path.read_text(encoding="utf-8"))
    parts.append((ROOT / "Makefile").read_text())
    parts.append((ROOT / ".ci" / "run").read_text())
    return "\n".join(parts)


def check_env_name(name: str) -> None:
    if name in KNOWN_ENV:
        return
    assert name.startswith("PIKKU_"), f"unknown environment variable {name}"
    assert re.search(rf"\b{re.escape(name)}\b", repository_source()), (
        f"{name} is read nowhere in the code"
    )


def example_project_commands() -> dict[str, Path]:
    return {
        path.stem: path
        for path in EXAMPLE_PROJECT.glob("*/management/commands/*.py")
        if not path.name.startswith("_")
    }


def command_parser(name: str, *, in_example_project: bool) -> Any:
    """The argument parser of management command ``name``, as manage.py would build it."""
    from django.core.management import get_commands, load_command_class

    commands = get_commands()
    if name in commands:
        command = load_command_class(commands[name], name)
    else:
        example = example_project_commands()
        assert name in example, f"there is no management command {name!r}"
        assert in_example_project, (
            f"{name!r} is a command of example_project/: `cd example_project` first"
        )
        spec = importlib.util.spec_from_file_location(f"readme_example_{name}", example[name])
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        command = module.Command()
    return command.create_parser("manage.py", name)


def check_manage_py(args: list[str], context: ShellContext) -> Any:
    """``manage.py <command> <args>``: a real command, and arguments its parser accepts."""
    from django.core.management import CommandError

    assert args, "manage.py without a command"
    parser = command_parser(args[0], in_example_project=context.cwd == EXAMPLE_PROJECT)
    try:
        return parser.parse_args(args[1:])
    except (CommandError, SystemExit) as exc:
        raise AssertionError(f"`manage.py {' '.join(args)}`: {exc}") from exc


def manage_py_args(tokens: list[str]) -> list[str] | None:
    """The arguments after ``python manage.py`` (or ``python -m django``) in ``tokens``."""
    for i, token in enumerate(tokens):
        if Path(token).name.startswith("python") and i + 1 < len(tokens):
            if Path(tokens[i + 1]).name == "manage.py":
                return tokens[i + 2 :]
            if tokens[i + 1 : i + 3] == ["-m", "django"]:
                return tokens[i + 3 :]
    return None


def check_url_path(url: str) -> None:
    """A URL in a sample resolves to one of pikku_django's views."""
    from urllib.parse import urlsplit

    from django.urls import Resolver404, resolve

    path = urlsplit(url).path
    try:
        match = resolve(path)
    except Resolver404 as exc:
        raise AssertionError(f"{url} does not resolve") from exc
    assert match.namespace == "pikku_django", f"{url} is not one of pikku_django's URLs"
    # Any other path under the prefix reaches the webhook view, which answers 404.
    assert match.url_name != "webhook", f"{url} matches only the catch-all webhook route"


def check_shell_command(tokens: list[str], context: ShellContext, units: set[str]) -> str:
    """Check one command; returns what it was recognised as."""
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        check_env_name(tokens.pop(0).split("=", 1)[0])
    assert tokens, "an assignment alone is not a command"
    if tokens[0] == "sudo":
        tokens = tokens[1:]
    program = tokens[0]
    manage_args = manage_py_args(tokens)
    if program == "docker":
        assert manage_args is not None, "a docker sample must run manage.py"
        options = check_manage_py(manage_args, context)
        if "--stop-timeout" in tokens:
            stop = float(tokens[tokens.index("--stop-timeout") + 1])
            drain = getattr(options, "shutdown_timeout", None)
            if drain is not None:
                assert stop > drain, "docker's --stop-timeout must exceed --shutdown-timeout"
        return "docker: manage.py " + manage_args[0]
    if manage_args is not None:
        check_manage_py(manage_args, context)
        return "manage.py " + manage_args[0]
    if program == "make":
        targets = makefile_targets()
        for target in (t for t in tokens[1:] if not t.startswith("-")):
            assert target in targets, f"the Makefile has no target {target!r}"
        return "make"
    if program == "cd":
        target = (context.cwd / tokens[1]).resolve()
        assert target.is_dir(), f"no directory {tokens[1]}"
        context.cwd = target
        return "cd"
    if program == "export":
        for assignment in tokens[1:]:
            check_env_name(assignment.split("=", 1)[0])
        return "export"
    if program.startswith(VIRTUALENVS):
        # The virtualenvs `make` creates: the tool's own name says what it is.
        program = Path(program).name
    if program in ("pip", "pip3"):
        assert tokens[1] == "install", "only `pip install` samples are known"
        for spec in (t for t in tokens[2:] if not t.startswith("-")):
            if spec in TEST_TOOLS:
                assert spec in dev_requirements(), f"{spec} is not in the dev extra"
                continue
            match = re.fullmatch(r"(?:pikku-django|\.)(?:\[(?P<extras>[\w,-]+)\])?", spec)
            assert match, f"{spec!r}: the docs install only pikku-django (or this checkout)"
            extras = set((match["extras"] or "").split(",")) - {""}
            assert extras <= pyproject_extras(), f"unknown extras {extras - pyproject_extras()}"
        return "pip install"
    if program == "curl":
        urls = [t for t in tokens if t.startswith(("http://", "https://"))]
        assert urls, "a curl sample without a URL"
        for url in urls:
            check_url_path(url)
        return "curl"
    if program == "systemctl":
        for unit in (t for t in tokens[2:] if not t.startswith("-")):
            assert unit.removesuffix(".service") in units, (
                f"no ini sample declares the unit {unit!r}"
            )
        return "systemctl"
    if program in EXTERNAL_TOOLS:
        return program
    if program == "mkdocs":
        assert tokens[1:2] in (["build"], ["serve"]), "mkdocs build or mkdocs serve"
        assert MKDOCS_YML.is_file(), "no mkdocs.yml"
        return "mkdocs"
    if program.startswith("python") and tokens[1:3] == ["-m", "venv"]:
        assert len(tokens) == 4, "python -m venv takes the virtualenv's directory"
        return "venv"
    if program.startswith("python"):
        script = (context.cwd / tokens[1]).resolve()
        assert script.is_file(), f"no script {tokens[1]}"
        source = script.read_text(encoding="utf-8")
        for option in (t for t in tokens[2:] if t.startswith("--")):
            assert f'"{option.split("=")[0]}"' in source, f"{tokens[1]} has no option {option}"
        return "script"
    if program != "pytest":
        path = (context.cwd / program).resolve()
        assert path.is_file(), f"unknown command {program!r} (not a file in the repository)"
        assert os.access(path, os.X_OK), f"{program} is not executable"
    for argument in (t for t in tokens[1:] if not t.startswith("-") and "/" in t):
        assert (context.cwd / argument).exists(), f"no file {argument}"
    return program


def check_shell_block(block: Block, units: set[str]) -> list[str]:
    # The example project's README is read in its own directory.
    context = ShellContext(EXAMPLE_PROJECT if block.source.parent == EXAMPLE_PROJECT else ROOT)
    recognised = []
    for tokens in shell_commands(block.code):
        try:
            recognised.append(check_shell_command(list(tokens), context, units))
        except AssertionError as exc:
            raise AssertionError(f"{block.where}+: `{shlex.join(tokens)}`: {exc}") from exc
    assert recognised, "a shell sample with no command"
    return recognised


# -- ini ----------------------------------------------------------------------------


def parse_unit(block: Block) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys keep their case
    parser.read_string(block.code, source=block.where)
    return parser


def unit_names(blocks: list[Block]) -> set[str]:
    return {Path(b.path).stem for b in blocks if b.language == "ini" and b.path is not None}


def check_ini_block(block: Block) -> None:
    unit = parse_unit(block)
    assert block.path is not None, "name the unit file on the first line"
    assert block.path.endswith(".service"), "the unit file's name ends in .service"
    for section_name in ("Unit", "Service", "Install"):
        assert unit.has_section(section_name), f"the unit has no [{section_name}]"
    exec_start = unit.get("Service", "ExecStart")
    tokens = shlex.split(exec_start)
    manage_args = manage_py_args(tokens)
    assert manage_args is not None, "ExecStart must run manage.py"
    options = check_manage_py(manage_args, ShellContext())
    stop = unit.get("Service", "TimeoutStopSec", fallback=None)
    drain = getattr(options, "shutdown_timeout", None)
    if stop is not None and drain is not None:
        assert float(stop) > drain, "TimeoutStopSec must exceed --shutdown-timeout"
    assert unit.get("Service", "KillSignal", fallback="SIGTERM") in ("SIGTERM", "SIGINT")


# -- toml ---------------------------------------------------------------------------

#: The pytest and pytest-django options a ``pyproject.toml`` sample may set.
PYTEST_OPTIONS = {"DJANGO_SETTINGS_MODULE", "addopts", "python_files", "testpaths"}


def check_toml_block(block: Block) -> None:
    import tomllib

    assert block.path == "pyproject.toml", "name the file (# pyproject.toml) on the first line"
    options = tomllib.loads(block.code).get("tool", {}).get("pytest", {}).get("ini_options")
    assert isinstance(options, dict), "a toml sample sets [tool.pytest.ini_options]"
    assert set(options) <= PYTEST_OPTIONS, f"unknown options {set(options) - PYTEST_OPTIONS}"
    module = options.get("DJANGO_SETTINGS_MODULE")
    assert isinstance(module, str), "pytest-django needs DJANGO_SETTINGS_MODULE"
    assert re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module), f"{module!r} is no module"


# -- text ---------------------------------------------------------------------------

_COMMAND_LIKE = re.compile(r"^\s*(\$ |python |make |pip |\.venv/|curl |docker )")


def check_text_block(block: Block) -> None:
    hidden = [line for line in block.code.split("\n") if _COMMAND_LIKE.match(line)]
    assert not hidden, f"a text block hides commands, which would go untested: {hidden}"


def layout_paths(block: Block) -> Iterator[Path]:
    """The paths a layout tree names: ``dir/`` at the margin, ``a.py, b/`` indented by two."""
    top = ROOT
    for line in block.code.split("\n"):
        if not line.strip() or line.startswith("   "):
            continue
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        base = ROOT if not line.startswith(" ") else top
        for name in names.split(", "):
            path = base / name
            yield path
            if not line.startswith(" ") and name.endswith("/"):
                top = path
