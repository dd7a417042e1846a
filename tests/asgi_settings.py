"""tests.worker_settings for an ASGI server a test starts: anyone may follow a run."""

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import PIKKU

PIKKU = {**PIKKU, "RUN_VIEW_PERMISSION": "tests.asgi.anyone"}
ALLOWED_HOSTS = ["*"]
