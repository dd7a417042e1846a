"""pikku_django's views: run status (JSON and a live stream) and the webhook endpoint."""

from pikku_django.views.runs import run_status, run_stream, run_url_fallback
from pikku_django.webhooks.views import webhook

__all__ = ["run_status", "run_stream", "run_url_fallback", "webhook"]
