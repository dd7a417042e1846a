"""pikku_django's views: the webhook endpoint (see :mod:`pikku_django.webhooks.views`)."""

from pikku_django.webhooks.views import webhook

__all__ = ["webhook"]
