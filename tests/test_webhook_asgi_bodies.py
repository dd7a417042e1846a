"""Webhook bodies under ASGI: refused with 413 on their declared length before anything
is read, and otherwise once the bytes received pass ``PIKKU["WEBHOOK_MAX_BODY"]``, not
after Django's handler has spooled the whole body."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler

from pikku_django.asgi import limit_webhook_bodies
from pikku_django.webhooks import bodies

LIMIT = 256 * 1024
CHUNK = b"x" * 65536
#: What a sender streams: 300 MB, were all of it read.
CHUNKS = 300 * 1024 * 1024 // len(CHUNK)
#: The most chunks a bounded read may take: up to the limit, and the one past it.
MOST = LIMIT // len(CHUNK) + 1
URL = "/pikku/webhooks/wh-github/"


@pytest.fixture(autouse=True)
def limit(settings: Any) -> None:
    settings.PIKKU = {"WEBHOOK_MAX_BODY": LIMIT}


@dataclass
class Sender:
    """A client streaming ``chunks`` chunks; it counts what the application reads and
    hangs up past :data:`MOST` + 2 chunks (so an unbounded read ends, and shows)."""

    chunks: int
    reads: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)

    async def receive(self) -> dict[str, Any]:
        if self.reads >= min(self.chunks, MOST + 2):
            if self.reads >= self.chunks:
                await asyncio.sleep(3600)  # the body is done: wait, as a client does
            return {"type": "http.disconnect"}
        self.reads += 1
        return {"type": "http.request", "body": CHUNK, "more_body": self.reads < self.chunks}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def call(app: Any, sender: Sender, path: str = URL, length: int | None = None) -> None:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    asyncio.run(asyncio.wait_for(app(scope, sender.receive, sender.send), timeout=60))


@pytest.mark.parametrize(
    "length",
    [None, 100, LIMIT],
    ids=["no-content-length", "content-length-too-small", "content-length-at-the-limit"],
)
def test_a_streamed_oversize_body_is_refused_once_past_the_limit(length: int | None) -> None:
    sender = Sender(CHUNKS)
    call(limit_webhook_bodies(ASGIHandler()), sender, length=length)
    assert sender.status == 413
    assert json.loads(sender.body) == {"error": "request body too large"}
    assert sender.reads <= MOST  # no more than the limit and the chunk that passed it


def test_a_declared_oversize_body_is_refused_before_any_of_it_is_read() -> None:
    sender = Sender(CHUNKS)
    call(limit_webhook_bodies(ASGIHandler()), sender, length=CHUNKS * len(CHUNK))
    assert sender.status == 413
    assert sender.reads == 0


def test_a_body_within_the_limit_reaches_the_view_and_other_paths_are_left_alone(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bodies, "_warned_unbounded", False)
    caplog.set_level(logging.WARNING, logger="pikku_django")
    app = limit_webhook_bodies(ASGIHandler())
    sender = Sender(2)
    call(app, sender, path="/pikku/webhooks/no-such-source/", length=2 * len(CHUNK))
    assert sender.status == 404  # the view answered, having had the whole body
    assert sender.reads == 2
    elsewhere = Sender(MOST + 1)  # not a webhook: no limit of ours
    call(app, elsewhere, path="/elsewhere/")
    assert elsewhere.status == 404
    assert elsewhere.reads == MOST + 1
    assert not [r for r in caplog.records if "read whole under ASGI" in r.getMessage()]


def test_an_application_left_unwrapped_is_warned_about_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bodies, "_warned_unbounded", False)
    caplog.set_level(logging.WARNING, logger="pikku_django")
    for _ in range(2):
        call(ASGIHandler(), Sender(1), path="/pikku/webhooks/no-such-source/")
    [warning] = [r for r in caplog.records if "read whole under ASGI" in r.getMessage()]
    assert "pikku_django.asgi.get_asgi_application()" in warning.getMessage()
