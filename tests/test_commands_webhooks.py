"""``manage.py pikku_sources`` and ``manage.py pikku_credentials``."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError

from pikku_django.models import CredentialValue, TriggerSource
from pikku_django.webhooks import credential_values, set_credential
from pikku_django.webhooks.lifecycle import enable, sync
from pikku_django.webhooks.sources import unregister_source
from tests import webhook_provider_defs as defs
from tests.webhook_provider_defs import FakeProvider

pytestmark = pytest.mark.django_db

BASE = "https://app.example/pikku/"
CREDENTIAL = "provHooksWebhookSecret"


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    yield from defs.running_provider()


@pytest.fixture(autouse=True)
def not_in_development(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIKKU_DEV_WEBHOOK_URL", raising=False)


def run(command: str, *args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out, no_color=True, **options)
    return out.getvalue()


def sources_cmd(*args: str) -> str:
    return run("pikku_sources", *args)


def credentials_cmd(*args: str, stdin: str | None = None) -> str:
    return run("pikku_credentials", *args, stdin=io.StringIO(stdin or ""))


def table_row(output: str, name: str) -> list[str]:
    """The cells of ``name``'s table row (columns are two or more spaces apart)."""
    for line in output.splitlines():
        if line.startswith(name + " "):
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no row for {name} in:\n{output}")


def help_text(command: str, *subcommand: str) -> str:
    parser = load_command_class("pikku_django", command).create_parser("manage.py", command)
    if subcommand:
        [subparsers] = [a for a in parser._actions if a.dest == "subcommand"]
        parser = subparsers.choices[subcommand[0]]
    return parser.format_help()


# -- pikku_sources --------------------------------------------------------------------


def test_help_describes_every_subcommand_and_option() -> None:
    main = help_text("pikku_sources")
    for name in ("list", "sync", "enable", "disable", "reconcile"):
        assert name in main
    enable_help = help_text("pikku_sources", "enable")
    assert "--base-url URL" in enable_help
    assert "--label-prefix P" in enable_help
    assert "NAME" in enable_help
    assert "--base-url" in help_text("pikku_sources", "reconcile")


def test_a_subcommand_is_required() -> None:
    with pytest.raises(CommandError, match="required"):
        sources_cmd()
    with pytest.raises(CommandError, match="invalid choice"):
        sources_cmd("frobnicate")


def test_list_shows_the_table(provider: FakeProvider) -> None:
    sync()
    enable("prov-manual", base_url=BASE)
    TriggerSource.objects.filter(name="prov-hooks").delete()  # declared, not recorded yet
    TriggerSource.objects.create(name="prov-gone", declared=True)  # its declaration left
    output = sources_cmd("list")
    assert output.splitlines()[0].split() == [
        "NAME",
        "ENABLED",
        "DECLARED",
        "STATUS",
        "BASE",
        "URL",
        "DETAIL",
        "UPDATED",
    ]
    manual = table_row(output, "prov-manual")
    assert manual[:5] == ["prov-manual", "yes", "yes", "manual", BASE]
    assert manual[5].startswith("register https://app.example/pikku/webhooks/prov-manual/")
    assert manual[5].endswith("…")  # long details are cut in the table...
    assert (
        "prov-manual: register https://app.example/pikku/webhooks/prov-manual/ with the "
        "provider by hand, for events ping" in output  # ...and given in full below it
    )
    assert table_row(output, "prov-gone")[:4] == ["prov-gone", "no", "no", "-"]
    assert table_row(output, "prov-hooks")[:5] == ["prov-hooks", "no", "yes", "-", "-"]
    assert provider.requests == []  # listing never contacts a provider


def test_sync_records_and_reports(provider: FakeProvider) -> None:
    TriggerSource.objects.filter(name="prov-hooks").delete()
    TriggerSource.objects.create(name="prov-gone", enabled=True)
    output = sources_cmd("sync")
    assert "no longer declared" in output.splitlines()[0]
    assert table_row(output, "prov-hooks")[:3] == ["prov-hooks", "no", "yes"]
    assert table_row(output, "prov-gone")[:3] == ["prov-gone", "yes", "no"]
    assert TriggerSource.objects.get(name="prov-gone").enabled is True


def test_enable_and_disable_print_each_provider_step(provider: FakeProvider) -> None:
    output = sources_cmd("enable", "prov-hooks", "--base-url", BASE, "--label-prefix", "prod")
    assert output.splitlines() == [
        "prov-hooks: enabled; provider step: ok",
        "  registered (missing)",
    ]
    [hook] = provider.registrations.values()
    assert hook["label"] == "prod:prov-hooks"
    assert credential_values(CREDENTIAL) == [hook["secret"]]
    assert hook["secret"] not in output

    assert sources_cmd("enable", "prov-hooks").splitlines() == [
        "prov-hooks: enabled; provider step: ok",
        "  already registered",
    ]
    assert sources_cmd("disable", "prov-hooks").splitlines() == [
        "prov-hooks: disabled; provider step: disabled",
        "  removed from the provider",
    ]
    assert provider.registrations == {}
    assert TriggerSource.objects.get(name="prov-hooks").enabled is False


def test_enable_a_manual_source_prints_the_instructions(provider: FakeProvider) -> None:
    output = sources_cmd("enable", "prov-manual", "--base-url", BASE)
    assert output.splitlines() == [
        "prov-manual: enabled; provider step: manual",
        "  register https://app.example/pikku/webhooks/prov-manual/ with the provider by "
        "hand, for events ping",
    ]


def test_unknown_names_are_a_command_error() -> None:
    with pytest.raises(CommandError, match="No webhook source 'nope' is declared"):
        sources_cmd("enable", "nope", "--base-url", BASE)
    with pytest.raises(CommandError, match="No webhook source 'nope' is known"):
        sources_cmd("disable", "nope")


def test_enable_without_a_base_url_is_a_command_error(provider: FakeProvider) -> None:
    sync()
    with pytest.raises(CommandError, match="has no address to register: pass a base URL"):
        sources_cmd("enable", "prov-hooks")
    assert TriggerSource.objects.get(name="prov-hooks").enabled is False
    assert provider.requests == []


@pytest.mark.parametrize("bad", ["not a url", "ftp://x.example/", "https://"])
def test_a_base_url_that_is_not_a_url_is_refused(bad: str) -> None:
    with pytest.raises(CommandError, match="is not an http"):
        sources_cmd("enable", "prov-hooks", "--base-url", bad)
    with pytest.raises(CommandError, match="is not an http"):
        sources_cmd("reconcile", "--base-url", bad)


def test_a_failed_provider_step_prints_it_and_fails(provider: FakeProvider) -> None:
    out = io.StringIO()
    with pytest.raises(CommandError, match="prov-broken is enabled, but registering it failed"):
        call_command("pikku_sources", "enable", "prov-broken", "--base-url", BASE, stdout=out)
    assert "prov-broken: enabled; provider step: error" in out.getvalue()
    assert "check failed:" in out.getvalue()

    enable("prov-hooks", base_url=BASE)
    provider.fail_with["DELETE"] = 500
    out = io.StringIO()
    with pytest.raises(CommandError, match="prov-hooks is disabled, but tearing it down failed"):
        call_command("pikku_sources", "disable", "prov-hooks", stdout=out)
    assert "teardown failed:" in out.getvalue()


def test_reconcile_prints_each_enabled_source_and_skips_disabled_ones(
    provider: FakeProvider,
) -> None:
    enable("prov-hooks", base_url=BASE)
    enable("prov-manual", base_url=BASE)
    output = sources_cmd("reconcile", "--base-url", "https://new.example/")
    lines = output.splitlines()
    assert "prov-hooks: checked; provider step: ok" in lines
    assert "  registered (drifted)" in lines
    assert "prov-manual: checked; provider step: manual" in lines
    assert any(line.startswith("Skipped ") and "disabled" in line for line in lines)
    [hook] = provider.registrations.values()
    assert hook["url"] == "https://new.example/webhooks/prov-hooks/"


def test_reconcile_with_nothing_enabled() -> None:
    sync()
    assert "No enabled source to register." in sources_cmd("reconcile")


def test_reconcile_fails_when_a_provider_step_fails(provider: FakeProvider) -> None:
    enable("prov-broken", base_url=BASE)
    enable("prov-manual", base_url=BASE)
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"1 of 2 provider step\(s\) failed: prov-broken"):
        call_command("pikku_sources", "reconcile", stdout=out)
    assert "prov-manual: checked; provider step: manual" in out.getvalue()


def test_orphans_are_reported(provider: FakeProvider) -> None:
    defs.temporary_source("prov-temp")
    try:
        enable("prov-temp", base_url=BASE)
    finally:
        unregister_source("prov-temp")
    for subcommand in ("list", "sync", "reconcile"):
        output = sources_cmd(subcommand)
        assert "Orphans (registered with a provider, no longer declared): prov-temp." in output
    output = sources_cmd("disable", "prov-temp")
    assert "cannot be torn down" in output
    assert "Orphans" not in sources_cmd("list")


# -- pikku_credentials ----------------------------------------------------------------


def test_credentials_help() -> None:
    main = help_text("pikku_credentials")
    for name in ("set", "list", "retire", "rotate"):
        assert name in main
    assert "--replace" in help_text("pikku_credentials", "set")
    assert "ID" in help_text("pikku_credentials", "retire")


def test_set_reads_the_value_from_stdin_and_never_prints_it() -> None:
    value = "whsec-from-a-pipe-0042"
    output = credentials_cmd("set", CREDENTIAL, stdin=value + "\n")
    stored = CredentialValue.objects.get(credential=CREDENTIAL)
    assert output.splitlines() == [
        f"Stored value {stored.pk} for {CREDENTIAL} (…0042).",
        f"{CREDENTIAL} has 1 active value(s).",
    ]
    assert value not in output
    assert stored.ciphertext != value
    assert credential_values(CREDENTIAL) == [value]  # without the newline


def test_set_keeps_a_multi_line_value() -> None:
    pem = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n"
    credentials_cmd("set", CREDENTIAL, stdin=pem)
    assert credential_values(CREDENTIAL) == [pem.rstrip("\n")]


def test_set_with_replace_retires_the_other_values() -> None:
    set_credential(CREDENTIAL, "old-one-1111")
    set_credential(CREDENTIAL, "old-two-2222")
    output = credentials_cmd("set", CREDENTIAL, "--replace", stdin="new-three-3333")
    assert "Retired 2 older value(s)." in output
    assert f"{CREDENTIAL} has 1 active value(s)." in output
    assert credential_values(CREDENTIAL) == ["new-three-3333"]


def test_set_prompts_without_echo_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    prompts: list[str] = []

    def fake_getpass(prompt: str = "") -> str:
        prompts.append(prompt)
        return "typed-secret-7777"

    monkeypatch.setattr("getpass.getpass", fake_getpass)
    output = run("pikku_credentials", "set", CREDENTIAL, stdin=Terminal())
    assert prompts == [f"Value for {CREDENTIAL} (not shown): ", "Again, to confirm: "]
    assert "typed-secret-7777" not in output
    assert credential_values(CREDENTIAL) == ["typed-secret-7777"]

    answers = iter(["one-value", "another-value"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    with pytest.raises(CommandError, match="differ"):
        run("pikku_credentials", "set", CREDENTIAL, stdin=Terminal())
    assert credential_values(CREDENTIAL) == ["typed-secret-7777"]


def test_set_without_a_value_is_an_error() -> None:
    with pytest.raises(CommandError, match="No value given"):
        credentials_cmd("set", CREDENTIAL, stdin="\n")
    assert not CredentialValue.objects.exists()


def test_set_notes_a_credential_no_source_declares() -> None:
    output = credentials_cmd("set", "typoWebhookSecret", stdin="x")
    assert "no declared source uses 'typoWebhookSecret'" in output
    assert CREDENTIAL in output  # the declared ones are named


def test_list_shows_hints_never_values(settings: Any) -> None:
    first = set_credential(CREDENTIAL, "list-me-not-abcd")
    retired = set_credential(CREDENTIAL, "retired-value-wxyz")
    retired.active = False
    retired.save()
    short = set_credential("otherSecret", "short")
    settings.PIKKU = {"CREDENTIALS": {"fromSettingsSecret": "in-settings-value"}}
    output = credentials_cmd("list")
    assert output.splitlines()[0].split() == ["ID", "CREDENTIAL", "HINT", "ACTIVE", "CREATED"]
    assert table_row(output, str(first.pk))[:4] == [str(first.pk), CREDENTIAL, "…abcd", "yes"]
    assert table_row(output, str(retired.pk))[:4] == [str(retired.pk), CREDENTIAL, "…wxyz", "no"]
    assert table_row(output, str(short.pk))[:4] == [str(short.pk), "otherSecret", "-", "yes"]
    for value in ("list-me-not-abcd", "retired-value-wxyz", "short", "in-settings-value"):
        assert value not in output.replace("otherSecret", "")
    assert "Also given in settings.PIKKU['CREDENTIALS']: fromSettingsSecret" in output
    assert f"{CREDENTIAL} has no active value" not in output


def test_list_points_out_declared_credentials_without_a_value(settings: Any) -> None:
    output = credentials_cmd("list")
    assert "No credential values are stored." in output
    assert (
        f"{CREDENTIAL} has no active value: webhooks to prov-hooks are refused (401) until "
        "one is set." in output
    )
    settings.PIKKU = {"CREDENTIALS": {CREDENTIAL: "given-in-settings"}}
    assert f"{CREDENTIAL} has no active value" not in credentials_cmd("list")


def test_retire(provider: FakeProvider) -> None:
    stored = set_credential(CREDENTIAL, "retire-me-1234")
    output = credentials_cmd("retire", str(stored.pk))
    assert f"Retired value {stored.pk} of {CREDENTIAL}." in output
    assert f"{CREDENTIAL} has 0 active value(s) left." in output
    assert "refused (401)" in output
    assert credential_values(CREDENTIAL) == []
    assert "already retired" in credentials_cmd("retire", str(stored.pk))
    with pytest.raises(CommandError, match="No stored credential value has id 999999"):
        credentials_cmd("retire", "999999")
    with pytest.raises(CommandError, match="invalid int value"):
        credentials_cmd("retire", "abc")


def test_rotate_re_encrypts_with_the_first_key(settings: Any) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.PIKKU = {"CREDENTIAL_KEYS": [old]}
    stored = set_credential(CREDENTIAL, "rotate-me-5555")
    settings.PIKKU = {"CREDENTIAL_KEYS": [new, old]}
    output = credentials_cmd("rotate")
    assert output.strip() == (
        "Re-encrypted 1 value(s) with the first key in PIKKU['CREDENTIAL_KEYS']."
    )
    settings.PIKKU = {"CREDENTIAL_KEYS": [new]}  # the old key can go
    assert credential_values(CREDENTIAL) == ["rotate-me-5555"]
    stored.refresh_from_db()
    assert Fernet(new.encode()).decrypt(stored.ciphertext.encode()) == b"rotate-me-5555"


def test_rotate_without_an_old_key_is_a_command_error_and_rewrites_nothing(
    settings: Any,
) -> None:
    kept, lost, new = (Fernet.generate_key().decode() for _ in range(3))
    settings.PIKKU = {"CREDENTIAL_KEYS": [kept]}
    first = set_credential("aSecret", "first-6666")  # rotated first, then rolled back
    settings.PIKKU = {"CREDENTIAL_KEYS": [lost]}
    second = set_credential("bSecret", "second-7777")
    settings.PIKKU = {"CREDENTIAL_KEYS": [new, kept]}
    before = {first.pk: first.ciphertext, second.pk: second.ciphertext}
    with pytest.raises(CommandError, match=r"back in PIKKU\[.CREDENTIAL_KEYS.\]"):
        credentials_cmd("rotate")
    after = dict(CredentialValue.objects.values_list("pk", "ciphertext"))
    assert after == before
