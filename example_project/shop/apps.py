"""The shop AppConfig."""

from django.apps import AppConfig


class ShopConfig(AppConfig):
    """A stand-in for your own app; ``python manage.py lease_demo`` lives here."""

    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"
