"""The test project as an ASGI application, for a server a test starts
(``DJANGO_SETTINGS_MODULE=tests.asgi_settings``), built as the docs say: webhook
bodies bounded as they arrive."""

from __future__ import annotations

from typing import Any

from pikku_django.asgi import get_asgi_application


def anyone(request: Any, run: Any) -> bool:
    """Every request may see every run (the served tests' RUN_VIEW_PERMISSION)."""
    return True


application = get_asgi_application()
