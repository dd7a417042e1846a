"""The management commands print stored text (names, ids, errors, a provider's answers)
with its control characters escaped: a row written before identifiers were checked, or
text a provider sent, never forges a line or reaches the terminal as an escape sequence."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from pikku_django.management.output import format_table, shown
from pikku_django.models import (
    CredentialValue,
    RunStatus,
    Schedule,
    StepStatus,
    TriggerSource,
    WorkflowRun,
)
from pikku_django.webhooks.credentials import encrypt
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory
from tests.test_schedules import WORKFLOW, declare, plain_workflow  # noqa: F401  (fixture)

#: What a hostile sender or an old row may hold: a terminal title, a clipboard write
#: (OSC 52), a colour, a line of its own and a right-to-left override.
HOSTILE = "evt\x1b]0;owned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[31m\nFORGED line\u202eok"


def command(name: str, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command(name, *args, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def assert_safe(output: str) -> None:
    assert "\x1b" not in output
    assert "\x07" not in output
    assert "\u202e" not in output
    assert not [line for line in output.splitlines() if line.startswith("FORGED")]
    assert "\\x1b]0;owned\\x07" in output
    assert "\\nFORGED line\\u202eok" in output


def test_shown_escapes_what_a_terminal_would_act_on_and_keeps_the_rest() -> None:
    assert shown("evt_1 é 名前") == "evt_1 é 名前"
    assert shown("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert shown("\x1b[2J\x00\x9b") == "\\x1b[2J\\x00\\x9b"
    assert shown("\u202e\u2028") == "\\u202e\\u2028"
    assert shown(7) == "7"
    table = format_table(["NAME", "N"], [["a\x1bb", "1"], ["c", "22"]])
    assert table.splitlines() == ["NAME    N", "------  --", "a\\x1bb  1", "c       22"]


@pytest.mark.django_db
def test_pikku_runs_list_and_show_escape_stored_text() -> None:
    run = WorkflowRunFactory(workflow="cli-hostile", status=RunStatus.SUSPENDED)
    WorkflowRun.objects.filter(pk=run.pk).update(
        idempotency_key=f"webhook:src:push:{HOSTILE}",
        suspend_reason=HOSTILE,
        error={"type": "ValueError", "message": HOSTILE},
    )
    step = WorkflowStepFactory(run=run, name=f"step-{HOSTILE}", status=StepStatus.FAILED)
    StepAttemptFactory(
        step=step,
        attempt=1,
        status=StepStatus.FAILED,
        worker=HOSTILE,
        error={"type": "OSError", "message": HOSTILE},
    )
    listed = command("pikku_runs", "list")
    assert "\x1b" not in listed
    assert "FORGED" not in "".join(line[:6] for line in listed.splitlines())
    assert_safe(command("pikku_runs", "show", str(run.id)))


@pytest.mark.django_db
def test_pikku_schedules_list_and_sync_escape_stored_names(settings: Any) -> None:
    declare(settings, nightly={"workflow": WORKFLOW, "cron": "0 3 * * *"})
    command("pikku_schedules", "sync")
    Schedule.objects.filter(name="nightly").update(name=HOSTILE)  # an older row
    assert_safe(command("pikku_schedules", "sync"))
    assert_safe(command("pikku_schedules", "list"))


@pytest.mark.django_db
def test_pikku_sources_list_escapes_a_providers_detail() -> None:
    detail = f"The provider answered: {HOSTILE}"  # longer than the table shows
    TriggerSource.objects.create(name="hostile-provider", declared=False, detail=detail)
    assert_safe(command("pikku_sources", "list"))


@pytest.mark.django_db
def test_pikku_credentials_list_escapes_stored_names() -> None:
    CredentialValue.objects.create(
        credential=HOSTILE, ciphertext=encrypt("value-of-some-length"), hint="\x1b[0m"
    )
    output = command("pikku_credentials", "list")
    assert_safe(output)
    assert "…\\x1b[0m" in output
