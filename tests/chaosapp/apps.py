from django.apps import AppConfig


class ChaosAppConfig(AppConfig):
    """The chaos test's workflows and the rows its steps leave behind."""

    name = "tests.chaosapp"
    label = "pikku_chaosapp"
    default_auto_field = "django.db.models.BigAutoField"
