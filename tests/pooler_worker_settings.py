"""tests.worker_settings for a worker that reaches its test database through PgBouncer.

PIKKU_TEST_ALIAS names the pooled alias, PIKKU_TEST_POOLER_PORT the pooler's port and
PIKKU_TEST_POOLER_MODE its pooling mode; the rest is tests.worker_settings'.
"""

import os

from tests import settings as base
from tests.pgbouncer import POSTGRESQL, pooled_pikku, pooled_settings

_alias = os.environ["PIKKU_TEST_ALIAS"]
_mode = os.environ["PIKKU_TEST_POOLER_MODE"]
base.DATABASES[_alias] = pooled_settings(
    base.DATABASES.get("postgres", POSTGRESQL), int(os.environ["PIKKU_TEST_POOLER_PORT"])
)

from tests.worker_settings import *  # noqa: E402, F403
from tests.worker_settings import PIKKU  # noqa: E402

PIKKU = {**PIKKU, **pooled_pikku(_alias, _mode)}
