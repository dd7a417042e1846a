"""The ``metrics`` view of ``pikku_django.urls``: the Prometheus metrics, for a scraper
with the bearer token of ``PIKKU["PROMETHEUS_TOKEN"]`` or a logged-in staff user with
``PIKKU["PROMETHEUS_PERMISSION"]``; 404 while ``PROMETHEUS_METRICS`` is off."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

#: What Prometheus's text format is served as (prometheus_client.CONTENT_TYPE_LATEST).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def configured_tokens(value: object) -> list[str]:
    """The bearer tokens ``PROMETHEUS_TOKEN`` allows (one, or a list during a rotation)."""
    values: Iterable[object]
    if isinstance(value, str):
        values = [value]
    elif isinstance(value, list | tuple):
        values = value
    else:
        return []
    return [token for token in values if isinstance(token, str) and token]


def bearer_token(request: HttpRequest) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if the request has one."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_matches(given: str, tokens: list[str]) -> bool:
    """Whether ``given`` is one of ``tokens``, compared in constant time (each is tried)."""
    found = False
    for token in tokens:
        found |= hmac.compare_digest(given.encode(), token.encode())
    return found


def _refused(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="pikku metrics"'
    return response


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus's text format, for a scraper with the token or a staff user allowed."""
    from pikku_django.conf import pikku_settings

    if not pikku_settings.PROMETHEUS_METRICS:
        raise Http404("PIKKU['PROMETHEUS_METRICS'] is off")
    given = bearer_token(request)
    if given is not None:
        if not token_matches(given, configured_tokens(pikku_settings.PROMETHEUS_TOKEN)):
            return _refused(401, "the bearer token is not one PIKKU['PROMETHEUS_TOKEN'] names")
    else:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return _refused(401, "a bearer token or a staff login is needed")
        if not (
            user.is_active
            and user.is_staff
            and user.has_perm(str(pikku_settings.PROMETHEUS_PERMISSION))
        ):
            return _refused(403, "this user may not read the metrics")
    try:
        from pikku_django.integrations.prometheus import scrape
    except ImportError as exc:  # system check E401 says so too
        return _refused(503, str(exc))
    body = scrape(str(pikku_settings.WORKFLOW_DATABASE))
    return HttpResponse(body, content_type=CONTENT_TYPE)
