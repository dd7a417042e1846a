"""URLs of the example project: the admin, where the lease list lives."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("pikku/", include("pikku_django.urls")),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
