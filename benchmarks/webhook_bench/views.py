"""The baseline: a bare Django view that stores the body with one INSERT."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from webhook_bench.models import RawDelivery


@csrf_exempt
def bare(request: HttpRequest) -> HttpResponse:
    """No verification, no parsing: the body and the delivery id, stored as they came."""
    RawDelivery.objects.create(
        delivery=request.headers.get("X-GitHub-Delivery", ""), body=request.body
    )
    return JsonResponse({"received": 1})
