"""Registering webhook sources with GitHub and Stripe through their REST APIs.

A preset given where to register (``GitHub(repository=..., token_credential=...)``,
``Stripe(secret_key_credential=...)``) carries one of these; the source it verifies
takes its ``check``, ``setup`` and ``teardown`` from it. Requests go through ``httpx``
(the ``providers`` extra) with a timeout; a 4xx/5xx answer raises
:class:`ProviderError`, whose message never holds a token or secret.
"""

from __future__ import annotations

import logging
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from pikku_django.webhooks.credentials import credential_values

if TYPE_CHECKING:
    import httpx

    from pikku_django.webhooks.sources import ProviderContext

logger = logging.getLogger(__name__)

__all__ = [
    "GitHubRegistration",
    "ProviderError",
    "ProviderRegistration",
    "StripeRegistration",
    "redacted",
]

#: Seconds a request to a provider may take (connect, read, write and pool each).
DEFAULT_TIMEOUT = 10.0

_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_ORGANIZATION = re.compile(r"^[A-Za-z0-9-]+$")


class ProviderError(Exception):
    """A provider refused or failed a request (or could not be reached): ``status`` is
    its HTTP status (None when unreachable). The message names the request and quotes
    the provider's own message with every secret in play removed."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def redacted(text: str, hidden: Iterable[str]) -> str:
    """``text`` with every value of ``hidden`` (4 characters or more) replaced by ``***``."""
    for value in sorted({v for v in hidden if v and len(v) >= 4}, key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def load_httpx() -> Any:
    """The httpx module, or ImproperlyConfigured saying which extra installs it."""
    try:
        import httpx
    except ImportError as exc:
        raise ImproperlyConfigured(
            "Registering webhook sources with a provider needs httpx: "
            "pip install 'pikku-django[providers]'"
        ) from exc
    return httpx


def httpx_installed() -> bool:
    """Whether httpx can be imported (see :func:`load_httpx`)."""
    try:
        load_httpx()
    except ImproperlyConfigured:
        return False
    return True


def required_value(name: str, what: str) -> str:
    """The first value of credential ``name`` (``what`` it holds, for the error)."""
    values = credential_values(name)
    if not values:
        raise ProviderError(
            f"the credential {name!r} ({what}) has no value: set it with "
            f"`manage.py pikku_credentials set {name}`"
        )
    return values[0]


class ProviderRegistration(ABC):
    """How one provider registers, checks and removes a source's webhook."""

    #: The provider's name, as messages show it.
    provider = "the provider"

    def __init__(self, api_url: str, timeout: float) -> None:
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout

    @abstractmethod
    def check(self, ctx: ProviderContext) -> str:
        """``"ok"``, ``"missing"`` or ``"drifted"``."""

    @abstractmethod
    def setup(self, ctx: ProviderContext) -> dict[str, Any]:
        """Register (or update) the webhook; the ids to keep as the source's state."""

    @abstractmethod
    def teardown(self, ctx: ProviderContext) -> None:
        """Remove the registered webhook (one already gone is not an error)."""

    @abstractmethod
    def _headers(self) -> tuple[dict[str, str], list[str]]:
        """The request headers, and the secret values they hold."""

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: Mapping[str, str | list[str]] | None = None,
        params: dict[str, str] | None = None,
        missing_ok: bool = False,
        hidden: Sequence[str] = (),
    ) -> Any:
        """One request; the decoded JSON answer, None for an empty one or (with
        ``missing_ok``) a 404; :class:`ProviderError` otherwise."""
        httpx = load_httpx()
        headers, secret_values = self._headers()
        hide = [*secret_values, *hidden]
        try:
            with httpx.Client(
                base_url=self.api_url, timeout=self.timeout, headers=headers
            ) as client:
                response = client.request(method, path, json=json, data=data, params=params)
        except httpx.HTTPError as exc:
            raise ProviderError(
                redacted(
                    f"{self.provider} could not be reached for {method} {self.api_url}{path}: "
                    f"{type(exc).__name__}: {exc}",
                    hide,
                )
            ) from None
        if missing_ok and response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise ProviderError(
                redacted(
                    f"{self.provider} answered {response.status_code} to {method} {path}: "
                    f"{_error_message(response)}",
                    hide,
                ),
                response.status_code,
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ProviderError(
                f"{self.provider} answered {method} {path} with something other than JSON",
                response.status_code,
            ) from None


def _error_message(response: httpx.Response) -> str:
    """The provider's own words about an error (GitHub's ``message``, Stripe's
    ``error.message``), else the status's reason."""
    try:
        body = response.json()
    except ValueError:
        return response.reason_phrase or "no reason given"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:500]
        if isinstance(body.get("message"), str):
            return str(body["message"])[:500]
    return response.reason_phrase or "no reason given"


class GitHubRegistration(ProviderRegistration):
    """A repository's or an organisation's webhook, through GitHub's REST API
    (``/repos/{owner}/{repo}/hooks`` or ``/orgs/{org}/hooks``), authenticated with the
    token in ``token_credential``. Its signing secret is the source's credential: the
    first value it has, else a new one that ``setup`` stores."""

    provider = "GitHub"

    def __init__(
        self,
        *,
        repository: str | None = None,
        organization: str | None = None,
        token_credential: str,
        events: Sequence[str] | None = None,
        api_url: str = "https://api.github.com",
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(api_url, timeout)
        if (repository is None) == (organization is None):
            raise ValueError("GitHub registration needs repository='owner/repo' or organization=")
        if repository is not None and not _REPOSITORY.match(repository):
            raise ValueError(f"repository must be 'owner/repo', got {repository!r}")
        if organization is not None and not _ORGANIZATION.match(organization):
            raise ValueError(f"organization must be an organisation's login, got {organization!r}")
        if not isinstance(token_credential, str) or not token_credential:
            raise ValueError("GitHub registration needs token_credential= (a credential name)")
        self.repository = repository
        self.organization = organization
        self.token_credential = token_credential
        self.events = list(events) if events is not None else None
        self.hooks_path = (
            f"/repos/{repository}/hooks" if repository else f"/orgs/{organization}/hooks"
        )

    def _headers(self) -> tuple[dict[str, str], list[str]]:
        token = required_value(self.token_credential, "the GitHub token")
        return (
            {
                "Authorization": f"Bearer {token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
            },
            [token],
        )

    def _events(self, ctx: ProviderContext) -> list[str]:
        return list(self.events if self.events is not None else ctx.events) or ["*"]

    def _find(self, ctx: ProviderContext) -> dict[str, Any] | None:
        """The hook registered for the source: by its kept id, else by its URL."""
        hook_id = (ctx.state or {}).get("id")
        if hook_id is not None:
            found = self._request("GET", f"{self.hooks_path}/{hook_id}", missing_ok=True)
            if found is not None:
                return dict(found)
        page = 1
        while True:
            hooks = self._request(
                "GET", self.hooks_path, params={"per_page": "100", "page": str(page)}
            )
            if not isinstance(hooks, list):
                raise ProviderError(f"GitHub answered GET {self.hooks_path} with no list of hooks")
            for hook in hooks or []:
                if (hook.get("config") or {}).get("url") == ctx.url:
                    return dict(hook)
            if not hooks or len(hooks) < 100:
                return None
            page += 1

    def check(self, ctx: ProviderContext) -> str:
        hook = self._find(ctx)
        if hook is None:
            return "missing"
        config = hook.get("config") or {}
        matches = (
            config.get("url") == ctx.url
            and config.get("content_type") == "json"
            and sorted(hook.get("events") or []) == sorted(self._events(ctx))
            and hook.get("active", True)
            and bool(ctx.secrets)  # without a secret, deliveries cannot be verified
        )
        return "ok" if matches else "drifted"

    def setup(self, ctx: ProviderContext) -> dict[str, Any]:
        secret = ctx.secrets[0] if ctx.secrets else secrets.token_hex(32)
        payload = {
            "name": "web",
            "active": True,
            "events": self._events(ctx),
            "config": {
                "url": ctx.url,
                "content_type": "json",
                "secret": secret,
                "insecure_ssl": "0",
            },
        }
        hook = self._find(ctx)
        if hook is None:
            hook = self._request("POST", self.hooks_path, json=payload, hidden=[secret])
        else:
            del payload["name"]
            hook = self._request(
                "PATCH", f"{self.hooks_path}/{hook['id']}", json=payload, hidden=[secret]
            )
        if not ctx.secrets:
            ctx.set_secret(secret)
        return {"id": hook["id"], "hooks": self.hooks_path}

    def teardown(self, ctx: ProviderContext) -> None:
        hook_id = (ctx.state or {}).get("id")
        if hook_id is not None:
            self._request("DELETE", f"{self.hooks_path}/{hook_id}", missing_ok=True)

    def __repr__(self) -> str:
        where = (
            f"repository={self.repository!r}"
            if self.repository
            else f"organization={self.organization!r}"
        )
        return f"GitHubRegistration({where}, token_credential={self.token_credential!r})"


class StripeRegistration(ProviderRegistration):
    """A webhook endpoint made through Stripe's API (``/v1/webhook_endpoints``),
    authenticated with the secret key in ``secret_key_credential``. The signing secret
    Stripe returns when it makes the endpoint is stored as the source's credential."""

    provider = "Stripe"

    def __init__(
        self,
        *,
        secret_key_credential: str,
        events: Sequence[str] | None = None,
        api_url: str = "https://api.stripe.com",
        api_version: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(api_url, timeout)
        if not isinstance(secret_key_credential, str) or not secret_key_credential:
            raise ValueError("Stripe registration needs secret_key_credential= (a credential name)")
        self.secret_key_credential = secret_key_credential
        self.events = list(events) if events is not None else None
        self.api_version = api_version

    def _headers(self) -> tuple[dict[str, str], list[str]]:
        key = required_value(self.secret_key_credential, "the Stripe secret key")
        headers = {"Authorization": f"Bearer {key}"}
        if self.api_version:
            headers["Stripe-Version"] = self.api_version
        return headers, [key]

    def _events(self, ctx: ProviderContext) -> list[str]:
        return list(self.events if self.events is not None else ctx.events) or ["*"]

    def _endpoint(self, ctx: ProviderContext) -> dict[str, Any] | None:
        endpoint_id = (ctx.state or {}).get("id")
        if endpoint_id is None:
            return None
        found = self._request("GET", f"/v1/webhook_endpoints/{endpoint_id}", missing_ok=True)
        return None if found is None else dict(found)

    def check(self, ctx: ProviderContext) -> str:
        endpoint = self._endpoint(ctx)
        if endpoint is None or not ctx.secrets:  # Stripe shows a secret only once
            return "missing"
        matches = (
            endpoint.get("url") == ctx.url
            and sorted(endpoint.get("enabled_events") or []) == sorted(self._events(ctx))
            and endpoint.get("status", "enabled") == "enabled"
        )
        return "ok" if matches else "drifted"

    def setup(self, ctx: ProviderContext) -> dict[str, Any]:
        """Make a new endpoint (its secret becomes the credential's newest value), then
        delete the one kept before, so deliveries never stop in between."""
        form: dict[str, str | list[str]] = {
            "url": ctx.url,
            "description": ctx.label,
            "enabled_events[]": self._events(ctx),
            "metadata[pikku_source]": ctx.source.name,
        }
        endpoint = self._request("POST", "/v1/webhook_endpoints", data=form)
        secret = endpoint.get("secret") if isinstance(endpoint, dict) else None
        if not isinstance(secret, str) or not secret or "id" not in endpoint:
            raise ProviderError("Stripe made a webhook endpoint but returned no signing secret")
        ctx.set_secret(secret)
        old = (ctx.state or {}).get("id")
        if old is not None and old != endpoint["id"]:
            try:
                self._request("DELETE", f"/v1/webhook_endpoints/{old}", missing_ok=True)
            except ProviderError as exc:  # the new endpoint works: keep it, say so
                logger.warning("Stripe webhook endpoint %s was left behind: %s", old, exc)
        return {"id": endpoint["id"]}

    def teardown(self, ctx: ProviderContext) -> None:
        endpoint_id = (ctx.state or {}).get("id")
        if endpoint_id is not None:
            self._request("DELETE", f"/v1/webhook_endpoints/{endpoint_id}", missing_ok=True)

    def __repr__(self) -> str:
        return f"StripeRegistration(secret_key_credential={self.secret_key_credential!r})"
