"""The suite runs in parallel pytest-xdist processes (`make test`): each process has its
own test databases, every process collects the same test ids, and under CI a skip in any
process fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from tests.conftest import check_stable_ids, database_alias, on_databases

ROOT = Path(__file__).resolve().parent.parent


def test_the_run_tag_names_the_xdist_worker_and_the_process() -> None:
    tag = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"
    assert tag == settings.TEST_RUN_TAG
    assert settings.DATABASES["default"]["TEST"]["NAME"].endswith(
        f"pikku_tests_{settings.TEST_RUN_TAG}.sqlite3"
    )


@on_databases("sqlite", "postgres", "mariadb")
def test_each_process_uses_the_test_database_its_tag_names(vendor: str) -> None:
    alias = database_alias(vendor)
    name = str(connections[alias].settings_dict["NAME"])
    assert name.endswith(settings.TEST_RUN_TAG) or name.endswith(
        f"{settings.TEST_RUN_TAG}.sqlite3"
    ), name


def test_ids_that_hold_an_address_are_refused() -> None:
    stable: Any = [SimpleNamespace(nodeid="tests/test_x.py::test_curve[ecdsa-p256]")]
    check_stable_ids(stable)
    unstable: Any = [
        SimpleNamespace(nodeid="tests/test_x.py::test_curve[<SECP256R1 object at 0x7f51481236>]")
    ]
    with pytest.raises(pytest.UsageError, match=r"give the parametrize call ids="):
        check_stable_ids(unstable)


def test_a_skip_in_a_parallel_run_fails_it_under_ci(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\n\n\ndef test_runs():\n    pass\n\n\n"
        "def test_skips():\n    pytest.skip('a service is missing')\n"
    )
    env = {
        **os.environ,
        "CI": "true",
        # No service: the sample needs none, and the run stays cheap.
        "PIKKU_TEST_POSTGRES_URL": "off",
        "PIKKU_TEST_MARIADB_URL": "off",
        "PIKKU_TEST_REDIS_URL": "off",
    }
    done = subprocess.run(  # noqa: S603 - this interpreter's pytest on a file of our own
        [
            sys.executable,
            "-m",
            "pytest",
            str(sample),
            *("-n", "2", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"),
            *("-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "1 passed, 1 skipped" in out, out
    assert "CI=true: 1 test(s) skipped, which fails the run." in out, out
