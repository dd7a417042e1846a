"""System checks of the declared webhook sources' needs."""

from __future__ import annotations

from typing import Any

from django.core import checks

#: The pip line that installs the provider client.
PROVIDERS_PIP = 'pip install "pikku-django[providers]"'


@checks.register(checks.Tags.compatibility)
def check_provider_client(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A source that registers itself with its provider (GitHub, Stripe) needs httpx."""
    from pikku_django.webhooks.providers import ProviderRegistration, httpx_installed
    from pikku_django.webhooks.sources import sources

    registering = [
        s.name
        for s in sources()
        if isinstance(getattr(s.verify, "registration", None), ProviderRegistration)
    ]
    if not registering or httpx_installed():
        return []
    names = ", ".join(repr(name) for name in registering)
    return [
        checks.Error(
            f"httpx is not installed, and webhook sources that register themselves with "
            f"their provider (GitHub, Stripe) need it: enabling, checking or disabling "
            f"{names} fails.",
            hint=f"{PROVIDERS_PIP}, or declare the source without registration "
            "(no repository=/secret_key_credential=).",
            id="pikku_django.E407",
        )
    ]
