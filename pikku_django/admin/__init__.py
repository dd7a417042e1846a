"""Admin screens, one module per concern."""

from pikku_django.admin import (  # noqa: F401  (each module registers its admins)
    heartbeats,
    leases,
    schedules,
    webhooks,
    workflows,
)
