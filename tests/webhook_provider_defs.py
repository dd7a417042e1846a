"""A fake webhook provider served over real HTTP, and sources that register with it.

:class:`FakeProvider` is a small JSON API on ``127.0.0.1`` (an ephemeral port) that
keeps webhook registrations the way GitHub or Stripe do:

- ``GET /hooks?label=L``  -> the registrations with that label
- ``GET /hooks/<id>``     -> one registration (404 when unknown)
- ``POST /hooks``         -> ``{"url", "label", "events"}`` in, ``{"id", "secret"}`` out
- ``DELETE /hooks/<id>``  -> 204 (404 when unknown)

The sources declared here call it with urllib from their ``check``/``setup``/
``teardown``; the tests point :data:`provider` at a running instance.
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from django.http import JsonResponse

from pikku_django.webhooks import (
    ProviderContext,
    WebhookEvent,
    WebhookSource,
    on_webhook,
    register_source,
)
from pikku_django.webhooks.presets import GitHub


class FakeProvider:
    """A provider's webhook-registration API, served in a thread."""

    def __init__(self) -> None:
        self.registrations: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail_with: dict[str, int] = {}  # method -> HTTP status to answer instead
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def by_label(self, label: str) -> list[dict[str, Any]]:
        return [r for r in self.registrations.values() if r["label"] == label]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output quiet

            def _answer(self, status: int, data: Any = None) -> None:
                body = b"" if data is None else json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _begin(self) -> bool:
                with provider._lock:
                    provider.requests.append((self.command, self.path))
                    status = provider.fail_with.get(self.command)
                if status:
                    self._answer(status, {"error": "provider is down"})
                    return False
                return True

            def do_GET(self) -> None:
                if not self._begin():
                    return
                parts = urlsplit(self.path)
                if parts.path == "/hooks":
                    label = parse_qs(parts.query).get("label", [""])[0]
                    self._answer(200, provider.by_label(label))
                    return
                found = provider.registrations.get(parts.path.removeprefix("/hooks/"))
                self._answer(200, found) if found else self._answer(404, {"error": "no hook"})

            def do_POST(self) -> None:
                if not self._begin():
                    return
                length = int(self.headers.get("Content-Length") or 0)
                data = json.loads(self.rfile.read(length))
                hook_id = f"hook-{secrets.token_hex(4)}"
                with provider._lock:
                    provider.registrations[hook_id] = {
                        "id": hook_id,
                        "url": data["url"],
                        "label": data["label"],
                        "events": data["events"],
                        "secret": f"whsec-{secrets.token_hex(16)}",
                    }
                self._answer(201, provider.registrations[hook_id])

            def do_DELETE(self) -> None:
                if not self._begin():
                    return
                with provider._lock:
                    found = provider.registrations.pop(self.path.removeprefix("/hooks/"), None)
                self._answer(204) if found else self._answer(404, {"error": "no hook"})

        return Handler


#: The running fake provider the sources below talk to (set by the tests' fixture).
provider: FakeProvider | None = None


def call(method: str, path: str, data: Any = None) -> Any:
    """One request to the fake provider; HTTPError for a 4xx/5xx answer."""
    assert provider is not None, "start the fake provider first"
    body = None if data is None else json.dumps(data).encode()
    request = urllib.request.Request(  # noqa: S310 (always http://127.0.0.1)
        provider.url + path,
        data=body,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        raw = response.read()
    return json.loads(raw) if raw else None


# -- a source the provider registers and signs for ----------------------------------


def hooks_check(ctx: ProviderContext) -> str:
    """ok / missing / drifted, by the stored id or else by the label."""
    if ctx.state and ctx.state.get("id"):
        try:
            hooks = [call("GET", f"/hooks/{ctx.state['id']}")]
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            hooks = []
    else:
        hooks = call("GET", f"/hooks?label={quote(ctx.label)}")
    if not hooks:
        return "missing"
    hook = hooks[0]
    if hook["url"] != ctx.url or hook["events"] != ctx.events:
        return "drifted"
    return "ok"


def hooks_setup(ctx: ProviderContext) -> dict[str, Any]:
    """Replace what is registered (under the stored id or the label) with a fresh one."""
    stale = {hook["id"] for hook in call("GET", f"/hooks?label={quote(ctx.label)}")}
    if ctx.state and ctx.state.get("id"):
        stale.add(ctx.state["id"])
    for hook_id in sorted(stale):
        try:
            call("DELETE", f"/hooks/{hook_id}")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
    hook = call("POST", "/hooks", {"url": ctx.url, "label": ctx.label, "events": ctx.events})
    ctx.set_secret(hook["secret"])
    return {"id": hook["id"]}


def hooks_teardown(ctx: ProviderContext) -> None:
    call("DELETE", f"/hooks/{(ctx.state or {})['id']}")


def receive_hooks(request: Any, ctx: Any) -> Any:
    if not ctx.body:
        return JsonResponse({"hello": "provider"})
    data = ctx.json()
    return [WebhookEvent(data["type"], id=data.get("id"), data=data)]


hooks = register_source(
    WebhookSource(
        name="prov-hooks",
        verify=GitHub(),
        receive=receive_hooks,
        events={"order.paid": None, "order.refunded": None},
        check=hooks_check,
        setup=hooks_setup,
        teardown=hooks_teardown,
    )
)

paid_orders: list[dict[str, Any]] = []


@on_webhook("prov-hooks:order.paid")
def on_paid(event: dict[str, Any]) -> None:
    paid_orders.append(event)


# -- sources a person registers by hand ----------------------------------------------


def receive_nothing(request: Any, ctx: Any) -> Any:
    return None


manual = register_source(
    WebhookSource(name="prov-manual", receive=receive_nothing, events={"ping": None})
)


def check_only(ctx: ProviderContext) -> str:
    return "ok" if call("GET", f"/hooks?label={quote(ctx.label)}") else "missing"


check_only_source = register_source(
    WebhookSource(
        name="prov-check-only", receive=receive_nothing, events={"ping": None}, check=check_only
    )
)


# -- a source whose check always fails ------------------------------------------------


def broken_check(ctx: ProviderContext) -> str:
    call("GET", "/hooks/broken")  # 404 -> HTTPError
    return "ok"


broken = register_source(
    WebhookSource(
        name="prov-broken",
        receive=receive_nothing,
        events={"ping": None},
        check=broken_check,
        setup=hooks_setup,
    )
)


def temporary_source(name: str = "prov-temp") -> WebhookSource:
    """A source like ``prov-hooks`` that a test declares and later removes."""
    return register_source(
        WebhookSource(
            name=name,
            receive=receive_hooks,
            events={"order.paid": None},
            check=hooks_check,
            setup=hooks_setup,
            teardown=hooks_teardown,
        )
    )


def running_provider() -> Iterator[FakeProvider]:
    """A fixture body: a started fake provider that the sources above talk to."""
    global provider
    started = FakeProvider().start()
    provider = started
    try:
        yield started
    finally:
        provider = None
        started.stop()
