"""``manage.py pikku_credentials``: set, list, retire and re-encrypt credential values."""

from __future__ import annotations

import getpass
import sys
from typing import Any, TextIO

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from pikku_django.conf import pikku_settings
from pikku_django.management.output import format_table, shown, yes_no
from pikku_django.models import CredentialValue
from pikku_django.schema import require_migrated
from pikku_django.webhooks.credentials import (
    keys_advice,
    keys_described,
    rotate_encryption,
    set_credential,
    undecryptable_values,
)
from pikku_django.webhooks.secret_checks import InvalidSecretError
from pikku_django.webhooks.sources import sources


def declared_credentials() -> dict[str, list[str]]:
    """Each credential the declared sources use, with the sources that use it."""
    found: dict[str, list[str]] = {}
    for source in sources():
        if source.credential:
            found.setdefault(source.credential, []).append(source.name)
    return found


class Command(BaseCommand):
    help = (
        "Credentials (webhook signing secrets), stored encrypted with "
        "PIKKU['CREDENTIAL_KEYS']: set a new value (read from stdin, or prompted for "
        "without echo), list them (never the values), retire one, or re-encrypt every "
        "value with the first key after adding a key (rotate)."
        " See `pikku_credentials SUBCOMMAND --help` for each one's options."
    )
    # call_command(..., stdin=StringIO(...)) in tests and scripts.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(
            dest="subcommand",
            required=True,
            title="subcommands",
            metavar="{set,list,retire,rotate}",
        )
        set_ = commands.add_parser(
            "set",
            help="Store a new active value for a credential.",
            description="Store a new value for NAME, encrypted. The value is read from "
            "stdin when it is piped in (e.g. `... set githubWebhookSecret < secret.txt`), "
            "else prompted for without echo. A credential may have several active values, "
            "so a secret can be rotated without dropping deliveries: add the new value, "
            "then retire the old one (or pass --replace). The value is refused, and "
            "nothing stored, when a declared source that uses NAME cannot verify with it "
            "(e.g. a Discord key that is not an Ed25519 public key).",
        )
        set_.add_argument("name", metavar="NAME", help="The credential, e.g. githubWebhookSecret.")
        set_.add_argument(
            "--replace",
            action="store_true",
            help="Retire the credential's other active values at the same time.",
        )
        commands.add_parser(
            "list",
            help="List the stored values (never the values themselves).",
            description="List every stored value: id, credential, hint (its last "
            "characters), whether it is active, and when it was created; then the declared "
            "credentials that have no active value.",
        )
        retire = commands.add_parser(
            "retire",
            help="Retire one stored value (requests signed with it are refused).",
            description="Mark the stored value ID inactive. Find IDs with `list`.",
        )
        retire.add_argument("id", metavar="ID", type=int, help="The value's id (see list).")
        commands.add_parser(
            "rotate",
            help="Re-encrypt every stored value with the first key.",
            description="After putting a new key first in PIKKU['CREDENTIAL_KEYS'] (keeping "
            "the old ones after it), re-encrypt every stored value with it; the old keys "
            "can then be removed.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        subcommand = options["subcommand"]
        if subcommand == "set":
            self.set_value(options["name"], options["replace"], options.get("stdin"))
        elif subcommand == "list":
            self.list_values()
        elif subcommand == "retire":
            self.retire(options["id"])
        elif subcommand == "rotate":
            self.rotate()

    # -- subcommands ------------------------------------------------------------------

    def set_value(self, name: str, replace: bool, stdin: TextIO | None) -> None:
        name = name.strip()
        if not name:
            raise CommandError("Give the credential's name, e.g. githubWebhookSecret.")
        value = self.read_value(name, stdin or sys.stdin)
        active = CredentialValue.objects.filter(credential=name, active=True).count()
        try:
            stored = set_credential(name, value, replace=replace)
        except InvalidSecretError as exc:
            raise CommandError(f"{shown(exc)}. Nothing was stored.") from exc
        except ImproperlyConfigured as exc:
            raise CommandError(shown(exc)) from exc
        hint = f" (…{shown(stored.hint)})" if stored.hint else ""
        self.stdout.write(self.style.SUCCESS(f"Stored value {stored.pk} for {shown(name)}{hint}."))
        if replace and active:
            self.stdout.write(f"Retired {active} older value(s).")
        left = CredentialValue.objects.filter(credential=name, active=True).count()
        self.stdout.write(f"{shown(name)} has {left} active value(s).")
        declared = declared_credentials()
        if name not in declared:
            known = shown(", ".join(sorted(declared))) or "none"
            self.stdout.write(
                self.style.WARNING(
                    f"Note: no declared source uses {name!r} (declared credentials: {known})."
                )
            )

    def read_value(self, name: str, stdin: TextIO) -> str:
        """The value from a pipe, or typed at a prompt that does not echo it."""
        if stdin.isatty():
            value = getpass.getpass(f"Value for {name} (not shown): ")
            if value and getpass.getpass("Again, to confirm: ") != value:
                raise CommandError("The two values differ: nothing was stored.")
        else:
            value = stdin.read().rstrip("\r\n")
        if not value:
            raise CommandError(f"No value given for {shown(name)}: nothing was stored.")
        return value

    def list_values(self) -> None:
        rows = [
            [
                str(row.pk),
                row.credential,
                f"…{row.hint}" if row.hint else "-",
                yes_no(row.active),
                timezone.localtime(row.created_at).strftime("%Y-%m-%d %H:%M:%S"),
            ]
            for row in CredentialValue.objects.order_by("credential", "-created_at")
        ]
        if rows:
            headers = ("ID", "CREDENTIAL", "HINT", "ACTIVE", "CREATED")
            self.stdout.write(format_table(headers, rows))
        else:
            self.stdout.write("No credential values are stored.")
        for row in undecryptable_values():
            self.stdout.write(
                self.style.ERROR(
                    f"Value {row.pk} of {shown(row.credential)} cannot be decrypted with "
                    f"{keys_described()}"
                    + (": webhooks that need it answer 503. " if row.active else ". ")
                    + f"To fix: {keys_advice()}."
                )
            )
        configured = pikku_settings.CREDENTIALS or {}
        if configured:
            self.stdout.write(
                "Also given in settings.PIKKU['CREDENTIALS']: "
                + shown(", ".join(sorted(configured)))
            )
        active = set(
            CredentialValue.objects.filter(active=True).values_list("credential", flat=True)
        )
        for name, users in sorted(declared_credentials().items()):
            if name not in active and not configured.get(name):
                self.stdout.write(
                    self.style.WARNING(
                        f"{shown(name)} has no active value: webhooks to "
                        f"{shown(', '.join(users))} are "
                        f"refused (401) until one is set."
                    )
                )

    def retire(self, pk: int) -> None:
        row = CredentialValue.objects.filter(pk=pk).first()
        if row is None:
            raise CommandError(f"No stored credential value has id {pk} (see `list`).")
        if not row.active:
            self.stdout.write(f"Value {pk} of {shown(row.credential)} was already retired.")
            return
        row.active = False
        row.save(update_fields=["active"])
        left = CredentialValue.objects.filter(credential=row.credential, active=True).count()
        self.stdout.write(
            self.style.SUCCESS(f"Retired value {pk} of {shown(row.credential)}.")
            + f" {shown(row.credential)} has {left} active value(s) left."
        )
        if not left and row.credential in declared_credentials():
            self.stdout.write(
                self.style.WARNING(
                    f"Webhooks that need {shown(row.credential)} are refused (401) "
                    "until a value is set."
                )
            )

    def rotate(self) -> None:
        from cryptography.fernet import InvalidToken

        try:
            with transaction.atomic():
                count = rotate_encryption()
        except ImproperlyConfigured as exc:
            raise CommandError(shown(exc)) from exc
        except InvalidToken as exc:
            bad = ", ".join(str(row.pk) for row in undecryptable_values())
            raise CommandError(
                f"Stored value(s) {bad} cannot be decrypted with {keys_described()}: "
                f"{keys_advice()}. Nothing was re-encrypted."
            ) from exc
        key = (
            "the first key in PIKKU['CREDENTIAL_KEYS']"
            if pikku_settings.CREDENTIAL_KEYS
            else "the key derived from SECRET_KEY (SECRET_KEY_FALLBACKS can then go)"
        )
        self.stdout.write(self.style.SUCCESS(f"Re-encrypted {count} value(s) with {key}."))
