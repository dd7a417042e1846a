"""tests.settings for a worker process a test starts, pointed at that test's database.

PIKKU_TEST_ALIAS names the DATABASES alias and PIKKU_TEST_DB_NAME its test
database; workflows and leases both live there.
"""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

_alias = os.environ["PIKKU_TEST_ALIAS"]
DATABASES[_alias]["NAME"] = os.environ["PIKKU_TEST_DB_NAME"]
if _alias != "default":
    DATABASES["default"]["NAME"] = os.environ["PIKKU_TEST_DEFAULT_NAME"]
PIKKU = {
    "WORKFLOW_DATABASE": _alias,
    "LEASE_DATABASE": _alias,
    "STEP_LEASE_MS": int(os.environ.get("PIKKU_TEST_STEP_LEASE_MS", "60000")),
    "RUN_LEASE_MS": int(os.environ.get("PIKKU_TEST_RUN_LEASE_MS", "30000")),
    "WORKER_POLL_INTERVAL": float(os.environ.get("PIKKU_TEST_POLL", "0.2")),
    # Declared queues, as JSON (tests/test_queues_workers.py).
    "QUEUES": json.loads(os.environ.get("PIKKU_TEST_QUEUES", "{}")),
    # Declared schedules, as JSON (tests/test_schedules_workers.py).
    "SCHEDULES": json.loads(os.environ.get("PIKKU_TEST_SCHEDULES", "{}")),
    # A worker that passes only the workflow versions it carries (tests/test_deploy.py).
    "WORKFLOW_CARRIED_VERSIONS_ONLY": os.environ.get("PIKKU_TEST_CARRIED_ONLY") == "1",
}
# A marker file's path: the worker SIGKILLs itself after a step's settle, before the
# pass it owes the run (tests/testapp/kills.py, tests/test_crash_recovery_bounds.py).
PIKKU_TEST_KILL_AFTER_SETTLE = os.environ.get("PIKKU_TEST_KILL_AFTER_SETTLE", "")
# A marker file's path: the worker SIGKILLs itself once a claim took two units or more,
# before it starts any (tests/testapp/kills.py, tests/test_crash_recovery_batch.py).
PIKKU_TEST_KILL_AFTER_BATCH = os.environ.get("PIKKU_TEST_KILL_AFTER_BATCH", "")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pikku_django": {"handlers": ["console"], "level": "INFO"}},
}
