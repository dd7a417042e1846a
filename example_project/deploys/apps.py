"""The deploys app: a GitHub push starts a deploy workflow."""

from django.apps import AppConfig


class DeploysConfig(AppConfig):
    """Webhook source, workflows and the ``story`` command of the example project."""

    name = "deploys"
    default_auto_field = "django.db.models.BigAutoField"
