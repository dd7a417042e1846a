"""The ``PIKKU`` settings dict, with its documented defaults."""

from __future__ import annotations

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
    # PostgreSQL: prepare pikku_django's own hot-path statements (steps, webhook
    # events) on Django's connection (off behind PgBouncer before 1.21 in
    # transaction mode).
    "PREPARED_STATEMENTS": True,
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
    # Seconds between pikku_worker's progress lines (claimed, finished, failed,
    # retried, recovered).
    "WORKER_PROGRESS_INTERVAL": 60.0,
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
    # transaction mode).
    "WEBHOOK_STATE_CACHE": True,
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

    def user_keys(self) -> set[str]:
        """The keys the project set in ``settings.PIKKU``."""
        user = getattr(settings, "PIKKU", None) or {}
        return set(user) if isinstance(user, dict) else set()


pikku_settings = PikkuSettings()


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "PIKKU":
        pikku_settings.reset()
