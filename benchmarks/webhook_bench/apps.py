from django.apps import AppConfig


class WebhookBenchConfig(AppConfig):
    """pikku_django discovers its ``webhooks.py`` and ``workflows.py`` at start-up."""

    name = "webhook_bench"
    label = "pikku_webhook_bench"
    default_auto_field = "django.db.models.BigAutoField"
