"""``manage.py pikku_sources``: list, record, switch and register webhook trigger sources."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from pikku_django.management.output import format_table, shown, yes_no
from pikku_django.models import TriggerSource
from pikku_django.schema import require_migrated
from pikku_django.webhooks import lifecycle
from pikku_django.webhooks.lifecycle import Outcome, SourceError

#: How much of a source's detail the table shows (the rest is printed below it).
DETAIL_WIDTH = 60

ADDRESS_HELP = (
    "The address where this site serves pikku_django's URLs, as providers reach it, "
    "e.g. https://example.com/pikku/ (a source's provider URL is this plus its route)."
)
LABEL_HELP = (
    "Prefix of the label sources are registered under at the provider (<prefix>:<name>). "
    "Default: the recorded one; in development (PIKKU_DEV_WEBHOOK_URL set) dev-<username>."
)


def valid_base_url(value: str) -> str:
    """argparse type: an http(s) URL with a host."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in value:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s) URL")
    return value


class Command(BaseCommand):
    help = (
        "Webhook trigger sources: list them, record the declared ones (sync), switch one "
        "on or off (enable/disable, which also register it with or remove it from its "
        "provider), and register every enabled source again (reconcile). A source is off "
        "until enabled; a disabled source's route answers 404."
        " See `pikku_sources SUBCOMMAND --help` for each one's options."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(
            dest="subcommand",
            required=True,
            title="subcommands",
            metavar="{list,sync,enable,disable,reconcile}",
        )
        commands.add_parser(
            "list",
            help="Show the trigger-source table and any orphaned registrations.",
            description="Show every source (name, enabled, declared, status, base URL, "
            "detail, updated) and the registrations whose declaration left the code. The "
            "declared sources are recorded first, as sync does; nothing is switched and no "
            "provider is contacted.",
        )
        commands.add_parser(
            "sync",
            help="Record the declared sources; mark the rest undeclared.",
            description="Add a row for each source declared in code (switched off) and mark "
            "rows whose declaration is gone as undeclared. Never switches a source on or "
            "off and never contacts a provider. migrate does this too.",
        )
        enable = commands.add_parser(
            "enable",
            help="Switch a source on and register it with its provider.",
            description="Switch NAME on (it receives webhooks at once), then check its "
            "registration with the provider and set it up when missing or drifted. "
            "Registers at --base-url, else the recorded address, else PIKKU_DEV_WEBHOOK_URL.",
        )
        enable.add_argument("name", metavar="NAME", help="The source's declared name.")
        enable.add_argument("--base-url", type=valid_base_url, metavar="URL", help=ADDRESS_HELP)
        enable.add_argument("--label-prefix", metavar="P", help=LABEL_HELP)
        disable = commands.add_parser(
            "disable",
            help="Switch a source off and remove it from its provider.",
            description="Switch NAME off first (its route answers 404 at once), then tear "
            "down its registration with the provider. If the teardown fails the provider "
            "ids are kept, so running disable again retries it.",
        )
        disable.add_argument("name", metavar="NAME", help="The source's name.")
        reconcile = commands.add_parser(
            "reconcile",
            help="Check and register every enabled source again.",
            description="For each enabled source: check its registration with the provider "
            "and set it up when missing or drifted. Disabled sources are skipped. Given "
            "--base-url or --label-prefix, every enabled source moves there. Run it on "
            "deploy.",
        )
        reconcile.add_argument("--base-url", type=valid_base_url, metavar="URL", help=ADDRESS_HELP)
        reconcile.add_argument("--label-prefix", metavar="P", help=LABEL_HELP)

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        subcommand = options["subcommand"]
        if subcommand == "list":
            self.show_table(lifecycle.sync())
        elif subcommand == "sync":
            self.sync()
        elif subcommand == "enable":
            self.switch(
                options["name"],
                "enabled",
                lambda: lifecycle.enable(
                    options["name"],
                    base_url=options["base_url"],
                    label_prefix=options["label_prefix"],
                ),
            )
        elif subcommand == "disable":
            self.switch(options["name"], "disabled", lambda: lifecycle.disable(options["name"]))
        elif subcommand == "reconcile":
            self.reconcile(options["base_url"], options["label_prefix"])
        self.show_orphans()

    # -- subcommands ------------------------------------------------------------------

    def sync(self) -> None:
        rows = lifecycle.sync()
        undeclared = sum(1 for r in rows if not r.declared)
        self.stdout.write(
            f"Recorded {len(rows) - undeclared} declared source(s); "
            f"{undeclared} no longer declared."
        )
        self.show_table(rows)

    def switch(self, name: str, verb: str, call: Any) -> None:
        try:
            outcome = call()
        except SourceError as exc:
            raise CommandError(shown(exc)) from exc
        self.show_outcome(outcome, verb)
        if outcome.status == "error":
            step = "registering it" if verb == "enabled" else "tearing it down"
            raise CommandError(f"{shown(name)} is {verb}, but {step} failed (see above).")

    def reconcile(self, base_url: str | None, label_prefix: str | None) -> None:
        outcomes = lifecycle.reconcile(base_url=base_url, label_prefix=label_prefix)
        if not outcomes:
            self.stdout.write("No enabled source to register.")
        for outcome in outcomes:
            self.show_outcome(outcome, "checked")
        skipped = TriggerSource.objects.filter(enabled=False, declared=True).count()
        if skipped:
            self.stdout.write(f"Skipped {skipped} disabled source(s).")
        failed = [o.source for o in outcomes if o.status == "error"]
        if failed:
            self.show_orphans()
            raise CommandError(
                f"{len(failed)} of {len(outcomes)} provider step(s) failed: "
                + shown(", ".join(failed))
            )

    # -- output -----------------------------------------------------------------------

    def show_outcome(self, outcome: Outcome, verb: str) -> None:
        style = {
            "error": self.style.ERROR,
            "manual": self.style.WARNING,
        }.get(outcome.status, self.style.SUCCESS)
        source, status = shown(outcome.source), shown(outcome.status)
        self.stdout.write(style(f"{source}: {verb}; provider step: {status}"))
        if outcome.detail:
            self.stdout.write(f"  {shown(outcome.detail)}")

    def show_table(self, rows: list[TriggerSource]) -> None:
        headers = ("NAME", "ENABLED", "DECLARED", "STATUS", "BASE URL", "DETAIL", "UPDATED")
        table = []
        long_details = []
        for row in rows:
            detail = " ".join(row.detail.split())
            if len(detail) > DETAIL_WIDTH:
                long_details.append((row.name, row.detail))
                detail = detail[: DETAIL_WIDTH - 1] + "…"
            table.append(
                [
                    row.name,
                    yes_no(row.enabled),
                    yes_no(row.declared),
                    row.status or "-",
                    row.base_url or "-",
                    detail or "-",
                    timezone.localtime(row.updated_at).strftime("%Y-%m-%d %H:%M:%S"),
                ]
            )
        if not table:
            self.stdout.write("No trigger sources are declared or recorded.")
            return
        self.stdout.write(format_table(headers, table))
        for name, detail in long_details:
            self.stdout.write(f"{shown(name)}: {shown(detail)}")

    def show_orphans(self) -> None:
        found = lifecycle.orphans()
        if found:
            self.stdout.write(
                self.style.WARNING(
                    f"Orphans (registered with a provider, no longer declared): "
                    f"{shown(', '.join(found))}. Remove them from the provider by hand, then run "
                    "`pikku_sources disable NAME` for each recorded one."
                )
            )
