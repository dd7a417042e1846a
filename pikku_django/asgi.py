"""The project's ASGI application with webhook bodies bounded as they arrive.

Django's ASGI handler reads a request's whole body (spooled to disk) before any view
runs, so under ASGI ``PIKKU["WEBHOOK_MAX_BODY"]`` alone would apply only once a
300 MB body had been read. Wrapped here, a request to the webhook view is refused
with 413 on its ``Content-Length`` before anything is read, and otherwise as soon as
the bytes received pass the limit, whatever length it declared (or none)::

    # asgi.py
    from pikku_django.asgi import get_asgi_application

    application = get_asgi_application()

or, around an application built otherwise, ``limit_webhook_bodies(application)``.
Under WSGI the view reads at most the limit itself: nothing to wrap.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pikku_django.webhooks.bodies import ASGI_SCOPE_KEY

__all__ = ["SCOPE_KEY", "WebhookBodyLimit", "get_asgi_application", "limit_webhook_bodies"]

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SCOPE_KEY = ASGI_SCOPE_KEY
"""Set in the scope of a request whose body the wrapper bounds (the limit, in bytes)."""

_TOO_LARGE = json.dumps({"error": "request body too large"}).encode()


def _declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` (None when absent or not a number)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _is_webhook(scope: Scope) -> bool:
    """Whether the request's path resolves to pikku_django's webhook view."""
    from django.urls import Resolver404, resolve

    from pikku_django.webhooks.views import webhook

    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    if root and path.startswith(root):
        path = path[len(root) :]
    try:
        return resolve(path or "/").func is webhook
    except Resolver404:
        return False


async def _refuse(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_TOO_LARGE)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _TOO_LARGE})


class WebhookBodyLimit:
    """ASGI middleware: a webhook request's body is refused with 413 past
    ``PIKKU["WEBHOOK_MAX_BODY"]``, on its declared length before reading, else once
    the bytes received pass it; the rest of the body is never read. Other requests
    pass as they came."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or not _is_webhook(scope):
            await self.app(scope, receive, send)
            return
        from pikku_django.webhooks.bodies import _max_body

        limit = _max_body()
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send)
            return
        received = 0
        refused = False

        async def bounded() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # answer now; the app sees the client go
                    refused = True
                    await _refuse(send)
                    return {"type": "http.disconnect"}
            return message

        await self.app({**scope, SCOPE_KEY: limit}, bounded, send)


def limit_webhook_bodies(app: ASGIApp) -> ASGIApp:
    """``app`` with webhook bodies bounded as they arrive (:class:`WebhookBodyLimit`)."""
    return WebhookBodyLimit(app)


def get_asgi_application() -> ASGIApp:
    """Django's ``get_asgi_application()``, with webhook bodies bounded as they arrive."""
    from django.core.asgi import get_asgi_application as django_asgi_application

    return limit_webhook_bodies(django_asgi_application())
