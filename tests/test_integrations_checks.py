"""The integrations' system checks, and the start-up wiring that follows their settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.checks import ERROR
from django.http import HttpResponse

from pikku_django import signals
from pikku_django.checks import check_settings
from pikku_django.integrations import checks as integration_checks
from pikku_django.integrations import install_configured
from pikku_django.webhooks import WebhookSource, register_source
from pikku_django.webhooks.sources import unregister_source

pytest.importorskip("prometheus_client", reason="pip install 'pikku-django[prometheus]'")
pytest.importorskip("sentry_sdk", reason="pip install 'pikku-django[sentry]'")

from pikku_django.integrations import prometheus, sentry


def ids() -> list[str]:
    return [m.id or "" for m in integration_checks.check_integrations()]


@pytest.fixture
def multiproc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    return tmp_path


def test_nothing_is_reported_while_both_are_off(settings: Any) -> None:
    settings.PIKKU = {}
    assert ids() == []


def test_a_missing_package_is_an_error_with_the_pip_line(
    settings: Any, multiproc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PIKKU = {"PROMETHEUS_METRICS": True, "SENTRY": True}
    assert ids() == []
    monkeypatch.setattr(integration_checks, "missing_package", lambda setting: "somemodule")
    messages = integration_checks.check_integrations()
    assert [m.id for m in messages] == ["pikku_django.E401", "pikku_django.E402"]
    assert "pikku-django[prometheus]" in (messages[0].hint or "")
    assert "pikku-django[sentry]" in (messages[1].hint or "")


def test_the_multiprocess_directory_is_checked(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PIKKU = {"PROMETHEUS_METRICS": True}
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
    assert ids() == ["pikku_django.W401"]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "absent"))
    assert ids() == ["pikku_django.E404"]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert ids() == []


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("PROMETHEUS_TOKEN", "", "E403"),
        ("PROMETHEUS_TOKEN", 1234, "E403"),
        ("PROMETHEUS_TOKEN", [], "E403"),
        ("PROMETHEUS_TOKEN", ["good", ""], "E403"),
        ("PROMETHEUS_PERMISSION", "view_workflowrun", "E405"),
        ("ADMIN_BASE_URL", "ops.example.com", "E406"),
        ("ADMIN_BASE_URL", "ftp://ops.example.com", "E406"),
    ],
)
def test_bad_values_are_errors(
    settings: Any, multiproc: Path, key: str, value: Any, error: str
) -> None:
    settings.PIKKU = {"PROMETHEUS_METRICS": True, key: value}
    # A value of the wrong type is reported by the settings' type rules, a wrong value
    # of the right type by the integrations' own check: once, either way.
    found = ids() + [m.id or "" for m in check_settings() if m.level >= ERROR]
    assert found == [f"pikku_django.{error}"]


def test_good_values_pass(settings: Any, multiproc: Path) -> None:
    settings.PIKKU = {
        "PROMETHEUS_METRICS": True,
        "PROMETHEUS_TOKEN": ["old", "new"],
        "PROMETHEUS_PERMISSION": "auth.view_user",
        "ADMIN_BASE_URL": "https://ops.example.com/",
        "SENTRY": True,
    }
    assert ids() == []


def test_a_webhook_source_on_the_metrics_route_is_warned_of(settings: Any, multiproc: Path) -> None:
    settings.PIKKU = {"PROMETHEUS_METRICS": True}
    register_source(
        WebhookSource(name="obs-shadowed", route="metrics", receive=lambda r, c: HttpResponse())
    )
    try:
        assert ids() == ["pikku_django.W402"]
    finally:
        unregister_source("obs-shadowed")


def test_start_up_connects_what_the_settings_switch_on(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def connected() -> tuple[bool, bool]:
        return (
            prometheus.on_webhook_received in _receivers(signals.webhook_received),
            sentry.on_step_attempt_failed in _receivers(signals.step_attempt_failed),
        )

    try:
        settings.PIKKU = {}
        assert install_configured() == []
        assert connected() == (False, False)
        settings.PIKKU = {"SENTRY": True}
        assert install_configured() == ["SENTRY"]
        assert connected() == (False, True)
        settings.PIKKU = {"PROMETHEUS_METRICS": True, "SENTRY": True}
        monkeypatch.setattr(
            "pikku_django.integrations.missing_package",
            lambda setting: "prometheus_client" if setting == "PROMETHEUS_METRICS" else None,
        )
        assert install_configured() == ["SENTRY"]  # the check reports the other
        assert connected() == (False, True)
        monkeypatch.undo()
        assert install_configured() == ["PROMETHEUS_METRICS", "SENTRY"]
        assert connected() == (True, True)
    finally:
        prometheus.uninstall()
        sentry.uninstall()
    assert connected() == (False, False)


def _receivers(signal: Any) -> list[Any]:
    """The receivers connected strongly (as the integrations connect theirs)."""
    return [entry[1] for entry in signal.receivers]
