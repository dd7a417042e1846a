"""The pikku_django AppConfig."""

from django.apps import AppConfig


class PikkuConfig(AppConfig):
    """Registers pikku_django's models, admin, system checks and settings."""

    name = "pikku_django"
    verbose_name = "Pikku"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pikku_django import checks, conf  # noqa: F401  (registers checks and signals)
        from pikku_django.workflows.registry import autodiscover

        autodiscover()
