"""A webhook source's switch and secrets kept on a PostgreSQL connection between requests.

The web connection LISTENs on ``pikku_sources``; triggers notify it of every change to a
source or a credential value. What it keeps is confirmed by the gate of the statement
that stores an event, or read afresh before any answer that stores nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import select
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections, transaction
from django.db.models import Model
from django.test import Client
from django.test.utils import CaptureQueriesContext

from pikku_django.models import CredentialValue, TriggerSource, WebhookReceipt
from pikku_django.wakeups import SOURCES_CHANNEL
from pikku_django.webhooks import credential_name, set_credential
from pikku_django.webhooks.credentials import encrypt
from pikku_django.webhooks.lifecycle import disable, sync
from pikku_django.webhooks.sql import (
    Gate,
    NewEvent,
    SourceChanged,
    fingerprint_of,
    read_source_state,
    store_event,
)
from pikku_django.webhooks.state import source_state
from pikku_django.workflows.api import reset_engine
from tests import webhook_defs
from tests.conftest import database_alias, on_databases

SOURCE = "wh-github"
CREDENTIAL = credential_name(SOURCE)
SECRET = "It's a Secret to Everybody"
NEW_SECRET = "a rotated secret"
URL = "/pikku/webhooks/wh-github/"


class PikkuOnPostgres:
    """Routes pikku_django's models (sources, credentials, runs) to the postgres alias."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return "postgres" if model._meta.app_label == "pikku_django" else None

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return "postgres" if model._meta.app_label == "pikku_django" else None


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def post(
    client: Client,
    body: bytes,
    *,
    delivery: str,
    event: str = "push",
    secret: str = SECRET,
) -> Any:
    return client.post(
        URL,
        body,
        content_type="application/json",
        HTTP_X_GITHUB_EVENT=event,
        HTTP_X_GITHUB_DELIVERY=delivery,
        HTTP_X_HUB_SIGNATURE_256=sign(body, secret),
    )


def push(delivery: str) -> bytes:
    return json.dumps({"ref": "main", "delivery": delivery}).encode()


def stored(alias: str) -> tuple[int, int]:
    """How many receipts ``alias`` holds, and how many of them wait for their run (no
    worker runs here: each stored event's run is still to start)."""
    receipts = WebhookReceipt.objects.using(alias)
    return receipts.count(), receipts.filter(run_id__isnull=True, input__isnull=False).count()


def state_reads(captured: CaptureQueriesContext) -> int:
    """How many of the captured statements read a source's state."""
    return sum(
        1
        for q in captured.captured_queries
        if q["sql"].startswith("SELECT") and "pikku_trigger_source" in q["sql"]
    )


def elsewhere(alias: str, *statements: tuple[str, list[Any]]) -> None:
    """Run ``statements`` on a connection of another process (autocommit), then close it."""
    settings_dict = connections[alias].settings_dict
    params = {
        "dbname": settings_dict["NAME"],
        "host": settings_dict.get("HOST") or None,
        "port": settings_dict.get("PORT") or None,
        "user": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
    }
    with psycopg.connect(
        autocommit=True, **{k: v for k, v in params.items() if v is not None}
    ) as conn:
        for sql, args in statements:
            conn.execute(sql, args)


def set_enabled_elsewhere(alias: str, enabled: bool) -> None:
    elsewhere(
        alias, ("UPDATE pikku_trigger_source SET enabled = %s WHERE name = %s", [enabled, SOURCE])
    )


def rotate_elsewhere(alias: str, value: str) -> None:
    """Retire the credential's values and add ``value``, from another connection."""
    elsewhere(
        alias,
        ("UPDATE pikku_credential_value SET active = false WHERE credential = %s", [CREDENTIAL]),
        (
            "INSERT INTO pikku_credential_value (credential, ciphertext, hint, active, created_at) "
            "VALUES (%s, %s, '', true, now())",
            [CREDENTIAL, encrypt(value)],
        ),
    )


def await_notification(alias: str) -> None:
    """Wait until a notification reaches the web connection's socket (5 s at most)."""
    raw = connections[alias].connection
    readable, _, _ = select.select([raw.fileno()], [], [], 5)
    assert readable, "no notification reached the web connection"


def lose_notifications(alias: str) -> None:
    """What a pooler does: the web connection no longer hears pikku_sources."""
    connections[alias].connection.execute("UNLISTEN *")


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    reset_engine()
    yield
    reset_engine()


@pytest.fixture
def receive_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records each call of wh-github's receive (by request method)."""
    calls: list[str] = []
    original: Callable[..., Any] = webhook_defs.github.receive

    def counted(request: Any, ctx: Any) -> Any:
        calls.append(request.method)
        return original(request, ctx)

    monkeypatch.setattr(webhook_defs.github, "receive", counted)
    return calls


@pytest.fixture
def pg(vendor: str, settings: Any) -> Iterator[str]:
    """pikku_django on PostgreSQL, on a persistent web connection; wh-github enabled."""
    alias = database_alias(vendor)
    settings.DATABASE_ROUTERS = [PikkuOnPostgres()]
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    connection = connections[alias]
    saved = connection.settings_dict["CONN_MAX_AGE"]
    connection.close()  # opened again below with the new CONN_MAX_AGE
    connection.settings_dict["CONN_MAX_AGE"] = None
    TriggerSource.objects.using(alias).update_or_create(
        name=SOURCE, defaults={"kind": "webhook", "enabled": True}
    )
    CredentialValue.objects.using(alias).create(
        credential=CREDENTIAL, ciphertext=encrypt(SECRET), hint=""
    )
    try:
        yield alias
    finally:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = saved


def keep_state(client: Client, alias: str, delivery: str = "first") -> None:
    """A first request, which stores its event and leaves the state kept."""
    response = post(client, push(delivery), delivery=delivery)
    assert response.status_code == 200, response.content
    assert response.json() == {"received": 1}
    assert source_state(SOURCE, CREDENTIAL, alias).cached is True


# -- requests on a kept state ---------------------------------------------------------------


@on_databases("postgres")
def test_a_kept_state_stores_the_next_event_in_one_statement(pg: str, client: Client) -> None:
    """After a first request, a new event costs one statement: the gated store."""
    keep_state(client, pg)
    with CaptureQueriesContext(connections[pg]) as captured:
        response = post(client, push("second"), delivery="second")
    assert response.status_code == 200, response.content
    assert response.json() == {"received": 1}
    assert [q["sql"][:10] for q in captured.captured_queries] == ["WITH gate "]
    assert stored(pg) == (2, 2)
    assert set(WebhookReceipt.objects.using(pg).values_list("provider_id", flat=True)) == {
        "first",
        "second",
    }


@on_databases("postgres")
def test_disabled_elsewhere_is_404_without_receive(
    pg: str, client: Client, receive_calls: list[str]
) -> None:
    """A disable notified from another connection: 404, receive not called, nothing stored."""
    keep_state(client, pg)
    set_enabled_elsewhere(pg, False)
    await_notification(pg)
    receive_calls.clear()
    response = post(client, push("after"), delivery="after")
    assert response.status_code == 404
    assert receive_calls == []
    assert stored(pg) == (1, 1)


@on_databases("postgres")
def test_disabled_through_the_same_connection_is_404_without_receive(
    pg: str, client: Client, receive_calls: list[str]
) -> None:
    """A disable by the web connection itself reaches it too."""
    keep_state(client, pg)
    TriggerSource.objects.using(pg).filter(name=SOURCE).update(enabled=False)
    receive_calls.clear()
    assert post(client, push("after"), delivery="after").status_code == 404
    assert receive_calls == []
    assert stored(pg) == (1, 1)


@on_databases("postgres")
def test_disabled_with_lifecycle_disable_is_404_without_receive(
    pg: str, client: Client, receive_calls: list[str]
) -> None:
    """lifecycle.disable (no provider to tear down) through the routed connection."""
    keep_state(client, pg)
    assert disable(SOURCE).status == "disabled"
    receive_calls.clear()
    assert post(client, push("after"), delivery="after").status_code == 404
    assert receive_calls == []
    assert stored(pg) == (1, 1)


@on_databases("postgres")
def test_notifications_lost_disable_is_caught_by_the_gate(
    pg: str, client: Client, receive_calls: list[str]
) -> None:
    """Without notifications the gate refuses the store (404); the next request is 404
    without receive."""
    keep_state(client, pg)
    lose_notifications(pg)
    set_enabled_elsewhere(pg, False)
    receive_calls.clear()
    assert post(client, push("gated"), delivery="gated").status_code == 404
    assert stored(pg) == (1, 1)
    assert len(receive_calls) <= 1
    receive_calls.clear()
    assert post(client, push("next"), delivery="next").status_code == 404
    assert stored(pg) == (1, 1)
    assert receive_calls == [], "receive ran for a source already found disabled"


@on_databases("postgres")
def test_a_fresh_read_finding_the_source_disabled_drops_the_kept_state(pg: str) -> None:
    """What a fresh read found disabled is no longer answered from what was kept."""
    assert source_state(SOURCE, CREDENTIAL, pg).cached is False
    assert source_state(SOURCE, CREDENTIAL, pg).cached is True
    lose_notifications(pg)
    set_enabled_elsewhere(pg, False)
    assert source_state(SOURCE, CREDENTIAL, pg, fresh=True).enabled is False
    after = source_state(SOURCE, CREDENTIAL, pg)
    assert (after.enabled, after.cached) == (False, False)


@on_databases("postgres")
def test_notifications_lost_rotated_secret_old_is_401_new_is_stored(
    pg: str, client: Client
) -> None:
    """A rotation nobody heard of: the old secret is refused, the new one accepted."""
    keep_state(client, pg)
    lose_notifications(pg)
    rotate_elsewhere(pg, NEW_SECRET)
    old = post(client, push("old"), delivery="old", secret=SECRET)
    assert old.status_code == 401, old.content
    assert stored(pg) == (1, 1)
    new = post(client, push("new"), delivery="new", secret=NEW_SECRET)
    assert new.status_code == 200, new.content
    assert new.json() == {"received": 1}
    assert stored(pg) == (2, 2)


@on_databases("postgres")
def test_notifications_lost_new_secret_first_is_stored(pg: str, client: Client) -> None:
    """A request signed with a secret added since the state was kept is verified afresh."""
    keep_state(client, pg)
    lose_notifications(pg)
    rotate_elsewhere(pg, NEW_SECRET)
    new = post(client, push("new"), delivery="new", secret=NEW_SECRET)
    assert new.status_code == 200, new.content
    assert new.json() == {"received": 1}
    assert post(client, push("old"), delivery="old", secret=SECRET).status_code == 401
    assert stored(pg) == (2, 2)


@on_databases("postgres")
def test_re_enabled_elsewhere_receives_again(pg: str, client: Client) -> None:
    """Disable then re-enable, both notified: 404, then 200 and stored."""
    keep_state(client, pg)
    set_enabled_elsewhere(pg, False)
    await_notification(pg)
    assert post(client, push("off"), delivery="off").status_code == 404
    set_enabled_elsewhere(pg, True)
    await_notification(pg)
    response = post(client, push("on"), delivery="on")
    assert response.status_code == 200, response.content
    assert response.json() == {"received": 1}
    assert stored(pg) == (2, 2)


@on_databases("postgres")
def test_notifications_lost_handshake_after_disable_is_404_without_receive(
    pg: str, client: Client, receive_calls: list[str]
) -> None:
    """A bodyless GET reads the kept state afresh before receive answers it."""
    keep_state(client, pg)
    lose_notifications(pg)
    set_enabled_elsewhere(pg, False)
    receive_calls.clear()
    assert client.get(URL).status_code == 404
    assert receive_calls == []


@on_databases("postgres")
def test_handshake_on_a_kept_state_is_answered_by_receive(
    pg: str, client: Client, receive_calls: list[str]
) -> None:
    """Control: with the source still enabled, the bodyless GET reaches receive."""
    keep_state(client, pg)
    receive_calls.clear()
    response = client.get(URL)
    assert response.status_code == 200
    assert response.json() == {"hello": "handshake"}
    assert receive_calls == ["GET"]


@on_databases("postgres")
@pytest.mark.parametrize("event", ["undeclared", "unbound"])
def test_notifications_lost_dropped_events_after_disable_are_404(
    pg: str, client: Client, event: str
) -> None:
    """Events that store nothing (undeclared, or without a handler) confirm nothing: 404."""
    keep_state(client, pg)
    lose_notifications(pg)
    set_enabled_elsewhere(pg, False)
    assert post(client, b'{"x": 1}', delivery="dropped", event=event).status_code == 404
    assert stored(pg) == (1, 1)


@on_databases("postgres")
def test_notifications_lost_head_after_disable_is_404(pg: str, client: Client) -> None:
    """HEAD stores nothing, so a kept state is read afresh first."""
    keep_state(client, pg)
    lose_notifications(pg)
    set_enabled_elsewhere(pg, False)
    assert client.head(URL).status_code == 404


# -- the gate, in SQL and in Python ----------------------------------------------------------


def gated_event(provider_id: str) -> NewEvent:
    return NewEvent(
        source=SOURCE,
        event="push",
        provider_id=provider_id,
        data_json=json.dumps({"ref": "main"}),
        workflow="wh.deploy",
    )


@on_databases("postgres")
def test_the_gate_computes_the_fingerprint_python_computes(vendor: str) -> None:
    """A wrong fingerprint stores nothing; read_source_state + fingerprint_of stores."""
    alias = database_alias(vendor)
    TriggerSource.objects.using(alias).create(name=SOURCE, enabled=True)
    values = CredentialValue.objects.using(alias)
    first = values.create(credential=CREDENTIAL, ciphertext=encrypt("one"))
    retired = values.create(credential=CREDENTIAL, ciphertext=encrypt("old"), active=False)
    second = values.create(credential=CREDENTIAL, ciphertext=encrypt("two"))
    values.create(credential="someoneElse", ciphertext=encrypt("other"))

    enabled, ciphertexts = read_source_state(alias, SOURCE, CREDENTIAL)
    assert enabled is True
    assert ciphertexts == [first.ciphertext, second.ciphertext]
    wrong = [
        "",
        fingerprint_of([second.ciphertext, first.ciphertext]),
        fingerprint_of([first.ciphertext, retired.ciphertext, second.ciphertext]),
        fingerprint_of([first.ciphertext]),
    ]
    for fingerprint in wrong:
        with pytest.raises(SourceChanged):
            store_event(
                alias,
                gated_event("e-1"),
                notify=False,
                gate=Gate(SOURCE, CREDENTIAL, fingerprint),
            )
        assert stored(alias) == (0, 0)

    right = Gate(SOURCE, CREDENTIAL, fingerprint_of(ciphertexts))
    assert store_event(alias, gated_event("e-1"), notify=False, gate=right)
    assert stored(alias) == (1, 1)
    # A redelivery passes the gate and is refused by the receipt, not by the gate.
    assert store_event(alias, gated_event("e-1"), notify=False, gate=right) is False

    TriggerSource.objects.using(alias).filter(name=SOURCE).update(enabled=False)
    with pytest.raises(SourceChanged):
        store_event(alias, gated_event("e-2"), notify=False, gate=right)
    assert stored(alias) == (1, 1)


@on_databases("postgres")
def test_the_gate_of_a_credential_without_values_is_empty(vendor: str) -> None:
    """No active value: both sides agree on the empty fingerprint."""
    alias = database_alias(vendor)
    TriggerSource.objects.using(alias).create(name=SOURCE, enabled=True)
    enabled, ciphertexts = read_source_state(alias, SOURCE, CREDENTIAL)
    assert (enabled, ciphertexts) == (True, [])
    gate = Gate(SOURCE, CREDENTIAL, fingerprint_of(ciphertexts))
    assert store_event(alias, gated_event("e"), notify=False, gate=gate)
    assert read_source_state(alias, "no-such-source", CREDENTIAL) == (None, [])


# -- the triggers -----------------------------------------------------------------------------


@on_databases("postgres")
def test_every_change_to_sources_and_credential_values_notifies(vendor: str) -> None:
    """INSERT, UPDATE, DELETE and TRUNCATE on both tables each notify pikku_sources."""
    alias = database_alias(vendor)
    template = connections[alias]
    listening = type(template)(template.settings_dict, alias)
    listening.ensure_connection()
    raw = listening.connection
    raw.autocommit = True
    raw.execute(f"LISTEN {SOURCES_CHANNEL}")
    sources = TriggerSource.objects.using(alias)
    values = CredentialValue.objects.using(alias)

    def truncate(table: str) -> Callable[[], None]:
        def run() -> None:
            with connections[alias].cursor() as cursor:
                cursor.execute(f"TRUNCATE {table}")

        return run

    changes: list[tuple[str, Callable[[], Any]]] = [
        ("source insert", lambda: sources.create(name="t-1")),
        ("source update", lambda: sources.filter(name="t-1").update(enabled=True)),
        ("source delete", lambda: sources.filter(name="t-1").delete()),
        ("source truncate", truncate("pikku_trigger_source")),
        ("value insert", lambda: values.create(credential="c", ciphertext="x")),
        ("value update", lambda: values.filter(credential="c").update(active=False)),
        ("value delete", lambda: values.filter(credential="c").delete()),
        ("value truncate", truncate("pikku_credential_value")),
    ]
    try:
        for what, change in changes:
            change()
            heard = [n.channel for n in raw.notifies(timeout=60, stop_after=1)]
            assert heard == [SOURCES_CHANNEL], what
    finally:
        listening.close()


# -- where nothing is kept --------------------------------------------------------------------


def two_requests_read_twice(client: Client, alias: str) -> None:
    """Two requests, the second of which reads the state again."""
    assert post(client, push("one"), delivery="one").status_code == 200
    with CaptureQueriesContext(connections[alias]) as captured:
        response = post(client, push("two"), delivery="two")
    assert response.status_code == 200, response.content
    assert response.json() == {"received": 1}
    assert state_reads(captured) == 1
    assert source_state(SOURCE, CREDENTIAL, alias).cached is False


@on_databases("postgres")
def test_nothing_is_kept_with_the_setting_off(pg: str, client: Client, settings: Any) -> None:
    """WEBHOOK_STATE_CACHE False: every request reads the state."""
    settings.PIKKU = {"WORKFLOW_DATABASE": pg, "WEBHOOK_STATE_CACHE": False}
    reset_engine()
    two_requests_read_twice(client, pg)
    with CaptureQueriesContext(connections[pg]) as captured:
        post(client, push("three"), delivery="three")
    assert len(captured.captured_queries) == 2


@on_databases("postgres")
def test_nothing_is_kept_behind_a_transaction_pooler(
    pg: str, client: Client, settings: Any
) -> None:
    """A pooled connection cannot LISTEN for changes: every request reads the state."""
    settings.PIKKU = {"WORKFLOW_DATABASE": pg, "DATABASE_POOLING": {pg: "transaction"}}
    reset_engine()
    two_requests_read_twice(client, pg)
    with CaptureQueriesContext(connections[pg]) as captured:
        post(client, push("three"), delivery="three")
    assert state_reads(captured) == 1


@on_databases("postgres")
def test_nothing_is_kept_on_a_connection_per_request(pg: str, client: Client) -> None:
    """CONN_MAX_AGE 0: every request reads the state."""
    connection = connections[pg]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = 0
    two_requests_read_twice(client, pg)


@on_databases("postgres")
def test_nothing_is_kept_inside_a_transaction(pg: str) -> None:
    """Inside a transaction the state is read every time."""
    assert source_state(SOURCE, CREDENTIAL, pg).cached is False
    assert source_state(SOURCE, CREDENTIAL, pg).cached is True  # kept outside one
    with transaction.atomic(using=pg):
        assert source_state(SOURCE, CREDENTIAL, pg).cached is False
        assert source_state(SOURCE, CREDENTIAL, pg).cached is False


@on_databases("postgres")
def test_a_disabled_source_is_never_kept(pg: str) -> None:
    """Only enabled states are kept: a disabled one is read every time."""
    TriggerSource.objects.using(pg).filter(name=SOURCE).update(enabled=False)
    first = source_state(SOURCE, CREDENTIAL, pg)
    assert (first.enabled, first.cached) == (False, False)
    assert source_state(SOURCE, CREDENTIAL, pg).cached is False


@on_databases("postgres")
def test_the_state_is_read_afresh_when_the_workflow_database_differs(
    pg: str, client: Client, settings: Any
) -> None:
    """No gate where the events are stored elsewhere: the view reads the state each time."""
    settings.PIKKU = {"WORKFLOW_DATABASE": "default"}
    reset_engine()
    assert post(client, push("one"), delivery="one").status_code == 200
    with CaptureQueriesContext(connections[pg]) as captured:
        assert post(client, push("two"), delivery="two").status_code == 200
    assert state_reads(captured) == 1
    assert WebhookReceipt.objects.using("default").count() == 2


@on_databases("sqlite")
def test_nothing_is_kept_on_sqlite(vendor: str, client: Client) -> None:
    """SQLite: every request reads the state."""
    alias = database_alias(vendor)
    sync()
    TriggerSource.objects.filter(name=SOURCE).update(enabled=True)
    set_credential(CREDENTIAL, SECRET)
    two_requests_read_twice(client, alias)
