"""System checks of TASKS entries that use pikku_django.tasks.PikkuBackend."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.test import override_settings

from pikku_django.tasks import PikkuBackend
from pikku_django.tasks import checks as task_checks
from pikku_django.tasks.checks import check_task_backends

BACKEND = "pikku_django.tasks.PikkuBackend"


def ids(settings_tasks: dict[str, Any]) -> list[str]:
    with override_settings(TASKS=settings_tasks):
        return [m.id for m in check_task_backends()]


def test_the_test_settings_pass() -> None:
    assert check_task_backends() == []


def test_the_check_is_registered_and_runs_with_djangos() -> None:
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": {"retries": -1}}}):
        found = [m.id for m in checks.run_checks(tags=[checks.Tags.compatibility])]
    assert "pikku_django.tasks.E002" in found


@pytest.mark.parametrize(
    "options",
    [
        {"retries": -1},
        {"retries": "3"},
        {"retry_delay": "soon"},
        {"backoff": "linear"},
        {"transactional": "yes"},
        {"retires": 3},
        ["retries", 3],
    ],
)
def test_bad_options_are_errors(options: Any) -> None:
    assert ids({"default": {"BACKEND": BACKEND, "OPTIONS": options}}) == ["pikku_django.tasks.E002"]


def test_good_options_pass() -> None:
    options = {"retries": 0, "retry_delay": "30s", "backoff": "exponential", "transactional": True}
    assert ids({"default": {"BACKEND": BACKEND, "OPTIONS": options}}) == []


@pytest.mark.parametrize("queues", ["default", [""], ["x" * 101], [1]])
def test_bad_queues_are_errors(queues: Any) -> None:
    assert ids({"default": {"BACKEND": BACKEND, "QUEUES": queues}}) == ["pikku_django.tasks.E003"]


def test_no_queues_is_a_warning() -> None:
    found = ids({"default": {"BACKEND": BACKEND, "QUEUES": []}})
    assert found == ["pikku_django.tasks.W001"]


def test_other_backends_are_left_to_their_own_checks() -> None:
    other = "django.tasks.backends.immediate.ImmediateBackend"
    assert ids({"default": {"BACKEND": other, "OPTIONS": {"retries": -1}}}) == []


def test_a_subclass_is_checked_too() -> None:
    path = "tests.test_tasks_checks.OwnBackend"
    assert ids({"x": {"BACKEND": path, "OPTIONS": {"retries": -1}}}) == ["pikku_django.tasks.E002"]


def test_without_the_framework_the_backend_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_checks, "framework_missing", lambda: "no framework here")
    found = ids({"default": {"BACKEND": BACKEND}})
    assert found == ["pikku_django.tasks.E001"]
    with override_settings(TASKS={"default": {"BACKEND": BACKEND}}):
        (message,) = check_task_backends()
    assert "no framework here" in message.msg
    assert "pikku-django[tasks]" in (message.hint or "")


def test_the_framework_is_found_on_this_install() -> None:
    assert task_checks.framework_missing() is None


class OwnBackend(PikkuBackend):  # type: ignore[misc,valid-type]
    """A project's own subclass."""
