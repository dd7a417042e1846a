"""Local fakes of GitHub's webhook API, Stripe's webhook-endpoint API and an OAuth2
token endpoint, served over real HTTP on 127.0.0.1 (an ephemeral port).

They answer as the providers document, record every request (method, path, headers,
body), and check the credentials sent:

- GitHub: ``GET/POST /repos/{o}/{r}/hooks`` and ``/orgs/{org}/hooks``,
  ``GET/PATCH/DELETE .../hooks/{id}``; ``Authorization: Bearer <TOKEN>``, else 401
  ``{"message": "Bad credentials"}``.
- Stripe: ``POST /v1/webhook_endpoints`` (form: ``url``, ``enabled_events[]``) answers
  the endpoint with its ``secret``; ``GET``/``DELETE /v1/webhook_endpoints/{id}``;
  ``Authorization: Bearer <SECRET_KEY>``, else 401 quoting the key it was sent (so
  the tests see that errors are scrubbed of it).
- OAuth2: ``POST /oauth/token`` with the ``authorization_code`` or ``refresh_token``
  grant; a refused grant is 400 ``invalid_grant`` quoting the value it refused.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

GITHUB_TOKEN = "ghp_" + "t" * 36
STRIPE_KEY = "sk_test_" + "k" * 24
CLIENT_ID = "client-1"
CLIENT_SECRET = "client-secret-" + "s" * 20
GOOD_CODE = "code-" + "c" * 20


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, list[str]]:
        return parse_qs(self.body.decode(), keep_blank_values=True)


@dataclass
class ProviderAPI:
    """The fake's state: registrations, issued tokens and the requests it saw."""

    github_hooks: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    stripe_endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    refresh_tokens: set[str] = field(default_factory=set)
    requests: list[Recorded] = field(default_factory=list)
    fail_with: dict[str, int] = field(default_factory=dict)  # method -> status
    next_id: int = 1
    url: str = ""

    def calls(self) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.requests]


def _github(api: ProviderAPI, request: Recorded) -> tuple[int, Any]:
    if request.headers.get("authorization") != f"Bearer {GITHUB_TOKEN}":
        return 401, {"message": "Bad credentials"}
    parts = request.path.strip("/").split("/")
    # repos/{o}/{r}/hooks[/{id}] or orgs/{org}/hooks[/{id}]
    owner_len = 3 if parts[0] == "repos" else 2
    owner = "/".join(parts[1:owner_len])
    if len(parts) < owner_len + 1 or parts[owner_len] != "hooks":
        return 404, {"message": "Not Found"}
    hooks = api.github_hooks.setdefault(f"{parts[0]}/{owner}", {})
    hook_id = int(parts[owner_len + 1]) if len(parts) > owner_len + 1 else None
    if hook_id is None and request.method == "GET":
        return 200, list(hooks.values())
    if hook_id is None and request.method == "POST":
        data = request.json()
        config = data.get("config") or {}
        if not config.get("url") or data.get("name") != "web":
            return 422, {"message": "Validation Failed"}
        hook = {
            "id": api.next_id,
            "name": "web",
            "active": data.get("active", True),
            "events": data.get("events") or ["push"],
            "config": {**config, "secret": "********"},
            "secret": config.get("secret"),  # what deliveries are signed with
        }
        api.next_id += 1
        hooks[hook["id"]] = hook
        return 201, {k: v for k, v in hook.items() if k != "secret"}
    hook = hooks.get(hook_id) if hook_id is not None else None
    if hook is None:
        return 404, {"message": "Not Found"}
    if request.method == "GET":
        return 200, {k: v for k, v in hook.items() if k != "secret"}
    if request.method == "PATCH":
        data = request.json()
        config = data.get("config") or {}
        hook.update(events=data.get("events", hook["events"]), active=data.get("active", True))
        hook["config"] = {**config, "secret": "********"}
        hook["secret"] = config.get("secret", hook["secret"])
        return 200, {k: v for k, v in hook.items() if k != "secret"}
    if request.method == "DELETE":
        del hooks[hook_id]  # type: ignore[arg-type]
        return 204, None
    return 404, {"message": "Not Found"}


def _stripe(api: ProviderAPI, request: Recorded) -> tuple[int, Any]:
    auth = request.headers.get("authorization", "")
    if auth != f"Bearer {STRIPE_KEY}":
        return 401, {
            "error": {
                "message": f"Invalid API Key provided: {auth.removeprefix('Bearer ')}",
                "type": "invalid_request_error",
            }
        }
    endpoint_id = request.path.removeprefix("/v1/webhook_endpoints").strip("/")
    if not endpoint_id and request.method == "POST":
        form = request.form()
        if not form.get("url") or not form.get("enabled_events[]"):
            return 400, {"error": {"message": "Missing required param: url."}}
        endpoint = {
            "id": f"we_{secrets.token_hex(8)}",
            "object": "webhook_endpoint",
            "url": form["url"][0],
            "enabled_events": form["enabled_events[]"],
            "description": form.get("description", [None])[0],
            "status": "enabled",
            "secret": f"whsec_{secrets.token_hex(16)}",
        }
        api.stripe_endpoints[endpoint["id"]] = endpoint
        return 200, endpoint
    endpoint = api.stripe_endpoints.get(endpoint_id)
    if endpoint is None:
        return 404, {"error": {"message": f"No such webhook endpoint: '{endpoint_id}'"}}
    if request.method == "GET":
        return 200, {k: v for k, v in endpoint.items() if k != "secret"}
    if request.method == "DELETE":
        del api.stripe_endpoints[endpoint_id]
        return 200, {"id": endpoint_id, "object": "webhook_endpoint", "deleted": True}
    return 404, {"error": {"message": "Unrecognized request URL"}}


def _oauth(api: ProviderAPI, request: Recorded) -> tuple[int, Any]:
    form = {k: v[0] for k, v in request.form().items()}
    basic = request.headers.get("authorization", "")
    expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
    posted = (form.get("client_id"), form.get("client_secret")) == (CLIENT_ID, CLIENT_SECRET)
    if basic != expected and not posted:
        return 401, {"error": "invalid_client", "error_description": "Client authentication failed"}
    grant = form.get("grant_type")
    if grant == "authorization_code":
        if form.get("code") != GOOD_CODE:
            return 400, {
                "error": "invalid_grant",
                "error_description": f"The code {form.get('code')} is invalid",
            }
    elif grant == "refresh_token":
        if form.get("refresh_token") not in api.refresh_tokens:
            return 400, {
                "error": "invalid_grant",
                "error_description": f"The refresh token {form.get('refresh_token')} is invalid",
            }
        api.refresh_tokens.discard(form["refresh_token"])  # refresh tokens rotate
    else:
        return 400, {"error": "unsupported_grant_type"}
    refresh = f"rt-{secrets.token_hex(12)}"
    api.refresh_tokens.add(refresh)
    return 200, {
        "access_token": f"at-{secrets.token_hex(12)}",
        "token_type": "bearer",
        "expires_in": 3600,
        "refresh_token": refresh,
        "scope": form.get("scope", "read"),
    }


def _handler(api: ProviderAPI, lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            request = Recorded(
                self.command,
                parts.path,
                parse_qs(parts.query),
                {k.lower(): v for k, v in self.headers.items()},
                self.rfile.read(length),
            )
            with lock:
                api.requests.append(request)
                failing = api.fail_with.get(self.command)
                if failing:
                    status, data = failing, {"message": "Server Error"}
                elif parts.path.startswith(("/repos/", "/orgs/")):
                    status, data = _github(api, request)
                elif parts.path.startswith("/v1/webhook_endpoints"):
                    status, data = _stripe(api, request)
                elif parts.path == "/oauth/token" and self.command == "POST":
                    status, data = _oauth(api, request)
                else:
                    status, data = 404, {"message": "Not Found"}
            body = b"" if data is None else json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

    return Handler


def serve() -> Iterator[ProviderAPI]:
    """A fixture body: the fake, started on 127.0.0.1, stopped afterwards."""
    api = ProviderAPI()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api, threading.Lock()))
    host, port = server.server_address[:2]
    api.url = f"http://{host}:{port}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
