"""Admin screens, one module per concern."""

from pikku_django.admin import leases  # noqa: F401  (registers LeaseAdmin)
