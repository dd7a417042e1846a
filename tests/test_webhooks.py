"""The webhook view, through Django's test client."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pikku_django.models import TriggerSource, WebhookDigest, WebhookReceipt, WorkflowRun
from pikku_django.webhooks import credential_name, set_credential
from pikku_django.webhooks.lifecycle import sync
from pikku_django.workflows import get_engine
from tests import webhook_defs

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "It's a Secret to Everybody"
URL = "/pikku/webhooks/wh-github/"


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def post(
    client: Client, body: bytes, *, event: str = "push", delivery: str = "d-1", **headers: str
) -> Any:
    meta = {
        "HTTP_X_GITHUB_EVENT": event,
        "HTTP_X_GITHUB_DELIVERY": delivery,
        "HTTP_X_HUB_SIGNATURE_256": headers.pop("signature", sign(body)),
    }
    meta.update({f"HTTP_{k.upper()}": v for k, v in headers.items()})
    return client.post(URL, body, content_type="application/json", **meta)


@pytest.fixture
def enabled() -> None:
    sync()
    TriggerSource.objects.filter(name__in=["wh-github", "wh-sneaky"]).update(enabled=True)
    set_credential(credential_name("wh-github"), SECRET)
    set_credential(credential_name("wh-sneaky"), SECRET)


def test_credential_names_are_camel_case() -> None:
    assert credential_name("microsoft-outlook") == "microsoftOutlookWebhookSecret"
    assert credential_name("github") == "githubWebhookSecret"
    assert webhook_defs.github.credential == "whGithubWebhookSecret"


def test_declared_but_disabled_source_is_404_without_receive(client: Client) -> None:
    sync()
    assert TriggerSource.objects.get(name="wh-github").enabled is False
    body = json.dumps({"ref": "main"}).encode()
    assert post(client, body).status_code == 404
    assert client.head(URL).status_code == 404
    assert not WebhookReceipt.objects.exists()


def test_unknown_source_is_404(client: Client) -> None:
    assert (
        client.post("/pikku/webhooks/nope/", b"{}", content_type="application/json").status_code
        == 404
    )


def test_signed_push_starts_one_run_and_a_redelivery_is_not_dispatched_twice(
    client: Client, enabled: None
) -> None:
    body = json.dumps({"ref": "main"}).encode()
    first = post(client, body, delivery="abc")
    assert first.status_code == 200, first.content
    assert first.json() == {"received": 1}
    again = post(client, body, delivery="abc")
    assert again.status_code == 200
    assert again.json() == {"received": 0}
    receipt = WebhookReceipt.objects.get()
    assert (receipt.source, receipt.event, receipt.provider_id) == ("wh-github", "push", "abc")
    assert receipt.waiting  # its run starts on a worker
    get_engine().run_until_idle()
    assert WorkflowRun.objects.filter(workflow="wh.deploy").count() == 1
    receipt.refresh_from_db()
    assert receipt.run.output == {"deployed": "main", "delivery": "abc"}
    assert post(client, body, delivery="abc").json() == {"received": 0}
    get_engine().run_until_idle()
    assert WorkflowRun.objects.filter(workflow="wh.deploy").count() == 1


def test_function_handler_runs_on_the_worker_not_in_the_request(
    client: Client, enabled: None
) -> None:
    webhook_defs.handled.clear()
    body = json.dumps({"number": 7}).encode()
    assert post(client, body, event="issues", delivery="i-7").json() == {"received": 1}
    assert webhook_defs.handled == []
    get_engine().run_until_idle()
    assert [e["data"]["number"] for e in webhook_defs.handled] == [7]
    run = WebhookReceipt.objects.get().run
    run.refresh_from_db()
    assert run.status == "completed"


def test_events_nobody_listens_to_or_failing_their_schema_are_dropped(
    client: Client, enabled: None
) -> None:
    assert post(client, b'{"x": 1}', event="unbound").json() == {"received": 0}
    assert post(client, b'{"no_ref": 1}', event="push", delivery="s").json() == {"received": 0}
    assert post(client, b'{"x": 1}', event="undeclared").json() == {"received": 0}
    assert not WebhookReceipt.objects.exists()


@pytest.mark.parametrize(
    ("signature", "status"),
    [
        ("sha256=" + "0" * 64, 401),
        (sign(b"something else"), 401),
        ("sha1=abc", 400),
        ("sha256=zz-not-hex", 400),
        ("", 401),
    ],
)
def test_bad_signatures_are_refused(
    client: Client, enabled: None, signature: str, status: int
) -> None:
    response = post(client, b'{"ref": "main"}', signature=signature)
    assert response.status_code == status, response.content
    assert not WebhookReceipt.objects.exists()


def test_wrong_secret_is_401_and_a_rotated_secret_matches(client: Client, enabled: None) -> None:
    body = b'{"ref": "main"}'
    assert post(client, body, signature=sign(body, "old")).status_code == 401
    set_credential(credential_name("wh-github"), "old")
    assert post(client, body, signature=sign(body, "old")).status_code == 200
    assert post(client, body, signature=sign(body), delivery="d-2").status_code == 200


def test_unset_secret_is_401(client: Client) -> None:
    sync()
    TriggerSource.objects.filter(name="wh-github").update(enabled=True)
    body = b'{"ref": "main"}'
    response = post(client, body)
    assert response.status_code == 401
    assert "not set" in response.json()["error"]


def test_secret_from_settings(client: Client, settings: Any) -> None:
    sync()
    TriggerSource.objects.filter(name="wh-github").update(enabled=True)
    settings.PIKKU = {"CREDENTIALS": {"whGithubWebhookSecret": ["other", SECRET]}}
    assert post(client, b'{"ref": "main"}').status_code == 200


def test_head_answers_200(client: Client, enabled: None) -> None:
    assert client.head(URL).status_code == 200


def test_body_over_the_cap_is_413(client: Client, enabled: None, settings: Any) -> None:
    settings.PIKKU = {"WEBHOOK_MAX_BODY": 100}
    body = json.dumps({"ref": "x" * 200}).encode()
    assert post(client, body).status_code == 413


def test_request_without_body_reaches_receive_but_may_only_answer(
    client: Client, enabled: None
) -> None:
    response = client.post(URL, b"", content_type="application/json")
    assert response.status_code == 200
    assert response.json() == {"hello": "handshake"}
    sneaky = client.post("/pikku/webhooks/wh-sneaky/", b"", content_type="application/json")
    assert sneaky.status_code == 401
    assert not WebhookReceipt.objects.exists()


def test_signed_ping_gets_the_handshake_answer(client: Client, enabled: None) -> None:
    response = post(client, b'{"zen": "hi"}', event="ping")
    assert response.status_code == 200
    assert response.json() == {"pong": True}


def test_bad_json_body_is_400(client: Client, enabled: None) -> None:
    assert post(client, b"{not json").status_code == 400


def test_csrf_is_not_required(enabled: None) -> None:
    client = Client(enforce_csrf_checks=True)
    assert post(client, b'{"ref": "main"}').status_code == 200


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    headers=st.dictionaries(
        st.sampled_from(
            ["X_HUB_SIGNATURE_256", "X_GITHUB_EVENT", "X_GITHUB_DELIVERY", "CONTENT_TYPE"]
        ),
        st.text(max_size=80),
        max_size=4,
    ),
    body=st.binary(max_size=200),
)
def test_no_header_and_body_gives_a_500_or_dispatches_unsigned(
    enabled: None, headers: dict[str, str], body: bytes
) -> None:
    client = Client(raise_request_exception=False)
    meta = {f"HTTP_{k}": v for k, v in headers.items() if "\n" not in v and "\r" not in v}
    response = client.post(URL, body, content_type="application/octet-stream", **meta)
    assert response.status_code < 500
    if body:
        assert not WebhookReceipt.objects.exists()


# -- events whose data is the body (ctx.body_event) ----------------------------------------


@pytest.fixture
def body_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """wh-github's receive makes its event with ctx.body_event."""

    def receive(request: Any, ctx: Any) -> Any:
        return [ctx.body_event(request.headers.get("X-GitHub-Event", ""), id=ctx.delivery_id)]

    monkeypatch.setattr(webhook_defs.github, "receive", receive)


@pytest.mark.parametrize("event", ["issues", "push"])  # push has a schema, issues none
def test_a_body_event_is_stored_as_it_came(
    client: Client, enabled: None, body_events: None, event: str
) -> None:
    body = b'{"ref": "main",  "number": 7}'
    assert post(client, body, event=event, delivery="be-1").json() == {"received": 1}
    receipt = WebhookReceipt.objects.get()
    data = receipt.input["event"]["data"] if "handler" in receipt.input else receipt.input["data"]
    assert data == {"ref": "main", "number": 7}


@pytest.mark.parametrize("event", ["issues", "push"])
@pytest.mark.parametrize("body", [b'{"ref": NaN}', b"{not json", b'{"ref": 1}, "source": "x"'])
def test_a_body_event_that_is_not_json_is_400_and_stores_nothing(
    client: Client, enabled: None, body_events: None, event: str, body: bytes
) -> None:
    response = post(client, body, event=event, delivery="be-2")
    assert response.status_code == 400, response.content
    assert not WebhookReceipt.objects.exists()
    assert not WorkflowRun.objects.exists()


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.one_of(st.binary(min_size=1, max_size=120), st.text(min_size=1).map(str.encode)))
def test_a_signed_body_event_is_stored_only_as_json(
    enabled: None, body_events: None, body: bytes
) -> None:
    """Whatever the signed body, the answer is never a 500, and what is stored is JSON."""
    WebhookReceipt.objects.all().delete()
    WebhookDigest.objects.all().delete()  # each example is a first delivery
    WorkflowRun.objects.all().delete()
    client = Client(raise_request_exception=False)
    response = post(client, body, event="issues", delivery="be-h")
    assert response.status_code in (200, 400), response.content
    try:
        expected = json.loads(body.decode("utf-8"))
    except ValueError:
        assert response.status_code == 400
        assert not WebhookReceipt.objects.exists()
    else:
        if response.status_code == 200:
            assert WebhookReceipt.objects.get().input["event"]["data"] == expected
    assert not WorkflowRun.objects.exists()  # nothing is dispatched in the request
