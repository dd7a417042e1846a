"""tests.worker_settings with the Prometheus metrics on (tests/test_integrations_prometheus.py);
the worker process shares its counts through PROMETHEUS_MULTIPROC_DIR, set by the test."""

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import PIKKU

PIKKU = {**PIKKU, "PROMETHEUS_METRICS": True}
