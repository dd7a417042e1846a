"""What pikku_django's URLs answer for a near miss: a webhook URL without its trailing
slash (or with one its route lacks), and a run status or stream URL whose id is not one."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.test import Client

from pikku_django.webhooks import WebhookSource, register_source
from pikku_django.webhooks.sources import unregister_source
from tests import webhook_defs

RUN_ID = "3f2b8c4e-1d2a-4b5c-9e8f-0a1b2c3d4e5f"


@pytest.fixture
def slashless() -> Iterator[WebhookSource]:
    """A source whose own route ends without a slash."""
    source = register_source(
        WebhookSource(name="wh-slashless", route="hooks/slashless", receive=lambda r, c: None)
    )
    yield source
    unregister_source(source.name)


@pytest.mark.parametrize("method", ["get", "head"])
def test_a_get_without_the_trailing_slash_is_redirected_to_the_source(
    client: Client, method: str
) -> None:
    assert webhook_defs.github.route == "webhooks/wh-github/"
    response = getattr(client, method)("/pikku/webhooks/wh-github?challenge=a%20b")
    assert response.status_code == 301
    assert response["Location"] == "/pikku/webhooks/wh-github/?challenge=a%20b"


def test_a_post_without_the_trailing_slash_is_told_the_url_and_logged_once(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    response = client.post("/pikku/webhooks/wh-github", b"{}", content_type="application/json")
    assert response.status_code == 404
    assert response.json() == {
        "error": "this URL needs its trailing slash: send to http://testserver/pikku/webhooks/wh-github/"
    }
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].name == "pikku_django.webhooks.routes"
    assert "http://testserver/pikku/webhooks/wh-github/" in warnings[0].getMessage()


def test_a_trailing_slash_a_route_lacks_is_named_too(
    client: Client, slashless: WebhookSource
) -> None:
    assert client.get("/pikku/hooks/slashless/").headers["Location"] == "/pikku/hooks/slashless"
    response = client.post("/pikku/hooks/slashless/", b"{}", content_type="application/json")
    assert response.status_code == 404
    assert response.json()["error"] == (
        "this URL must not end with a slash: send to http://testserver/pikku/hooks/slashless"
    )
    # A route near no source is answered as before.
    for url in ("/pikku/webhooks/nope/", "/pikku/webhooks/nope", "/pikku/x//"):
        for unknown in (client.get(url), client.post(url, b"{}", content_type="text/plain")):
            assert unknown.status_code == 404
            assert unknown.json() == {"error": "no such webhook source"}


@pytest.mark.parametrize("view", ["status", "stream"])
@pytest.mark.parametrize("value", ["not-a-uuid", "12345", "3f2b8c4e-1d2a-4b5c-9e8f"])
def test_a_malformed_run_id_is_not_a_run_id(client: Client, view: str, value: str) -> None:
    for url in (f"/pikku/runs/{value}/{view}", f"/pikku/runs/{value}/{view}/"):
        response = client.get(url)
        assert response.status_code == 404
        error = response.json()["error"]
        assert error.startswith(f"'{value}' is not a run id"), error
        assert "webhook" not in error


@pytest.mark.parametrize("view", ["status", "stream"])
@pytest.mark.parametrize(
    "value", [f"{RUN_ID}/", RUN_ID.upper(), RUN_ID.replace("-", ""), f"{{{RUN_ID}}}"]
)
def test_a_run_id_written_another_way_is_redirected_to_the_run_url(
    client: Client, view: str, value: str
) -> None:
    slash = "/" if value.endswith("/") else ""
    url = f"/pikku/runs/{value.rstrip('/')}/{view}{slash}"
    response = client.get(url)
    assert response.status_code == 301
    assert response["Location"] == f"/pikku/runs/{RUN_ID}/{view}"
    posted = client.post(url)
    assert posted.status_code == 404
    assert f"http://testserver/pikku/runs/{RUN_ID}/{view}" in posted.json()["error"]
