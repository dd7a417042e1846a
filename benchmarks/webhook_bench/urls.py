"""ROOT_URLCONF of ``benchmarks/webhooks.py``: both views behind one URL resolver."""

from django.urls import include, path

from webhook_bench.views import bare

urlpatterns = [
    path("bench/bare/", bare, name="bench-bare"),
    path("pikku/", include("pikku_django.urls")),
]
