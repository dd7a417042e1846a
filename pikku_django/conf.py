"""The ``PIKKU`` settings dict, with its documented defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

#: Every key the ``PIKKU`` dict understands, with its default.
DEFAULTS: dict[str, Any] = {
    # Where leases live: "database", "redis", "memory", or the dotted path of a
    # LeaseService subclass (built with no arguments).
    "LEASE_BACKEND": "database",
    # The DATABASES alias the database backend writes its leases through.
    "LEASE_DATABASE": "default",
    # PostgreSQL: prepare the lease statements on the lease connections. Turn off
    # behind PgBouncer older than 1.21 in transaction mode.
    "LEASE_PREPARED_STATEMENTS": True,
    # The CACHES alias of a django-redis cache, required by the redis backend.
    "LEASE_CACHE": None,
    # Prefix for the Redis keys the redis backend writes.
    "LEASE_KEY_PREFIX": "pikku:lease:",
    # Default length of a lease held with hold_lease(), in milliseconds.
    "LEASE_TTL_MS": 30_000,
    # The DATABASES alias that holds workflow runs, steps and attempts.
    "WORKFLOW_DATABASE": "default",
    # A DATABASES alias (a replica of WORKFLOW_DATABASE) that the screens people only
    # read draw from: the admin's lists and pages, the dashboard, pikku_runs list and
    # show, the JSON status endpoint. Claims, leases, settles, starts, the status
    # stream and every worker use WORKFLOW_DATABASE. None: WORKFLOW_DATABASE.
    "READ_DATABASE": None,
    # PostgreSQL: prepare pikku_django's own hot-path statements (steps, webhook
    # events) on Django's connection (off behind PgBouncer before 1.21 in
    # transaction mode).
    "PREPARED_STATEMENTS": True,
    # The connection pooler in front of each DATABASES alias, in PgBouncer's words:
    # {"default": "transaction"} (or "session", or "none", the default for an alias
    # not named). Behind "transaction" nothing pikku_django does keeps state in a
    # server session: no prepared statements, LISTEN or session locks and settings.
    "DATABASE_POOLING": {},
    # Defaults of every step: retries after the first attempt, the delay before
    # a retry (seconds, a timedelta or text like "5s"), and "fixed" or
    # "exponential" backoff (the delay doubles after each failed attempt).
    "STEP_RETRIES": 5,
    "STEP_RETRY_DELAY": 1.0,
    "STEP_BACKOFF": "fixed",
    # How long a worker's claim on a step lasts unless renewed, in milliseconds.
    "STEP_LEASE_MS": 60_000,
    # Queues with settings of their own, each key optional: {"reports": {
    # "lease_ms": 300_000, "concurrency": 8, "rate": "100/1m"}}. lease_ms
    # overrides STEP_LEASE_MS; concurrency caps the queue's steps claimed under a
    # live lease at once across all workers; rate is claims per period. Queues
    # not named here have no limits.
    "QUEUES": {},
    # Deprecated (a system check warns): queue name to lease in milliseconds, as
    # QUEUES' lease_ms, which wins where both are set.
    "QUEUE_LEASE_MS": {},
    # The lease each orchestration pass holds on its run, in milliseconds.
    "RUN_LEASE_MS": 30_000,
    # A pass that has not finished after this many seconds (its worker died) is
    # retried by another worker.
    "RUN_PASS_TIMEOUT": 300,
    # pikku_worker: threads, and seconds between polls when no notification
    # wakes it (PostgreSQL wakes idle workers at once with LISTEN/NOTIFY).
    "WORKER_CONCURRENCY": 4,
    # How many pikku_worker processes the deployment runs (informs a system
    # check: SQLite allows only one).
    "WORKER_PROCESSES": 1,
    "WORKER_POLL_INTERVAL": 1.0,
    "WORKER_NOTIFY": True,
    # PostgreSQL: seconds between an idle worker's own looks for work while its
    # LISTEN works (new work is announced; timers and lapsing leases are looked up).
    "WORKER_NOTIFIED_POLL_INTERVAL": 10.0,
    # PostgreSQL behind a transaction pooler (DATABASE_POOLING) with no LISTEN
    # alias: seconds between an idle notified worker's looks for work, which it
    # cannot be told of (at most WORKER_POLL_INTERVAL).
    "WORKER_POOLED_POLL_INTERVAL": 0.25,
    # PostgreSQL: per DATABASES alias, another alias reaching the same database
    # without a transaction pooler, used only to LISTEN for wake-ups:
    # {"default": "direct"}. Without one, behind a transaction pooler, workers poll.
    "LISTEN_DATABASES": {},
    # Seconds between pikku_worker's progress lines (claimed, finished, failed,
    # retried, recovered).
    "WORKER_PROGRESS_INTERVAL": 60.0,
    # pikku_worker: the most units of due work (due runs, ready steps) one claim
    # takes, for as many of the worker's threads as are free (never more); each unit
    # claimed with its own attempt and lease. 1: each thread claims one at a time.
    "WORKER_CLAIM_BATCH": 32,
    # Recovery inside pikku_worker: every RECOVERY_INTERVAL seconds one worker
    # wakes runs that have had nothing in flight for STALLED_RUN_AFTER seconds.
    # (Steps whose worker died are reclaimed as soon as their lease lapses.)
    "RECOVERY_INTERVAL": 30.0,
    "STALLED_RUN_AFTER": 300.0,
    # How many times an orchestration pass that hits a data or programming error
    # (a value the database refuses, a missing table) is tried before its run fails
    # with that error. Connection, serialization and deadlock errors retry with
    # backoff and never fail the run.
    "PASS_ERROR_TRIES": 3,
    # pikku_worker: a thread that settles a step carries its run on to the next
    # pass itself (under the run lease it kept), instead of queueing the run for
    # any worker. Off: every pass is claimed from the runs table.
    "CARRY_RUNS": True,
    # Starting a run replays its workflow up to the first queued step it reaches (no
    # database access and no writes allowed) and stores that step with the run: a
    # PostgreSQL worker then claims the run with its step in one statement and skips
    # the first pass. Off: the first pass finds the step, as every later one does.
    "FIRST_STEP_AT_START": True,
    # The most steps one run may record (a workflow's @workflow(max_steps=...)
    # overrides it); a run about to record more fails with WorkflowStepLimitError,
    # so a workflow that loops without end stops instead of growing for ever.
    "MAX_STEPS_PER_RUN": 100_000,
    # pikku_worker: how many async def steps one worker process runs at once on its
    # event loop (they wait on I/O without holding a thread each).
    "ASYNC_CONCURRENCY": 100,
    # pikku_worker passes only runs that started under a version its code carries
    # (the workflow's own version, or one named in @workflow(replays=...)); other
    # runs are left to the workers that carry them. Off: every worker passes every run.
    "WORKFLOW_CARRIED_VERSIONS_ONLY": False,
    # Fernet keys that encrypt stored credentials (webhook secrets): the first
    # encrypts, all decrypt. Empty: one key derived from SECRET_KEY.
    "CREDENTIAL_KEYS": [],
    # Credential values given in settings instead of the database:
    # {"githubWebhookSecret": "..."} or a list of values during a rotation.
    "CREDENTIALS": {},
    # Who may see a run's status and stream: None means users with the
    # pikku_django.view_workflowrun permission; or the dotted path of a
    # function (request, run) -> bool.
    "RUN_VIEW_PERMISSION": None,
    # The status stream: seconds between looks when nothing wakes it (PostgreSQL
    # wakes it with NOTIFY), between keep-alive comments, and before it ends.
    "STREAM_POLL_INTERVAL": 1.0,
    "STREAM_HEARTBEAT": 15.0,
    "STREAM_MAX_SECONDS": 3600.0,
    # The largest webhook body read, in bytes; larger requests get 413.
    "WEBHOOK_MAX_BODY": 1_048_576,
    # PostgreSQL: keep each enabled webhook source's switch and secrets on a
    # persistent connection between requests, dropped when a change is notified;
    # every stored event re-checks them in its own statement. Turn off where
    # notifications do not reach the web server's connections (a pooler in
    # transaction mode; DATABASE_POOLING says so, and nothing is kept there).
    "WEBHOOK_STATE_CACHE": True,
    # How long pikku_prune keeps the digest of each signed request accepted from a
    # source whose scheme signs no timestamp checked against a replay window (GitHub,
    # Shopify, SendGrid without one), so that a replay of it is refused even after its
    # receipts are pruned: seconds, a timedelta or text like "365d"; None keeps them
    # for ever.
    "WEBHOOK_DIGEST_RETENTION": "365d",
    # How long settled runs (completed, failed, cancelled) are kept before the workers
    # delete them, hourly, in batches: seconds, a timedelta or text like "30d". A
    # workflow's @workflow(retention=...) overrides it ("forever" keeps its runs).
    # Webhook receipts and the heartbeats of workers gone go after it too. None keeps
    # everything for ever (delete with pikku_prune) unless a workflow sets its own.
    "RETENTION": None,
    # Cron schedules besides @workflow(schedule=...), by name: {"nightly-report":
    # {"workflow": "send_report", "cron": "0 3 * * *", "timezone": "Europe/Helsinki",
    # "input": {...}, "missed": "latest", "enabled": True}}. Only workflow and cron
    # are required; the other keys default to the settings below, input None, and
    # enabled True.
    "SCHEDULES": {},
    # The time zone a schedule's cron expression is read in when it names none;
    # None: Django's TIME_ZONE.
    "SCHEDULE_TIMEZONE": None,
    # What a schedule does with ticks that passed while no worker was up (more
    # than SCHEDULE_GRACE seconds late): "latest" starts one run for all the due
    # ticks, the latest's; "all" starts each (the latest SCHEDULE_CATCHUP_LIMIT of
    # them); "none" starts only the ticks still on time.
    "SCHEDULE_MISSED": "latest",
    "SCHEDULE_CATCHUP_LIMIT": 100,
    # Seconds a tick may be late (a busy or slow worker) and still count as on
    # time rather than missed.
    "SCHEDULE_GRACE": 60.0,
    # Prometheus metrics of runs, steps, queues, workers and webhooks (pip install
    # 'pikku-django[prometheus]'), served at the "metrics" URL of pikku_django.urls.
    # Several processes on a host share them through PROMETHEUS_MULTIPROC_DIR.
    "PROMETHEUS_METRICS": False,
    # Who may scrape the metrics: a request carrying "Authorization: Bearer <token>"
    # with this token (or one of a list, during a rotation), or a logged-in staff
    # user with PROMETHEUS_PERMISSION.
    "PROMETHEUS_TOKEN": None,
    "PROMETHEUS_PERMISSION": "pikku_django.view_workflowrun",
    # Report each step's final failure to Sentry (pip install 'pikku-django[sentry]';
    # sentry_sdk.init() as usual), and with SENTRY_EACH_ATTEMPT every failed attempt.
    "SENTRY": False,
    "SENTRY_EACH_ATTEMPT": False,
    # The site's base URL ("https://ops.example.com"), to make the admin links sent
    # with reports absolute; None: the path alone.
    "ADMIN_BASE_URL": None,
}


@dataclass(frozen=True)
class Rule:
    """What the value of one ``PIKKU`` key must be: one of ``types`` (never a bool for a
    number) and, for a number, finite and within ``minimum``/``maximum``; or None, or a
    function, where allowed. ``what`` says it in an error, after "must be".
    """

    types: tuple[type, ...]
    what: str
    minimum: float | None = None
    above: bool = False  # the minimum itself is refused
    maximum: float | None = None
    allows_none: bool = False
    allows_function: bool = False
    #: The system check id an error is reported under.
    check_id: str = "pikku_django.E015"

    def accepts(self, value: object) -> bool:
        """Whether ``value`` is of the type and within the range."""
        if value is None:
            return self.allows_none
        if self.allows_function and callable(value) and not isinstance(value, type):
            return True
        if isinstance(value, bool):
            return bool in self.types
        if not isinstance(value, self.types):
            return False
        if isinstance(value, int | float) and bool not in self.types:
            return self._in_range(value)
        return True

    def _in_range(self, number: float) -> bool:
        if not math.isfinite(number):
            return False
        low = self.minimum
        if low is not None and (number <= low if self.above else number < low):
            return False
        return self.maximum is None or number <= self.maximum


FLAG = Rule((bool,), "True or False")
TEXT = Rule((str,), "a str")
ALIAS = Rule((str,), "a str naming an alias")
DICT = Rule((dict,), "a dict")
COUNT = Rule((int,), "an int of 1 or more", minimum=1)
SECONDS = Rule((int, float), "a number of seconds above 0", minimum=0, above=True)
MILLISECONDS = Rule(
    (int,), "a positive int of milliseconds", minimum=1, check_id="pikku_django.E014"
)

#: The type (and range) of every key in :data:`DEFAULTS`, one rule a key. The system
#: checks report a value that breaks its rule; the checks of what a value means (an
#: alias that exists, a cron time zone) read only values of the right type.
RULES: dict[str, Rule] = {
    "LEASE_BACKEND": Rule((str,), "a str: 'database', 'redis', 'memory' or a dotted path"),
    "LEASE_DATABASE": ALIAS,
    "LEASE_PREPARED_STATEMENTS": FLAG,
    "LEASE_CACHE": Rule((str,), "a str naming a CACHES alias, or None", allows_none=True),
    "LEASE_KEY_PREFIX": TEXT,
    "LEASE_TTL_MS": Rule(
        (int,), "a positive int of milliseconds", minimum=1, check_id="pikku_django.E002"
    ),
    "WORKFLOW_DATABASE": ALIAS,
    "READ_DATABASE": Rule((str,), "a str naming a DATABASES alias, or None", allows_none=True),
    "PREPARED_STATEMENTS": FLAG,
    "DATABASE_POOLING": Rule(
        (dict,),
        "a dict of DATABASES alias to 'transaction', 'session' or 'none'",
        check_id="pikku_django.E510",
    ),
    "STEP_RETRIES": Rule((int,), "an int of 0 or more", minimum=0, check_id="pikku_django.E012"),
    "STEP_RETRY_DELAY": Rule(
        (int, float, str, timedelta),
        "seconds, a timedelta or text like '5s'",
        check_id="pikku_django.E010",
    ),
    "STEP_BACKOFF": Rule((str,), "'fixed' or 'exponential'", check_id="pikku_django.E011"),
    "STEP_LEASE_MS": MILLISECONDS,
    "QUEUES": Rule((dict,), "a dict of queue name to its settings", check_id="pikku_django.E017"),
    "QUEUE_LEASE_MS": Rule(
        (dict,), "a dict of queue name to milliseconds", check_id="pikku_django.E013"
    ),
    "RUN_LEASE_MS": MILLISECONDS,
    "RUN_PASS_TIMEOUT": SECONDS,
    "WORKER_CONCURRENCY": COUNT,
    "WORKER_PROCESSES": COUNT,
    "WORKER_POLL_INTERVAL": Rule(
        (int, float), SECONDS.what, minimum=0, above=True, check_id="pikku_django.E019"
    ),
    "WORKER_NOTIFY": FLAG,
    "WORKER_NOTIFIED_POLL_INTERVAL": Rule(
        (int, float), SECONDS.what, minimum=0, above=True, check_id="pikku_django.E019"
    ),
    "WORKER_POOLED_POLL_INTERVAL": Rule(
        (int, float), SECONDS.what, minimum=0, above=True, check_id="pikku_django.E019"
    ),
    "LISTEN_DATABASES": Rule((dict,), "a dict of database alias to the alias it LISTENs through"),
    "WORKER_PROGRESS_INTERVAL": SECONDS,
    "WORKER_CLAIM_BATCH": COUNT,
    "RECOVERY_INTERVAL": SECONDS,
    "STALLED_RUN_AFTER": SECONDS,
    "PASS_ERROR_TRIES": COUNT,
    "CARRY_RUNS": FLAG,
    "FIRST_STEP_AT_START": FLAG,
    "ASYNC_CONCURRENCY": Rule((int,), COUNT.what, minimum=1, check_id="pikku_django.E018"),
    "WORKFLOW_CARRIED_VERSIONS_ONLY": FLAG,
    "CREDENTIAL_KEYS": Rule((list, tuple, str), "a list of Fernet keys"),
    "CREDENTIALS": Rule((dict,), "a dict of credential name to a value or list of values"),
    "RUN_VIEW_PERMISSION": Rule(
        (str,),
        "None, a function (request, run) -> bool or its dotted path",
        allows_none=True,
        allows_function=True,
    ),
    "STREAM_POLL_INTERVAL": SECONDS,
    "STREAM_HEARTBEAT": SECONDS,
    "STREAM_MAX_SECONDS": SECONDS,
    "WEBHOOK_MAX_BODY": Rule((int,), "a positive int of bytes", minimum=1),
    "WEBHOOK_STATE_CACHE": FLAG,
    "SCHEDULES": Rule((dict,), "a dict of schedule name to its declaration"),
    "SCHEDULE_TIMEZONE": Rule(
        (str,), "a time zone name or None", allows_none=True, check_id="pikku_django.E302"
    ),
    "SCHEDULE_MISSED": Rule((str,), "'latest', 'all' or 'none'", check_id="pikku_django.E302"),
    "SCHEDULE_CATCHUP_LIMIT": Rule(
        (int,),
        "an int from 1 to 10000",
        minimum=1,
        maximum=10_000,
        check_id="pikku_django.E302",
    ),
    "SCHEDULE_GRACE": Rule(
        (int, float),
        "a number of seconds, 0 or more",
        minimum=0,
        check_id="pikku_django.E302",
    ),
    "MAX_STEPS_PER_RUN": COUNT,
    "PROMETHEUS_METRICS": FLAG,
    "PROMETHEUS_TOKEN": Rule(
        (str, list, tuple),
        "None, a non-empty str or a list of them",
        allows_none=True,
        check_id="pikku_django.E403",
    ),
    "PROMETHEUS_PERMISSION": Rule(
        (str,), "a str: 'app_label.codename'", check_id="pikku_django.E405"
    ),
    "SENTRY": FLAG,
    "SENTRY_EACH_ATTEMPT": FLAG,
    "ADMIN_BASE_URL": Rule(
        (str,), "an http(s) URL as a str, or None", allows_none=True, check_id="pikku_django.E406"
    ),
    "WEBHOOK_DIGEST_RETENTION": Rule(
        (int, float, str, timedelta),
        "seconds, a timedelta or text like '365d', or None",
        allows_none=True,
        check_id="pikku_django.E020",
    ),
    "RETENTION": Rule(
        (int, float, str, timedelta),
        "seconds, a timedelta or text like '30d', or None",
        allows_none=True,
        check_id="pikku_django.E021",
    ),
}


def setting_problem(name: str, value: object) -> str | None:
    """The error for ``PIKKU[name] = value`` when it breaks the key's rule, else None."""
    rule = RULES[name]
    if rule.accepts(value):
        return None
    return f"PIKKU[{name!r}] must be {rule.what}, not {value!r}"


class PikkuSettings:
    """Reads ``settings.PIKKU``, falling back to :data:`DEFAULTS` key by key.

    A value, once read, is kept on the instance until ``PIKKU`` changes (Django's
    ``setting_changed``, as ``override_settings`` sends it).
    """

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"PIKKU has no setting {name!r}")
        user = getattr(settings, "PIKKU", None) or {}
        value = user.get(name, DEFAULTS[name])
        self.__dict__[name] = value
        return value

    def reset(self) -> None:
        """Forget the values read, so the next read sees ``settings.PIKKU`` again."""
        self.__dict__.clear()

    def well_typed(self, *names: str) -> bool:
        """Whether each of ``names`` has a value of the type (and range) its rule says."""
        return all(RULES[name].accepts(getattr(self, name)) for name in names)

    def user_keys(self) -> set[str]:
        """The keys the project set in ``settings.PIKKU``."""
        user = getattr(settings, "PIKKU", None) or {}
        return set(user) if isinstance(user, dict) else set()


pikku_settings = PikkuSettings()


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "PIKKU":
        pikku_settings.reset()
