"""The webhook view while its database cannot be reached: 503, nothing stored, and
the sender's next delivery stored once.

The database alias is pointed at a local TCP port that refuses connections, one that
accepts and drops them, or a forwarder to the real server that the test cuts.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.db.models import Model
from django.test import Client

from pikku_django.models import CredentialValue, TriggerSource, WebhookReceipt
from pikku_django.webhooks import credential_name
from pikku_django.webhooks.credentials import encrypt
from pikku_django.workflows.api import reset_engine
from tests import webhook_defs  # noqa: F401  (declares wh-github)
from tests.conftest import database_alias, on_databases

SOURCE = "wh-github"
SECRET = "It's a Secret to Everybody"
URL = "/pikku/webhooks/wh-github/"


class PikkuOn:
    """Routes pikku_django's models (sources, credentials, receipts) to one alias."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return self.alias if model._meta.app_label == "pikku_django" else None

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return self.alias if model._meta.app_label == "pikku_django" else None


def free_port() -> int:
    """A local port nothing listens on, so connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Forwarder:
    """A TCP forwarder to ``upstream`` that can be cut: while down it accepts each
    connection and closes it at once, and cutting closes every open one."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.up = True
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self.up:
                client.close()
                continue
            server = socket.create_connection(self.upstream)
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every open connection and every new one until :meth:`restore`."""
        self.up = False
        with self._lock:
            for end in self._open:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()
            self._open.clear()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self._listener.close()


@contextlib.contextmanager
def pointed_at(alias: str, port: int) -> Iterator[None]:
    """``alias`` connects to 127.0.0.1:``port`` instead of its server."""
    connection = connections[alias]
    saved = {key: connection.settings_dict.get(key) for key in ("HOST", "PORT")}
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=port)
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.update(saved)


@pytest.fixture
def on_vendor(vendor: str, settings: Any) -> Iterator[str]:
    """wh-github enabled, with its secret, all of pikku_django on ``vendor``'s database,
    over a connection that persists between requests."""
    alias = database_alias(vendor)
    settings.DATABASE_ROUTERS = [PikkuOn(alias)]
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    connection = connections[alias]
    saved = connection.settings_dict["CONN_MAX_AGE"]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = None
    TriggerSource.objects.using(alias).update_or_create(
        name=SOURCE, defaults={"kind": "webhook", "enabled": True}
    )
    CredentialValue.objects.using(alias).create(
        credential=credential_name(SOURCE), ciphertext=encrypt(SECRET), hint=""
    )
    try:
        yield alias
    finally:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = saved
        reset_engine()


def post(client: Client, delivery: str) -> Any:
    body = b'{"ref": "main", "delivery": "%s"}' % delivery.encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return client.post(
        URL,
        body,
        content_type="application/json",
        HTTP_X_GITHUB_EVENT="push",
        HTTP_X_GITHUB_DELIVERY=delivery,
        HTTP_X_HUB_SIGNATURE_256=signature,
    )


def receipts(alias: str) -> list[str]:
    return sorted(
        WebhookReceipt.objects.using(alias)
        .filter(source=SOURCE)
        .values_list("provider_id", flat=True)
    )


def refused_port() -> Iterator[int]:
    yield free_port()


def dropping_port() -> Iterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))

    def drop() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            client.close()

    threading.Thread(target=drop, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


@on_databases("postgres", "mariadb")
@pytest.mark.parametrize("fault", [refused_port, dropping_port], ids=["refused", "dropped"])
def test_an_unreachable_database_is_a_503_and_the_next_delivery_is_stored(
    vendor: str, on_vendor: str, fault: Any
) -> None:
    client = Client()
    for port in fault():
        with pointed_at(on_vendor, port):
            answer = post(client, "during")
            assert answer.status_code == 503, answer.content
            assert "database is unreachable" in answer.json()["error"]
    assert receipts(on_vendor) == []
    answer = post(client, "during")  # the sender delivers again
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"received": 1}
    assert receipts(on_vendor) == ["during"]


@on_databases("postgres", "mariadb")
def test_a_connection_cut_between_requests_is_a_503_then_the_same_connection_setting_recovers(
    vendor: str, on_vendor: str
) -> None:
    connection = connections[on_vendor]
    upstream = (
        connection.settings_dict["HOST"] or "127.0.0.1",
        int(connection.settings_dict["PORT"]),
    )
    forwarder = Forwarder(upstream)
    client = Client()
    try:
        with pointed_at(on_vendor, forwarder.port):
            assert post(client, "before").json() == {"received": 1}  # the connection persists
            forwarder.cut()
            for _ in range(3):  # each delivery during the outage, also on a new connection
                answer = post(client, "during")
                assert answer.status_code == 503, answer.content
            forwarder.restore()
            answer = post(client, "during")
            assert answer.status_code == 200, answer.content
            assert answer.json() == {"received": 1}
            assert post(client, "during").json() == {"received": 0}  # a redelivery
    finally:
        forwarder.close()
    assert receipts(on_vendor) == ["before", "during"]
