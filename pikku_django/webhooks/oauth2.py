"""OAuth2 credentials: the authorize URL, the code exchange, and refreshed tokens.

An :class:`OAuth2Credential` names a provider's endpoints and this app's client. Its
tokens are stored as one value of the credential ``name``, encrypted as every
credential value is (:mod:`~pikku_django.webhooks.credentials`); each exchange or
refresh replaces it. :meth:`OAuth2Credential.access_token` refreshes the token with
the ``refresh_token`` grant before it expires. Requests go through ``httpx`` (the
``providers`` extra); a refused one raises :class:`OAuth2Error`, whose message never
holds the client secret, a code or a token.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

from django.db import transaction
from django.utils import timezone

from pikku_django.webhooks.credentials import credential_values, decrypt, set_credential
from pikku_django.webhooks.providers import (
    DEFAULT_TIMEOUT,
    ProviderError,
    load_httpx,
    redacted,
    required_value,
)

__all__ = [
    "OAuth2Credential",
    "OAuth2Error",
    "OAuth2Tokens",
    "new_state",
]

ClientAuth = Literal["basic", "post"]


class OAuth2Error(ProviderError):
    """The token endpoint refused or failed a request, or no usable token is stored.
    ``error`` is the provider's error code (``invalid_grant``...) when it gave one."""

    def __init__(self, message: str, error: str | None = None, status: int | None = None) -> None:
        super().__init__(message, status)
        self.error = error


def new_state() -> str:
    """A fresh unguessable ``state`` for an authorize URL (keep it, e.g. in the session,
    and compare it with the one the redirect brings back)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class OAuth2Tokens:
    """An access token, the refresh token that renews it, and when it expires."""

    access_token: str
    refresh_token: str | None = None
    expires_at: datetime | None = None
    token_type: str = "Bearer"  # noqa: S105 (a token type, not a password)
    scope: str | None = None

    def expires_within(self, seconds: float, now: datetime | None = None) -> bool:
        """Whether it expires within ``seconds`` (never, without an expiry)."""
        if self.expires_at is None:
            return False
        return self.expires_at <= (now or timezone.now()) + timedelta(seconds=seconds)

    def to_json(self) -> str:
        return json.dumps(
            {
                "access_token": self.access_token,
                "refresh_token": self.refresh_token,
                "expires_at": self.expires_at.isoformat() if self.expires_at else None,
                "token_type": self.token_type,
                "scope": self.scope,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> OAuth2Tokens:
        """Tokens as :meth:`to_json` wrote them; ValueError for any other text."""
        try:
            data = json.loads(text)
            expires = data.get("expires_at")
            return cls(
                access_token=str(data["access_token"]),
                refresh_token=data.get("refresh_token"),
                expires_at=datetime.fromisoformat(expires) if expires else None,
                token_type=data.get("token_type") or "Bearer",
                scope=data.get("scope"),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            raise ValueError("the value is not OAuth2 tokens as stored") from None

    def __repr__(self) -> str:  # tokens are secrets: never shown
        return f"OAuth2Tokens(expires_at={self.expires_at!r}, scope={self.scope!r})"


def _check_url(value: object, what: str) -> None:
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"OAuth2 {what} must be an http(s) URL, got {value!r}")


@dataclass(frozen=True)
class OAuth2Credential:
    """One provider's OAuth2 client, and the credential its tokens are stored under.

    ``client_secret_credential`` names the credential holding the client secret.
    ``scopes`` are joined by ``scope_separator`` (``" "`` as RFC 6749 says; some
    providers, Twist among them, want ``","``); with no scopes, no ``scope``
    parameter is sent at all. ``client_auth`` is how the client authenticates to the
    token endpoint: HTTP Basic (``"basic"``) or in the form (``"post"``). A token is
    refreshed when it expires within ``refresh_margin`` seconds.
    """

    name: str
    client_id: str
    client_secret_credential: str
    authorize_url: str
    token_url: str
    scopes: Sequence[str] = ()
    scope_separator: str = " "
    redirect_uri: str | None = None
    client_auth: ClientAuth = "basic"
    refresh_margin: float = 60.0
    timeout: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        for value, what in ((self.name, "name"), (self.client_id, "client_id")):
            if not isinstance(value, str) or not value:
                raise ValueError(f"OAuth2 {what} must be a non-empty str, got {value!r}")
        if not isinstance(self.client_secret_credential, str) or not self.client_secret_credential:
            raise ValueError("OAuth2 client_secret_credential must name a credential")
        _check_url(self.authorize_url, "authorize_url")
        _check_url(self.token_url, "token_url")
        if self.redirect_uri is not None:
            _check_url(self.redirect_uri, "redirect_uri")
        if not isinstance(self.scope_separator, str) or not self.scope_separator:
            raise ValueError(
                f"OAuth2 scope_separator must be a non-empty str, got {self.scope_separator!r}"
            )
        if isinstance(self.scopes, str):
            raise ValueError(f"OAuth2 scopes must be a list of scopes, not the str {self.scopes!r}")
        object.__setattr__(self, "scopes", tuple(self.scopes))
        self._check_scopes(self.scopes)
        if self.client_auth not in ("basic", "post"):
            raise ValueError(
                f"OAuth2 client_auth must be 'basic' or 'post', not {self.client_auth!r}"
            )
        if self.refresh_margin < 0:
            raise ValueError("OAuth2 refresh_margin must be 0 or more seconds")

    def _check_scopes(self, scopes: Sequence[str]) -> None:
        for scope in scopes:
            if not isinstance(scope, str) or not scope or self.scope_separator in scope:
                raise ValueError(
                    f"OAuth2 scope {scope!r} must be a non-empty str without the separator "
                    f"{self.scope_separator!r}"
                )

    def scope_text(self, scopes: Sequence[str] | None = None) -> str | None:
        """The scopes joined by ``scope_separator``; None when there are none."""
        chosen = self.scopes if scopes is None else tuple(scopes)
        self._check_scopes(chosen)
        return self.scope_separator.join(chosen) if chosen else None

    def authorization_url(
        self,
        state: str,
        *,
        redirect_uri: str | None = None,
        scopes: Sequence[str] | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> str:
        """Where to send the user to grant access: ``response_type=code``, the client
        id, ``state``, the redirect URI and the scopes (no ``scope`` when none), then
        ``extra`` (e.g. ``{"access_type": "offline"}``)."""
        if not isinstance(state, str) or not state:
            raise ValueError("An OAuth2 authorize URL needs a state (see new_state())")
        params = {"response_type": "code", "client_id": self.client_id, "state": state}
        uri = redirect_uri or self.redirect_uri
        if uri:
            params["redirect_uri"] = uri
        scope = self.scope_text(scopes)
        if scope is not None:
            params["scope"] = scope
        params.update(extra or {})
        joiner = "&" if urlsplit(self.authorize_url).query else "?"
        return f"{self.authorize_url}{joiner}{urlencode(params)}"

    def exchange_code(self, code: str, *, redirect_uri: str | None = None) -> OAuth2Tokens:
        """Trade the code the redirect brought for tokens, and store them."""
        if not isinstance(code, str) or not code:
            raise ValueError("An OAuth2 code must be a non-empty str")
        form = {"grant_type": "authorization_code", "code": code}
        uri = redirect_uri or self.redirect_uri
        if uri:
            form["redirect_uri"] = uri
        tokens = self._token_request(form, hidden=[code], previous=None)
        self.store(tokens)
        return tokens

    def tokens(self) -> OAuth2Tokens | None:
        """The stored tokens (the newest value), or None before any exchange."""
        values = credential_values(self.name)
        return self._decoded(values[0]) if values else None

    def _decoded(self, text: str) -> OAuth2Tokens:
        try:
            return OAuth2Tokens.from_json(text)
        except ValueError:
            raise OAuth2Error(
                f"The value of credential {self.name!r} is not OAuth2 tokens: exchange a code "
                "to store them (retire a value set by hand)"
            ) from None

    def store(self, tokens: OAuth2Tokens) -> None:
        """Store ``tokens`` encrypted as the credential's only active value."""
        set_credential(self.name, tokens.to_json(), replace=True, validate=False)

    def access_token(self) -> str:
        """A usable access token: the stored one, refreshed first when it expires
        within ``refresh_margin`` seconds."""
        tokens = self.tokens()
        if tokens is None:
            raise OAuth2Error(f"No tokens are stored for {self.name!r}: authorize first")
        if not tokens.expires_within(self.refresh_margin):
            return tokens.access_token
        return self._refresh(only_if_expiring=True).access_token

    def refresh(self) -> OAuth2Tokens:
        """Renew the access token with the ``refresh_token`` grant, and store it."""
        return self._refresh(only_if_expiring=False)

    def _refresh(self, *, only_if_expiring: bool) -> OAuth2Tokens:
        from pikku_django.models import CredentialValue

        with transaction.atomic():
            # One process refreshes at a time; the others then find the new token.
            row = (
                CredentialValue.objects.select_for_update()
                .filter(credential=self.name, active=True)
                .order_by("-created_at")
                .first()
            )
            if row is None:
                raise OAuth2Error(f"No tokens are stored for {self.name!r}: authorize first")
            current = self._decoded(decrypt(row.ciphertext, self.name))
            if only_if_expiring and not current.expires_within(self.refresh_margin):
                return current
            if not current.refresh_token:
                raise OAuth2Error(
                    f"The tokens of {self.name!r} have no refresh token: authorize again"
                )
            form = {"grant_type": "refresh_token", "refresh_token": current.refresh_token}
            scope = self.scope_text()
            if scope is not None:
                form["scope"] = scope
            hidden = [current.refresh_token, current.access_token]
            tokens = self._token_request(form, hidden=hidden, previous=current)
            self.store(tokens)
            return tokens

    def _token_request(
        self, form: dict[str, str], *, hidden: Sequence[str], previous: OAuth2Tokens | None
    ) -> OAuth2Tokens:
        httpx = load_httpx()
        try:
            secret = required_value(
                self.client_secret_credential, f"the client secret of {self.name}"
            )
        except ProviderError as exc:
            raise OAuth2Error(str(exc)) from None
        hide = [secret, *hidden]
        auth = None
        if self.client_auth == "basic":
            auth = httpx.BasicAuth(self.client_id, secret)
        else:
            form = {**form, "client_id": self.client_id, "client_secret": secret}
        what = f"the token endpoint of {self.name!r} ({form['grant_type']})"
        try:
            response = httpx.post(
                self.token_url,
                data=form,
                auth=auth,
                headers={"Accept": "application/json"},
                timeout=self.timeout,
            )
        except httpx.HTTPError as exc:
            raise OAuth2Error(
                redacted(f"{what} could not be reached: {type(exc).__name__}: {exc}", hide)
            ) from None
        data = _token_body(response)
        hide += [str(v) for k, v in data.items() if k.endswith("token") and isinstance(v, str)]
        if response.status_code >= 400 or "error" in data:
            error = data.get("error")
            reason = str(error or "no error code")
            if data.get("error_description"):
                reason += f": {str(data['error_description'])[:300]}"
            raise OAuth2Error(
                redacted(f"{what} answered {response.status_code}: {reason}", hide),
                error if isinstance(error, str) else None,
                response.status_code,
            )
        access = data.get("access_token")
        if not isinstance(access, str) or not access:
            raise OAuth2Error(f"{what} answered without an access_token")
        expires_in = data.get("expires_in")
        try:
            expires_at = (
                timezone.now() + timedelta(seconds=int(expires_in))
                if expires_in not in (None, "")
                else None
            )
        except (TypeError, ValueError):
            raise OAuth2Error(f"{what} answered an expires_in that is not a number") from None
        refresh = data.get("refresh_token") or (previous.refresh_token if previous else None)
        return OAuth2Tokens(
            access_token=access,
            refresh_token=str(refresh) if refresh else None,
            expires_at=expires_at,
            token_type=str(data.get("token_type") or "Bearer"),
            scope=str(data["scope"]) if data.get("scope") else None,
        )


def _token_body(response: Any) -> dict[str, Any]:
    """A token endpoint's answer: JSON, or a form (as some providers send by default)."""
    try:
        data = response.json()
    except ValueError:
        data = dict(parse_qsl(response.text))
    return data if isinstance(data, dict) else {}
