"""ROOT_URLCONF of ``benchmarks/webhooks.py``: every side behind one URL resolver."""

from django.urls import include, path

from webhook_bench.views import defer, notify, raw

urlpatterns = [
    path("bench/raw/", raw, name="bench-raw"),
    path("bench/notify/", notify, name="bench-notify"),
    path("bench/defer/", defer, name="bench-defer"),
    path("pikku/", include("pikku_django.urls")),
]
