"""What the webhook endpoint answers for a route no source declares.

A route that differs from a source's only by its trailing slash is named: a GET or
HEAD is redirected to the source's URL (as Django's ``APPEND_SLASH`` would), any
other method is answered 404 with the right URL, as a redirect would lose its body.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.utils.encoding import escape_uri_path, iri_to_uri

from pikku_django.webhooks.sources import WebhookSource, source_for_route

logger = logging.getLogger(__name__)

#: The methods answered with a redirect to the source's URL.
REDIRECTED = ("GET", "HEAD")


def near_source(route: str) -> WebhookSource | None:
    """The source whose route is ``route`` with a trailing slash added or taken off."""
    if route.endswith("/"):
        return source_for_route(route.rstrip("/")) if route.rstrip("/") else None
    return source_for_route(f"{route}/")


def source_url(request: HttpRequest, route: str, source: WebhookSource) -> str:
    """The path (and query) of ``request`` with ``route`` replaced by the source's route."""
    prefix = request.path.removesuffix(route)
    query = request.META.get("QUERY_STRING", "")
    return escape_uri_path(prefix + (source.route or "")) + (
        f"?{iri_to_uri(query)}" if query else ""
    )


def unmatched(request: HttpRequest, route: str) -> HttpResponse:
    """The answer for ``route``, which no source declares."""
    source = near_source(route)
    if source is None:
        return JsonResponse({"error": "no such webhook source"}, status=404)
    url = source_url(request, route, source)
    if request.method in REDIRECTED:
        return HttpResponsePermanentRedirect(url)
    absolute = request.build_absolute_uri(url)
    need = "must not end with a slash" if route.endswith("/") else "needs its trailing slash"
    logger.warning(
        "Webhook %s: a %s came to %s, which %s; answered 404. Give the sender %s",
        source.name,
        request.method,
        request.path,
        need,
        absolute,
    )
    response = JsonResponse(
        {"error": f"this URL {need}: send to {absolute}"},
        status=404,
    )
    # The warning above is the one line logged for it (not django.request's too).
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response
