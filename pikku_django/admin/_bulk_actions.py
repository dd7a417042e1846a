"""Bulk actions on selected workflow runs: apply an operation to each, and report."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from pikku_django.admin.formatting import status_label
from pikku_django.admin.steering import OPERATIONS, Operation, log_operation
from pikku_django.models import TERMINAL_RUN_STATUSES, WorkflowRun
from pikku_django.workflows.errors import WorkflowRunStateError

logger = logging.getLogger(__name__)


@dataclass
class ActionReport:
    """What an action did, run by run, told to the user in at most two messages."""

    verb: str  # e.g. "Cancelled"
    done: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    def tell(
        self, modeladmin: admin.ModelAdmin[Any], request: HttpRequest, infinitive: str
    ) -> None:
        parts = [
            ngettext("%(verb)s %(count)d run", "%(verb)s %(count)d runs", self.done)
            % {"verb": self.verb, "count": self.done}
        ]
        parts += [
            ngettext("%(count)d was %(reason)s", "%(count)d were %(reason)s", n)
            % {"count": n, "reason": reason}
            for reason, n in sorted(self.skipped.items())
        ]
        level = messages.SUCCESS if self.done and not self.skipped else messages.WARNING
        if self.done or self.skipped:
            modeladmin.message_user(request, "; ".join(parts) + ".", level)
        if self.failed:
            n = len(self.failed)
            modeladmin.message_user(
                request,
                ngettext(
                    "%(count)d run could not be %(what)s: %(errors)s",
                    "%(count)d runs could not be %(what)s: %(errors)s",
                    n,
                )
                % {"count": n, "what": infinitive, "errors": "; ".join(self.failed)},
                messages.ERROR,
            )


def skip_reason(operation: Operation, status: str) -> str:
    """Why a run in ``status`` was skipped: "already completed", "running, not failed"."""
    if operation == Operation.CANCEL:
        if status in TERMINAL_RUN_STATUSES:
            return _("already %(status)s") % {"status": status_label(status)}
        return status_label(status)
    return _("%(status)s, not %(wanted)s") % {
        "status": status_label(status),
        "wanted": status_label(OPERATIONS[operation].allowed[0]),
    }


def operate(
    modeladmin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[WorkflowRun],
    operation: Operation,
) -> None:
    """Apply ``operation`` to each selected run it applies to, log each, and report."""
    op = OPERATIONS[operation]
    report = ActionReport(str(op.done))
    for run in queryset.order_by("created_at"):
        if not op.applies_to(run):
            report.skip(skip_reason(operation, run.status))
            continue
        try:
            op.call(run, None)
        except WorkflowRunStateError as exc:
            current = (
                WorkflowRun.objects.using(queryset.db)
                .filter(id=run.id)
                .values_list("status", flat=True)
                .first()
            )
            if current in op.allowed:
                report.failed.append(f"{run.id} ({exc})")  # refused for another reason
            else:
                # It moved on since the list was shown: say where it is now.
                report.skip(skip_reason(operation, current) if current else _("deleted"))
        except Exception as exc:
            logger.exception("Admin action %s failed on workflow run %s", operation, run.id)
            report.failed.append(f"{run.id} ({type(exc).__name__}: {exc})")
        else:
            report.done += 1
            log_operation(modeladmin, request, run, op.log_message(None))
    report.tell(modeladmin, request, str(op.past))
