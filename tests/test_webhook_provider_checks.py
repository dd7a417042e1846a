"""The system check for sources that register themselves with their provider when
httpx, the ``providers`` extra, cannot be imported."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from django.core import checks

from pikku_django.webhooks import WebhookEvent, WebhookSource, register_source
from pikku_django.webhooks.checks import check_provider_client
from pikku_django.webhooks.presets import GitHub, Stripe
from pikku_django.webhooks.sources import unregister_source


def receive(request, ctx):  # type: ignore[no-untyped-def]
    return [WebhookEvent("push", data=ctx.json())]


@pytest.fixture
def sources() -> Iterator[None]:
    declared = [
        WebhookSource(
            name="chk-gh",
            verify=GitHub(repository="acme/shop", token_credential="githubToken"),
            receive=receive,
        ),
        WebhookSource(name="chk-plain", verify=GitHub(), receive=receive),
    ]
    for source in declared:
        register_source(source)
    try:
        yield
    finally:
        for source in declared:
            unregister_source(source.name)


def errors() -> list[checks.CheckMessage]:
    assert check_provider_client in checks.registry.registry.get_checks()  # run by `check`
    return [m for m in check_provider_client() if m.id == "pikku_django.E407"]


def test_a_registering_source_without_httpx_is_an_error(
    sources: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert errors() == []  # httpx is installed here
    monkeypatch.setitem(sys.modules, "httpx", None)  # `import httpx` now fails
    found = errors()
    assert len(found) == 1
    error = found[0]
    assert error.level == checks.ERROR
    assert "httpx is not installed" in error.msg
    assert "'chk-gh'" in error.msg
    assert "chk-plain" not in error.msg  # verifies only: needs no client
    assert error.hint is not None
    assert error.hint.startswith('pip install "pikku-django[providers]"')


def test_stripe_counts_and_sources_without_registration_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    plain = WebhookSource(name="chk-only", verify=GitHub(), receive=receive)
    register_source(plain)
    try:
        assert check_provider_client() == []
        stripe = WebhookSource(
            name="chk-stripe",
            verify=Stripe(secret_key_credential="stripeSecretKey"),
            receive=receive,
        )
        register_source(stripe)
        try:
            [error] = check_provider_client()
            assert "'chk-stripe'" in error.msg
        finally:
            unregister_source("chk-stripe")
    finally:
        unregister_source("chk-only")
