"""sync, enable, disable and reconcile of trigger sources, against a provider over HTTP."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pikku_django.models import CredentialValue, TriggerSource
from pikku_django.webhooks import credential_values, lifecycle
from pikku_django.webhooks.credentials import decrypt
from pikku_django.webhooks.lifecycle import (
    DEV_REGISTRATIONS_FILE,
    SourceError,
    disable,
    enable,
    orphans,
    provider_url,
    reconcile,
    sync,
)
from pikku_django.webhooks.sources import unregister_source
from tests import webhook_provider_defs as defs
from tests.webhook_provider_defs import FakeProvider

pytestmark = pytest.mark.django_db

BASE = "https://app.example/pikku/"
HOOKS_URL = "https://app.example/pikku/webhooks/prov-hooks/"
CREDENTIAL = "provHooksWebhookSecret"
EVENTS = ["order.paid", "order.refunded"]


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    yield from defs.running_provider()


@pytest.fixture(autouse=True)
def not_in_development(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIKKU_DEV_WEBHOOK_URL", raising=False)


def row(name: str) -> TriggerSource:
    return TriggerSource.objects.get(name=name)


def posts(provider: FakeProvider) -> int:
    return sum(1 for method, _ in provider.requests if method == "POST")


# -- sync -----------------------------------------------------------------------------


def test_sync_records_declared_sources_switched_off_and_marks_the_rest_undeclared() -> None:
    TriggerSource.objects.create(name="gone-from-code", enabled=True)
    sync()
    hooks = row("prov-hooks")
    assert (hooks.declared, hooks.enabled, hooks.kind) == (True, False, "webhook")
    gone = row("gone-from-code")
    assert gone.declared is False
    assert gone.enabled is True  # sync never touches the switch


def test_sync_never_touches_enabled_and_keeps_a_known_address() -> None:
    TriggerSource.objects.update_or_create(
        name="prov-hooks",
        defaults={
            "declared": False,
            "enabled": True,
            "base_url": BASE,
            "label_prefix": "prod",
            "state": {"id": "hook-1"},
            "status": "ok",
        },
    )
    sync()
    hooks = row("prov-hooks")
    assert hooks.declared is True
    assert hooks.enabled is True
    assert (hooks.base_url, hooks.label_prefix, hooks.state) == (BASE, "prod", {"id": "hook-1"})


def test_sync_twice_changes_nothing() -> None:
    first = {r.name: (r.declared, r.enabled) for r in sync()}
    assert {r.name: (r.declared, r.enabled) for r in sync()} == first


def test_provider_url_joins_the_base_url_and_the_route() -> None:
    assert provider_url("https://a.example/pikku/", "webhooks/x/") == (
        "https://a.example/pikku/webhooks/x/"
    )
    assert provider_url("https://a.example", "/webhooks/x/") == "https://a.example/webhooks/x/"


# -- enable ---------------------------------------------------------------------------


def test_enable_switches_on_and_registers_with_the_provider(provider: FakeProvider) -> None:
    outcome = enable("prov-hooks", base_url=BASE, label_prefix="prod")
    assert (outcome.source, outcome.status, outcome.detail) == (
        "prov-hooks",
        "ok",
        "registered (missing)",
    )
    [hook] = provider.registrations.values()
    assert (hook["url"], hook["label"], hook["events"]) == (HOOKS_URL, "prod:prov-hooks", EVENTS)
    hooks = row("prov-hooks")
    assert hooks.enabled is True
    assert (hooks.status, hooks.state, hooks.base_url) == ("ok", {"id": hook["id"]}, BASE)
    # The signing secret the provider issued is the source's credential, encrypted.
    assert credential_values(CREDENTIAL) == [hook["secret"]]
    stored = CredentialValue.objects.get(credential=CREDENTIAL)
    assert stored.ciphertext != hook["secret"]
    assert hook["secret"] not in stored.ciphertext
    assert decrypt(stored.ciphertext) == hook["secret"]


def test_enable_again_finds_it_registered_at_the_recorded_address(
    provider: FakeProvider,
) -> None:
    enable("prov-hooks", base_url=BASE, label_prefix="prod")
    before = posts(provider)
    outcome = enable("prov-hooks")
    assert (outcome.status, outcome.detail) == ("ok", "already registered")
    assert posts(provider) == before
    assert len(provider.registrations) == 1
    assert row("prov-hooks").base_url == BASE


def test_enable_without_an_address_is_an_error_and_changes_nothing(
    provider: FakeProvider,
) -> None:
    sync()
    with pytest.raises(SourceError, match="no address"):
        enable("prov-hooks")
    assert row("prov-hooks").enabled is False
    assert provider.requests == []


def test_enable_an_undeclared_source_is_an_error() -> None:
    TriggerSource.objects.create(name="gone-from-code", declared=False)
    with pytest.raises(SourceError, match="No webhook source 'gone-from-code'"):
        enable("gone-from-code", base_url=BASE)
    with pytest.raises(SourceError, match="nope"):
        enable("nope", base_url=BASE)


def test_a_source_without_check_or_setup_is_manual_with_instructions(
    provider: FakeProvider,
) -> None:
    outcome = enable("prov-manual", base_url=BASE)
    assert outcome.status == "manual"
    assert "https://app.example/pikku/webhooks/prov-manual/" in outcome.detail
    assert "ping" in outcome.detail
    manual = row("prov-manual")
    assert manual.enabled is True
    assert (manual.status, manual.detail) == ("manual", outcome.detail)
    assert provider.requests == []


def test_a_source_with_check_but_no_setup_is_manual_until_registered_by_hand(
    provider: FakeProvider,
) -> None:
    outcome = enable("prov-check-only", base_url=BASE, label_prefix="prod")
    assert outcome.status == "manual"
    assert outcome.detail.startswith("missing: register https://app.example/pikku/webhooks/")
    # Someone registers it by hand; the next reconcile sees it.
    provider.registrations["by-hand"] = {
        "id": "by-hand",
        "url": "https://app.example/pikku/webhooks/prov-check-only/",
        "label": "prod:prov-check-only",
        "events": ["ping"],
        "secret": "",
    }
    [again] = reconcile()
    assert (again.source, again.status, again.detail) == (
        "prov-check-only",
        "ok",
        "already registered",
    )


def test_a_failing_check_is_recorded_as_an_error(provider: FakeProvider) -> None:
    outcome = enable("prov-broken", base_url=BASE)
    assert outcome.status == "error"
    assert outcome.detail.startswith("check failed:")
    broken = row("prov-broken")
    assert (broken.enabled, broken.status) == (True, "error")
    assert provider.registrations == {}


def test_a_failing_setup_is_recorded_as_an_error(provider: FakeProvider) -> None:
    provider.fail_with["POST"] = 503
    outcome = enable("prov-hooks", base_url=BASE)
    assert outcome.status == "error"
    assert outcome.detail.startswith("setup failed:")
    assert row("prov-hooks").state is None
    assert credential_values(CREDENTIAL) == []


# -- reconcile ------------------------------------------------------------------------


def test_reconcile_registers_only_enabled_sources(provider: FakeProvider) -> None:
    sync()
    TriggerSource.objects.filter(name="prov-hooks").update(
        enabled=True, base_url=BASE, label_prefix="prod"
    )
    outcomes = reconcile()
    assert [(o.source, o.status, o.detail) for o in outcomes] == [
        ("prov-hooks", "ok", "registered (missing)")
    ]
    assert [h["label"] for h in provider.registrations.values()] == ["prod:prov-hooks"]
    for name in ("prov-manual", "prov-check-only", "prov-broken"):
        assert (row(name).enabled, row(name).status) == (False, "")


def test_reconcile_finds_ok_and_re_registers_a_drifted_registration(
    provider: FakeProvider,
) -> None:
    enable("prov-hooks", base_url=BASE, label_prefix="prod")
    [ok] = reconcile()
    assert (ok.status, ok.detail) == ("ok", "already registered")
    [hook] = provider.registrations.values()
    hook["url"] = "https://somewhere-else.example/"  # changed at the provider
    [fixed] = reconcile()
    assert (fixed.status, fixed.detail) == ("ok", "registered (drifted)")
    [new] = provider.registrations.values()
    assert new["url"] == HOOKS_URL
    assert row("prov-hooks").state == {"id": new["id"]}
    assert new["secret"] in credential_values(CREDENTIAL)


def test_reconcile_finds_a_registration_deleted_at_the_provider_missing(
    provider: FakeProvider,
) -> None:
    enable("prov-hooks", base_url=BASE, label_prefix="prod")
    provider.registrations.clear()
    [outcome] = reconcile()
    assert (outcome.status, outcome.detail) == ("ok", "registered (missing)")
    assert len(provider.registrations) == 1


def test_reconcile_moves_enabled_sources_to_a_new_address_and_label(
    provider: FakeProvider,
) -> None:
    enable("prov-hooks", base_url=BASE, label_prefix="prod")
    [outcome] = reconcile(base_url="https://new.example/", label_prefix="blue")
    assert outcome.detail == "registered (drifted)"  # found by its id, at the old address
    [hook] = provider.registrations.values()
    assert (hook["url"], hook["label"]) == (
        "https://new.example/webhooks/prov-hooks/",
        "blue:prov-hooks",
    )
    hooks = row("prov-hooks")
    assert (hooks.base_url, hooks.label_prefix) == ("https://new.example/", "blue")


def test_reconcile_without_an_address_records_the_error() -> None:
    sync()
    TriggerSource.objects.filter(name="prov-hooks").update(enabled=True)
    [outcome] = reconcile()
    assert outcome.status == "error"
    assert "no base URL" in outcome.detail
    assert row("prov-hooks").detail == outcome.detail


# -- disable --------------------------------------------------------------------------


def test_disable_switches_off_first_then_tears_down(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    enable("prov-hooks", base_url=BASE)
    seen: list[bool] = []
    original = defs.hooks.teardown
    assert original is not None

    def teardown(ctx: Any) -> None:
        seen.append(row("prov-hooks").enabled)
        original(ctx)

    monkeypatch.setattr(defs.hooks, "teardown", teardown)
    outcome = disable("prov-hooks")
    assert seen == [False]  # off before the provider was asked
    assert (outcome.status, outcome.detail) == ("disabled", "removed from the provider")
    assert provider.registrations == {}
    hooks = row("prov-hooks")
    assert (hooks.enabled, hooks.status, hooks.state) == (False, "disabled", None)
    assert hooks.base_url == BASE  # the address is kept for the next enable


def test_a_failed_teardown_keeps_the_state_and_the_source_stays_off(
    provider: FakeProvider,
) -> None:
    enable("prov-hooks", base_url=BASE)
    state = row("prov-hooks").state
    provider.fail_with["DELETE"] = 500
    outcome = disable("prov-hooks")
    assert outcome.status == "error"
    assert outcome.detail.startswith("teardown failed:")
    hooks = row("prov-hooks")
    assert (hooks.enabled, hooks.state) == (False, state)
    assert len(provider.registrations) == 1
    # Once the provider answers again, disabling again removes it.
    provider.fail_with.clear()
    assert disable("prov-hooks").status == "disabled"
    assert provider.registrations == {}
    assert row("prov-hooks").state is None


def test_disable_without_a_registration_only_switches_off(provider: FakeProvider) -> None:
    enable("prov-manual", base_url=BASE)
    outcome = disable("prov-manual")
    assert (outcome.status, outcome.detail) == ("disabled", "")
    assert row("prov-manual").enabled is False
    assert provider.requests == []


def test_disable_a_source_without_teardown_says_to_remove_it_by_hand() -> None:
    sync()
    TriggerSource.objects.filter(name="prov-broken").update(
        enabled=True, label_prefix="prod", state={"id": "hook-5"}
    )
    outcome = disable("prov-broken")
    assert (outcome.status, outcome.detail) == (
        "disabled",
        'it declares no teardown, so it cannot be torn down: remove prod:prov-broken ({"id": '
        '"hook-5"}) from the provider by hand',
    )
    assert (row("prov-broken").enabled, row("prov-broken").state) == (False, None)


def test_disable_an_unknown_source_is_an_error() -> None:
    with pytest.raises(SourceError, match="nope"):
        disable("nope")


# -- orphans --------------------------------------------------------------------------


def test_a_registered_source_whose_declaration_left_the_code_is_an_orphan(
    provider: FakeProvider,
) -> None:
    TriggerSource.objects.create(name="never-registered", declared=False)
    defs.temporary_source("prov-temp")
    try:
        enable("prov-temp", base_url=BASE)
        assert orphans() == []
    finally:
        unregister_source("prov-temp")
    sync()
    assert row("prov-temp").declared is False
    assert orphans() == ["prov-temp"]  # not the undeclared row that holds no registration
    # Disabling it cannot tear it down (no code): it says what to do by hand.
    outcome = disable("prov-temp")
    assert outcome.status == "disabled"
    [hook] = provider.registrations.values()
    assert outcome.detail == (
        "no longer declared, so it cannot be torn down: remove prov-temp "
        f'({{"id": "{hook["id"]}"}}) from the provider by hand'
    )
    assert orphans() == []


# -- development registrations --------------------------------------------------------


@pytest.fixture
def development(monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path) -> Path:
    monkeypatch.setenv("PIKKU_DEV_WEBHOOK_URL", "https://tunnel.example/pikku/")
    monkeypatch.setenv("LOGNAME", "alice")
    settings.BASE_DIR = tmp_path
    return tmp_path / DEV_REGISTRATIONS_FILE


def database_reset() -> None:
    TriggerSource.objects.all().delete()
    CredentialValue.objects.all().delete()


def test_development_registers_under_the_developers_label_and_keeps_a_file(
    provider: FakeProvider, development: Path
) -> None:
    assert lifecycle.default_label_prefix() == "dev-alice"
    outcome = enable("prov-hooks")
    assert outcome.status == "ok"
    [hook] = provider.registrations.values()
    assert hook["label"] == "dev-alice:prov-hooks"
    assert hook["url"] == "https://tunnel.example/pikku/webhooks/prov-hooks/"
    saved = json.loads(development.read_text())
    assert saved["prov-hooks"] == {
        "url": hook["url"],
        "events": EVENTS,
        "state": {"id": hook["id"]},
        "secret": hook["secret"],
        "label": "dev-alice:prov-hooks",
    }
    assert stat.S_IMODE(development.stat().st_mode) == 0o600  # it holds secrets


@pytest.fixture
def no_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_the_development_file_is_made_owner_only_not_narrowed_after(
    provider: FakeProvider,
    development: Path,
    no_umask: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under umask 0, with no chmod allowed, the file (new, then replacing one a
    wider mode left) is 0600: it is created so, never readable by others meanwhile."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PermissionError("chmod refused")

    real_chmod = os.chmod
    monkeypatch.setattr(os, "chmod", refuse)
    monkeypatch.setattr(Path, "chmod", refuse)
    enable("prov-hooks")
    assert stat.S_IMODE(development.stat().st_mode) == 0o600
    saved = development.read_text()
    development.unlink()
    development.write_text(saved)
    real_chmod(development, 0o644)
    disable("prov-hooks")
    assert stat.S_IMODE(development.stat().st_mode) == 0o600
    assert "prov-hooks" not in json.loads(development.read_text())
    assert [p.name for p in development.parent.iterdir()] == [DEV_REGISTRATIONS_FILE]


def test_after_a_database_reset_development_does_not_register_again(
    provider: FakeProvider, development: Path
) -> None:
    enable("prov-hooks")
    [hook] = provider.registrations.values()
    requests = len(provider.requests)
    database_reset()
    outcome = enable("prov-hooks")
    assert (outcome.status, outcome.detail) == ("ok", "registered earlier in development")
    assert len(provider.requests) == requests  # the provider was not asked at all
    assert credential_values(CREDENTIAL) == [hook["secret"]]  # the secret is back
    hooks = row("prov-hooks")
    assert (hooks.enabled, hooks.state) == (True, {"id": hook["id"]})


def test_after_a_database_reset_disable_still_tears_down_what_development_registered(
    provider: FakeProvider, development: Path
) -> None:
    enable("prov-hooks")
    database_reset()
    sync()
    outcome = disable("prov-hooks")
    assert (outcome.status, outcome.detail) == ("disabled", "removed from the provider")
    assert provider.registrations == {}
    assert "prov-hooks" not in json.loads(development.read_text())
    # And the next enable registers afresh.
    assert enable("prov-hooks").detail == "registered (missing)"
    assert len(provider.registrations) == 1


def test_development_registrations_no_longer_declared_are_orphans(
    provider: FakeProvider, development: Path
) -> None:
    enable("prov-hooks")
    saved = json.loads(development.read_text())
    saved["prov-old"] = dict(saved["prov-hooks"], label="dev-alice:prov-old")
    development.write_text(json.dumps(saved))
    assert orphans() == ["prov-old"]


def test_outside_development_no_file_is_written(
    provider: FakeProvider, settings: Any, tmp_path: Path
) -> None:
    settings.BASE_DIR = tmp_path
    enable("prov-hooks", base_url=BASE)
    assert not (tmp_path / DEV_REGISTRATIONS_FILE).exists()
    assert lifecycle.default_label_prefix() == ""
