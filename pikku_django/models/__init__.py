"""pikku_django's models, one module per concern."""

from pikku_django.models.leases import Lease

__all__ = ["Lease"]
