"""``manage.py pikku_prune --older-than 30d``: delete settled runs, old webhook receipts and
the heartbeats of workers long gone; and webhook digests past their own retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from pikku_django.conf import pikku_settings
from pikku_django.heartbeats import prune_heartbeats
from pikku_django.models import WebhookDigest, WebhookReceipt, WorkerHeartbeat
from pikku_django.schema import require_migrated
from pikku_django.webhooks.digests import expired_digests
from pikku_django.workflows.durations import parse_duration
from pikku_django.workflows.runs._pruning import (
    BATCH_SIZE,
    delete_runs_and_leases,
    in_batches,
    old_receipts,
    settled_runs,
)


class Command(BaseCommand):
    help = (
        "Delete settled workflow runs (completed, failed or cancelled, with their steps and "
        "attempts and their run leases) last changed longer ago than --older-than, and "
        "webhook receipts received before then, in batches, and the heartbeat rows of "
        "workers not seen since then. Running and suspended runs, and runs a live parent "
        "still waits on, are kept. The digests of signed webhook requests (which refuse "
        "replays where the scheme signs no timestamp) are kept apart from receipts, and "
        "deleted once older than PIKKU['WEBHOOK_DIGEST_RETENTION'] (365d). Use --dry-run "
        "to see the counts first. For deletion on a schedule, without a cron job, see "
        "PIKKU['RETENTION'] and @workflow(retention=...)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            help="Age of what to delete: seconds or text such as 30d, 12h, 90min.",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count, delete nothing.")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=BATCH_SIZE,
            help=f"Rows deleted per transaction ({BATCH_SIZE}).",
        )
        parser.add_argument(
            "--database",
            default=None,
            help="The DATABASES alias holding workflows (default: PIKKU['WORKFLOW_DATABASE']).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated(options["database"])
        try:
            age = parse_duration(options["older_than"], what="--older-than")
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if age <= 0:
            raise CommandError("--older-than must be more than 0")
        batch = options["batch_size"]
        if batch < 1:
            raise CommandError("--batch-size must be at least 1")
        using = options["database"] or pikku_settings.WORKFLOW_DATABASE
        now = timezone.now()
        cutoff = now - timedelta(seconds=age)
        runs = settled_runs(using, cutoff)
        receipts = old_receipts(using, cutoff)
        workers = WorkerHeartbeat.objects.using(using).filter(seen_at__lt=cutoff)
        try:
            digests = expired_digests(using, now)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if options["dry_run"]:
            self.stdout.write(
                f"Would delete {runs.count()} settled runs and {receipts.count()} webhook "
                f"receipts older than {cutoff:%Y-%m-%d %H:%M:%S %Z}.\n"
                f"Would delete {workers.count()} heartbeats of workers not seen since then.\n"
                f"Would delete {digests.count()} webhook digests past WEBHOOK_DIGEST_RETENTION."
            )
            return
        deleted_runs = in_batches(
            runs, batch, using, "runs", lambda ids: delete_runs_and_leases(using, ids)
        )
        deleted_receipts = in_batches(
            receipts,
            batch,
            using,
            "webhook receipts",
            lambda ids: WebhookReceipt.objects.using(using).filter(pk__in=ids).delete(),
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"Deleted {deleted_runs} settled runs and {deleted_receipts} webhook receipts "
                f"older than {cutoff:%Y-%m-%d %H:%M:%S %Z}."
            )
        )
        gone = prune_heartbeats(timedelta(seconds=age), using=using, now=now)
        self.stdout.write(f"Deleted {gone} heartbeats of workers not seen since then.")
        forgotten = in_batches(
            digests,
            batch,
            using,
            "webhook digests",
            lambda ids: WebhookDigest.objects.using(using).filter(pk__in=ids).delete(),
        )
        self.stdout.write(f"Deleted {forgotten} webhook digests past WEBHOOK_DIGEST_RETENTION.")
