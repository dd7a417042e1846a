from django.apps import AppConfig


class TestAppConfig(AppConfig):
    """Workflows that worker processes started by the tests discover."""

    name = "tests.testapp"
    label = "pikku_testapp"
    default_auto_field = "django.db.models.BigAutoField"
