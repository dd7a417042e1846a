"""factory-boy factories for pikku_django's models."""

from __future__ import annotations

import time

import factory

from pikku_django.models import Lease


class LeaseFactory(factory.django.DjangoModelFactory):
    """A live lease an hour from expiry; pass ``expires_at=0`` for a released one."""

    class Meta:
        model = Lease

    key = factory.Sequence(lambda n: f"lease-{n}")
    holder = factory.Faker("uuid4")
    token = factory.Sequence(lambda n: n + 1)
    expires_at = factory.LazyFunction(lambda: int(time.time() * 1000) + 3_600_000)
