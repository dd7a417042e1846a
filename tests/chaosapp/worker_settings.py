"""tests.worker_settings with the short leases and timeouts of the chaos test.

A pass cut short by SIGKILL is retried after RUN_PASS_TIMEOUT once its run lease
has lapsed, and a run left with nothing in flight is woken by the recovery sweep:
the defaults (300 s, 30 s, 30 s, 300 s) would outlast the test.
"""

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import PIKKU

PIKKU = {
    **PIKKU,
    "RUN_LEASE_MS": PIKKU["STEP_LEASE_MS"],
    "RUN_PASS_TIMEOUT": 4,
    "RECOVERY_INTERVAL": 1.0,
    "STALLED_RUN_AFTER": 3.0,
}
# Warnings only: the workers write into pipes that the test reads once they exit.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pikku_django": {"handlers": ["console"], "level": "WARNING"}},
}
