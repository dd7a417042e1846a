"""The pikku_schedules command and the schedule admin (with its permission)."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from pikku_django.models import Schedule, WorkflowRun
from tests.conftest import database_alias, on_databases
from tests.test_schedules import WORKFLOW, declare, plain_workflow  # noqa: F401  (fixture)

CHANGELIST = "admin:pikku_django_schedule_changelist"


def command(*args: str) -> str:
    out = StringIO()
    call_command("pikku_schedules", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def two_schedules(settings: Any, alias: str) -> None:
    declare(
        settings,
        alias,
        nightly={
            "workflow": WORKFLOW,
            "cron": "0 3 * * *",
            "timezone": "Europe/Helsinki",
            "input": {"kind": "nightly"},
        },
        hourly={"workflow": WORKFLOW, "cron": "0 * * * *", "missed": "none", "enabled": False},
    )


# -- the command ------------------------------------------------------------------------


@on_databases("sqlite", "postgres", "mariadb")
def test_command_lists_switches_and_triggers(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    two_schedules(settings, alias)
    table = command("list")
    assert "nightly" in table
    assert "0 3 * * * (Europe/Helsinki)" in table
    assert "hourly" in table

    listed = {item["name"]: item for item in json.loads(command("list", "--json"))}
    assert listed["nightly"]["enabled"] is True
    assert listed["nightly"]["next_tick"] is not None
    assert listed["nightly"]["input"] == {"kind": "nightly"}
    assert listed["hourly"]["enabled"] is False
    assert listed["hourly"]["next_tick"] is None
    assert listed["hourly"]["missed"] == "none"

    assert "hourly: enabled; next tick" in command("enable", "hourly")
    assert "hourly: already enabled" in command("enable", "hourly")
    assert Schedule.objects.using(alias).get(name="hourly").next_tick_at is not None
    assert "nightly: disabled" in command("disable", "nightly")
    assert Schedule.objects.using(alias).get(name="nightly").next_tick_at is None

    out = command("trigger", "nightly")
    run = WorkflowRun.objects.using(alias).get(idempotency_key__startswith="schedule:nightly:")
    assert f"nightly: started run {run.id} of {WORKFLOW}" in out
    assert run.input == {"kind": "nightly"}
    listed = {item["name"]: item for item in json.loads(command("list", "--json"))}
    assert listed["nightly"]["last_run"] == str(run.id)


@pytest.mark.parametrize("subcommand", ["enable", "disable", "trigger"])
@pytest.mark.django_db
def test_command_names_the_known_schedules_for_an_unknown_one(
    settings: Any, subcommand: str
) -> None:
    two_schedules(settings, "default")
    command("sync")
    with pytest.raises(
        CommandError, match=r"No schedule is named 'weekly'\. Known: hourly, nightly"
    ):
        command(subcommand, "weekly")


@pytest.mark.django_db
def test_command_sync_reports_and_refuses_bad_declarations(settings: Any) -> None:
    two_schedules(settings, "default")
    out = command("sync")
    assert "Created 2, updated 0, 0 no longer declared." in out
    declare(settings, nightly={"workflow": WORKFLOW, "cron": "0 3 * * *", "timezone": "Moon/Base"})
    with pytest.raises(CommandError, match="Unknown time zone 'Moon/Base'"):
        command("sync")
    assert Schedule.objects.get(name="nightly").timezone == "Europe/Helsinki"  # unchanged


def test_command_help_explains_each_subcommand(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        call_command("pikku_schedules", "enable", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "ticks that passed while it was off are not started" in help_text


# -- the admin -------------------------------------------------------------------------


def staff(*codenames: str) -> Client:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, action: str, *names: str) -> str:
    """Post ``action`` for the named schedules; the messages it queued, one a line."""
    pks = Schedule.objects.filter(name__in=names).values_list("pk", flat=True)
    response = client.post(
        reverse(CHANGELIST), {"action": action, "index": 0, "_selected_action": list(pks)}
    )
    return "\n".join(str(m) for m in get_messages(response.wsgi_request))


@pytest.mark.django_db
def test_admin_lists_next_tick_last_run_and_switch(settings: Any, admin_client: Client) -> None:
    two_schedules(settings, "default")
    command("sync")
    command("trigger", "nightly")
    run = WorkflowRun.objects.get()
    body = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "nightly" in body
    assert "At 03:00 every day" in body
    assert reverse("admin:pikku_django_workflowrun_change", args=[run.id]) in body
    assert "EET" in body or "EEST" in body  # the next tick in the schedule's own zone
    assert "disable_schedules" in body

    body = act(admin_client, "disable_schedules", "nightly")
    assert "nightly: disabled" in body
    assert not Schedule.objects.get(name="nightly").enabled
    body = act(admin_client, "enable_schedules", "nightly", "hourly")
    assert "nightly: enabled; next tick" in body
    assert Schedule.objects.filter(enabled=True).count() == 2
    body = act(admin_client, "trigger_schedules", "hourly")
    assert "hourly: started run" in body


@pytest.mark.django_db
def test_admin_refuses_the_switch_without_the_change_permission(settings: Any) -> None:
    two_schedules(settings, "default")
    command("sync")
    client = staff("view_schedule")
    page = client.get(reverse(CHANGELIST))
    assert page.status_code == 200
    body = page.content.decode()
    assert "nightly" in body
    assert "disable_schedules" not in body
    assert "trigger_schedules" not in body
    for action in ("disable_schedules", "trigger_schedules"):
        assert act(client, action, "nightly") == ""  # no action is offered, none runs
    assert Schedule.objects.get(name="nightly").enabled
    assert not WorkflowRun.objects.exists()

    nobody = Client()
    nobody.force_login(User.objects.create_user("visitor", password="pw", is_staff=True))
    assert nobody.get(reverse(CHANGELIST)).status_code == 403


@pytest.mark.django_db
def test_admin_switch_with_the_change_permission(settings: Any) -> None:
    two_schedules(settings, "default")
    command("sync")
    client = staff("view_schedule", "change_schedule")
    act(client, "disable_schedules", "nightly")
    assert not Schedule.objects.get(name="nightly").enabled


@pytest.mark.django_db
def test_admin_deletes_only_rows_no_longer_declared(settings: Any, admin_client: Client) -> None:
    two_schedules(settings, "default")
    command("sync")
    nightly = Schedule.objects.get(name="nightly")
    delete = reverse("admin:pikku_django_schedule_delete", args=[nightly.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    declare(settings, hourly={"workflow": WORKFLOW, "cron": "0 * * * *"})
    command("sync")
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert not Schedule.objects.filter(name="nightly").exists()
