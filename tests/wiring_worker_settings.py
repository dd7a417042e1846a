"""tests.worker_settings plus schedules read from PIKKU_TEST_SCHEDULES (JSON)."""

import json
import os

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import PIKKU

PIKKU = {**PIKKU, "SCHEDULES": json.loads(os.environ.get("PIKKU_TEST_SCHEDULES", "{}"))}

if os.environ.get("PIKKU_TEST_DEFAULT_LOGGING"):  # as a new project: no LOGGING of its own
    LOGGING = {"version": 1, "disable_existing_loggers": False}
