"""Every ``PIKKU`` key's value is checked for its type (and range) by the system checks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from pikku_django.conf import DEFAULTS, RULES

#: A value of the wrong type (or out of range) for every key, and one of the right type
#: that is not the default.
CASES: dict[str, tuple[Any, Any]] = {
    "LEASE_BACKEND": (["database"], "memory"),
    "LEASE_DATABASE": (0, "default"),
    "LEASE_PREPARED_STATEMENTS": ("no", False),
    "LEASE_CACHE": (["leases"], None),
    "LEASE_KEY_PREFIX": (b"pikku:", "app:lease:"),
    "LEASE_TTL_MS": ("30s", 5_000),
    "WORKFLOW_DATABASE": (["default"], "default"),
    "READ_DATABASE": (["replica"], "default"),
    "PREPARED_STATEMENTS": (0, False),
    "DATABASE_POOLING": ("transaction", {"default": "session"}),
    "STEP_RETRIES": ("five", 0),
    "STEP_RETRY_DELAY": ([1], timedelta(seconds=2)),
    "STEP_BACKOFF": (2, "exponential"),
    "STEP_LEASE_MS": (60.5, 120_000),
    "QUEUES": (["reports"], {"reports": {"concurrency": 2}}),
    "QUEUE_LEASE_MS": ("reports=5000", {}),
    "RUN_LEASE_MS": (True, 10_000),
    "RUN_PASS_TIMEOUT": ("5min", 60.5),
    "WORKER_CONCURRENCY": ("four", 8),
    "WORKER_PROCESSES": (0, 1),
    "WORKER_POLL_INTERVAL": ("1s", 2),
    "WORKER_NOTIFY": ("yes", False),
    "WORKER_NOTIFIED_POLL_INTERVAL": (None, 5),
    "WORKER_POOLED_POLL_INTERVAL": (0, 0.5),
    "LISTEN_DATABASES": (["direct"], {"default": "default"}),
    "WORKER_PROGRESS_INTERVAL": ("1m", 30),
    "WORKER_CLAIM_BATCH": (0, 1),
    "RECOVERY_INTERVAL": (-1, 10),
    "STALLED_RUN_AFTER": (float("nan"), 600),
    "PASS_ERROR_TRIES": (2.5, 5),
    "CARRY_RUNS": (1, False),
    "FIRST_STEP_AT_START": ("off", False),
    "ASYNC_CONCURRENCY": ("many", 10),
    "WORKFLOW_CARRIED_VERSIONS_ONLY": (None, True),
    "CREDENTIAL_KEYS": (42, ["a-fernet-key"]),
    "CREDENTIALS": (["githubWebhookSecret"], {"githubWebhookSecret": ["a", "b"]}),
    "RUN_VIEW_PERMISSION": (True, "tests.test_run_stream.allow_everyone"),
    "STREAM_POLL_INTERVAL": ("fast", 0.5),
    "STREAM_HEARTBEAT": (0, 30),
    "STREAM_MAX_SECONDS": (float("inf"), 60),
    "WEBHOOK_MAX_BODY": ("1MB", 2_097_152),
    "WEBHOOK_STATE_CACHE": ("true", False),
    "SCHEDULES": (["nightly"], {}),
    "SCHEDULE_TIMEZONE": (3, "Europe/Helsinki"),
    "SCHEDULE_MISSED": (None, "all"),
    "SCHEDULE_CATCHUP_LIMIT": (10_001, 10),
    "SCHEDULE_GRACE": ("1m", 0),
    "WEBHOOK_DIGEST_RETENTION": ([365], "30d"),
    "RETENTION": ([30], "30d"),
    "MAX_STEPS_PER_RUN": (0, 5_000),
    "PROMETHEUS_METRICS": ("on", True),
    "PROMETHEUS_TOKEN": (42, ["a-token", "the-next-token"]),
    "PROMETHEUS_PERMISSION": (["pikku_django.view_workflowrun"], "auth.view_user"),
    "SENTRY": (1, True),
    "SENTRY_EACH_ATTEMPT": ("yes", True),
    "ADMIN_BASE_URL": (8000, "https://ops.example.com"),
}


def errors_about(key: str, pikku: dict[str, Any]) -> list[checks.CheckMessage]:
    """The errors every system check (none connecting to a database) reports on ``key``."""
    with override_settings(PIKKU=pikku):
        found = checks.run_checks()
    return [m for m in found if m.level >= checks.ERROR and f"PIKKU[{key!r}]" in m.msg]


def test_every_key_has_a_rule_and_a_case() -> None:
    assert set(RULES) == set(DEFAULTS) == set(CASES)


def test_every_default_and_every_right_value_passes() -> None:
    for key, (_, right) in CASES.items():
        assert RULES[key].accepts(DEFAULTS[key]), key
        assert RULES[key].accepts(right), key
    with override_settings(PIKKU=dict(DEFAULTS)):
        found = checks.run_checks()
    assert [m for m in found if m.level >= checks.ERROR] == []
    right_values = {key: right for key, (_, right) in CASES.items()}
    right_values["LEASE_BACKEND"] = "database"  # the others are checked one at a time below
    assert errors_about("LEASE_BACKEND", right_values) == []


@pytest.mark.parametrize("key", sorted(CASES))
def test_a_wrong_type_is_an_error_naming_the_key_its_type_and_the_value(key: str) -> None:
    wrong, right = CASES[key]
    found = errors_about(key, {key: wrong})
    assert len(found) == 1, [m.msg for m in found]
    assert found[0].msg == f"PIKKU[{key!r}] must be {RULES[key].what}, not {wrong!r}."
    assert found[0].id == RULES[key].check_id
    assert errors_about(key, {key: right}) == []


def test_the_worker_stops_at_its_checks_before_a_wrong_type_reaches_it() -> None:
    with (
        override_settings(PIKKU={"WORKER_CONCURRENCY": "four"}),
        pytest.raises(SystemCheckError, match=r"PIKKU\['WORKER_CONCURRENCY'\] must be an int"),
    ):
        call_command("pikku_worker", "--until-idle", skip_checks=False)


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(sorted(DEFAULTS)), value=VALUES)
def test_any_value_is_reported_by_its_rule_and_no_check_fails_on_it(key: str, value: Any) -> None:
    with override_settings(PIKKU={key: value}):
        found = checks.run_checks()  # no check raises, whatever the value
    typed = [m for m in found if m.msg.startswith(f"PIKKU[{key!r}] must be {RULES[key].what},")]
    assert len(typed) == (0 if RULES[key].accepts(value) else 1), [m.msg for m in found]


@pytest.mark.django_db
def test_the_checks_with_database_read_no_wrongly_typed_value() -> None:
    for key, (wrong, _) in CASES.items():
        with override_settings(PIKKU={key: wrong}):
            found = checks.run_checks(databases=["default"])  # none raises
        assert [m.id for m in found if m.level >= checks.ERROR] == [RULES[key].check_id], key
