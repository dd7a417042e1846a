"""URLs to include in a project: ``path("pikku/", include("pikku_django.urls"))``."""

from django.urls import path, re_path

from pikku_django.integrations.metrics_view import metrics
from pikku_django.views import run_status, run_stream, run_url_fallback, webhook

app_name = "pikku_django"

urlpatterns = [
    path("runs/<uuid:run_id>/status", run_status, name="run-status"),
    path("runs/<uuid:run_id>/stream", run_stream, name="run-stream"),
    # A run URL the two above do not match: "not a run id", or the run's own URL.
    re_path(r"^runs/(?P<value>[^/]+)/(?P<view>status|stream)/?$", run_url_fallback),
    # Prometheus metrics (PIKKU["PROMETHEUS_METRICS"]; 404 while it is off).
    path("metrics", metrics, name="metrics"),
    # Every declared webhook source's route (default "webhooks/<name>/"); the view
    # answers 404 for a route no source declares.
    # Last, so the app's other URLs come first.
    re_path(r"^(?P<route>.+)$", webhook, name="webhook"),
]
