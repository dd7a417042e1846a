"""URLs to include in a project: ``path("pikku/", include("pikku_django.urls"))``."""

from django.urls import re_path

from pikku_django.webhooks.views import webhook

app_name = "pikku_django"

urlpatterns = [
    # Every declared webhook source's route (default "webhooks/<name>/"); the view
    # answers 404 for a route no source declares.
    # Last, so the app's other URLs come first.
    re_path(r"^(?P<route>.+)$", webhook, name="webhook"),
]
