from django.apps import AppConfig
from django.conf import settings


class TestAppConfig(AppConfig):
    """Workflows that worker processes started by the tests discover."""

    name = "tests.testapp"
    label = "pikku_testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A worker process that kills itself after a step's settle (tests/worker_settings.py).
        marker = getattr(settings, "PIKKU_TEST_KILL_AFTER_SETTLE", "")
        if marker:
            from tests.testapp.kills import kill_after_settle

            kill_after_settle(marker)
        # A worker process that kills itself holding a batch it claimed (tests/worker_settings.py).
        marker = getattr(settings, "PIKKU_TEST_KILL_AFTER_BATCH", "")
        if marker:
            from tests.testapp.kills import kill_after_batch

            kill_after_batch(marker)
