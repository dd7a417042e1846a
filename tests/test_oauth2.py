"""OAuth2 credentials against a local token endpoint: the authorize URL, the code
exchange and the refresh, with tokens stored encrypted and errors without secrets."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from pikku_django.models import CredentialValue
from pikku_django.webhooks import set_credential
from pikku_django.webhooks.oauth2 import OAuth2Credential, OAuth2Error, OAuth2Tokens, new_state
from tests import provider_api_fake
from tests.provider_api_fake import CLIENT_ID, CLIENT_SECRET, GOOD_CODE, ProviderAPI

pytestmark = pytest.mark.django_db

AUTHORIZE = "https://provider.example/oauth/authorize"
REDIRECT = "https://app.example/oauth/callback"


@pytest.fixture
def api() -> Iterator[ProviderAPI]:
    yield from provider_api_fake.serve()


def credential(api_url: str = "https://provider.example", **options: object) -> OAuth2Credential:
    set_credential("twistClientSecret", CLIENT_SECRET, replace=True)
    defaults: dict[str, object] = {
        "name": "twistOAuth2",
        "client_id": CLIENT_ID,
        "client_secret_credential": "twistClientSecret",
        "authorize_url": AUTHORIZE,
        "token_url": api_url + "/oauth/token",
        "redirect_uri": REDIRECT,
    }
    return OAuth2Credential(**{**defaults, **options})  # type: ignore[arg-type]


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query, keep_blank_values=True)


def test_scopes_are_joined_by_the_providers_separator() -> None:
    twist = credential(scopes=["user:read", "channels:read"], scope_separator=",")
    assert query(twist.authorization_url("s-1"))["scope"] == ["user:read,channels:read"]
    spaced = credential(scopes=["openid", "email"])
    url = spaced.authorization_url("s-2")
    assert query(url)["scope"] == ["openid email"]
    assert "scope=openid+email" in url


def test_no_scope_parameter_without_scopes() -> None:
    url = credential().authorization_url("s-1")
    assert "scope" not in query(url)
    assert "scope" not in url
    assert query(url) == {
        "response_type": ["code"],
        "client_id": [CLIENT_ID],
        "state": ["s-1"],
        "redirect_uri": [REDIRECT],
    }


def test_the_authorize_url_carries_the_state_and_extra_parameters() -> None:
    state = new_state()
    assert len(state) >= 40
    assert state != new_state()
    url = credential(authorize_url=AUTHORIZE + "?tenant=x").authorization_url(
        state, extra={"access_type": "offline"}
    )
    assert url.startswith(AUTHORIZE + "?tenant=x&")
    assert query(url)["state"] == [state]
    assert query(url)["access_type"] == ["offline"]
    with pytest.raises(ValueError, match="needs a state"):
        credential().authorization_url("")


def test_declarations_are_checked() -> None:
    with pytest.raises(ValueError, match="a list of scopes, not the str"):
        credential(scopes="read write")
    with pytest.raises(ValueError, match="without the separator ','"):
        credential(scopes=["a,b"], scope_separator=",")
    with pytest.raises(ValueError, match="token_url must be an http"):
        credential(token_url="ftp://x")
    with pytest.raises(ValueError, match="client_auth"):
        credential(client_auth="header")


@pytest.mark.parametrize("client_auth", ["basic", "post"])
def test_the_code_exchange_stores_the_tokens_encrypted(api: ProviderAPI, client_auth: str) -> None:
    oauth = credential(api.url, client_auth=client_auth, scopes=["read"])
    before = timezone.now()
    tokens = oauth.exchange_code(GOOD_CODE)
    [request] = api.requests
    form = {k: v[0] for k, v in request.form().items()}
    assert form["grant_type"] == "authorization_code"
    assert (form["code"], form["redirect_uri"]) == (GOOD_CODE, REDIRECT)
    if client_auth == "basic":
        expected = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        assert request.headers["authorization"] == f"Basic {expected}"
        assert "client_secret" not in form
    else:
        assert (form["client_id"], form["client_secret"]) == (CLIENT_ID, CLIENT_SECRET)
    assert tokens.access_token.startswith("at-")
    assert tokens.refresh_token in api.refresh_tokens
    assert tokens.expires_at is not None
    assert before + timedelta(seconds=3600) <= tokens.expires_at
    assert oauth.tokens() == tokens
    [stored] = CredentialValue.objects.filter(credential="twistOAuth2", active=True)
    assert tokens.access_token not in stored.ciphertext
    assert tokens.refresh_token not in stored.ciphertext
    assert tokens.access_token not in repr(tokens)


def test_an_expiring_token_is_refreshed_and_the_new_tokens_stored(api: ProviderAPI) -> None:
    oauth = credential(api.url, scopes=["user:read", "channels:read"], scope_separator=",")
    first = oauth.exchange_code(GOOD_CODE)
    assert oauth.access_token() == first.access_token  # an hour left: no request
    assert len(api.requests) == 1

    oauth.store(
        OAuth2Tokens(
            first.access_token, first.refresh_token, timezone.now() + timedelta(seconds=30)
        )
    )
    fresh = oauth.access_token()  # within the 60-second margin: refreshed first
    assert fresh != first.access_token
    refresh = api.requests[-1].form()
    assert refresh["grant_type"] == ["refresh_token"]
    assert refresh["refresh_token"] == [first.refresh_token]
    assert refresh["scope"] == ["user:read,channels:read"]
    stored = oauth.tokens()
    assert stored is not None
    assert stored.access_token == fresh
    assert stored.refresh_token not in (None, first.refresh_token)  # the rotated one
    assert CredentialValue.objects.filter(credential="twistOAuth2", active=True).count() == 1
    assert oauth.access_token() == fresh
    assert len(api.requests) == 2


def test_a_refresh_keeps_the_refresh_token_when_none_is_returned(api: ProviderAPI) -> None:
    oauth = credential(api.url)
    first = oauth.exchange_code(GOOD_CODE)
    refreshed = oauth.refresh()
    assert "scope" not in api.requests[-1].form()  # no scopes: no scope parameter
    assert refreshed.refresh_token != first.refresh_token
    assert oauth.tokens() == refreshed


def test_errors_name_the_grant_and_never_a_secret(api: ProviderAPI) -> None:
    oauth = credential(api.url)
    with pytest.raises(OAuth2Error) as caught:
        oauth.exchange_code("code-bad-0123456789")
    message = str(caught.value)
    assert message.startswith(
        "the token endpoint of 'twistOAuth2' (authorization_code) answered 400: invalid_grant"
    )
    assert "code-bad-0123456789" not in message
    assert (caught.value.error, caught.value.status) == ("invalid_grant", 400)

    oauth.store(OAuth2Tokens("at-old-0123456789", "rt-revoked-0123456789"))
    with pytest.raises(OAuth2Error, match=r"\(refresh_token\) answered 400") as caught:
        oauth.refresh()
    assert "rt-revoked-0123456789" not in str(caught.value)

    set_credential("twistClientSecret", "a-wrong-client-secret", replace=True)
    wrong = OAuth2Credential(**{**oauth.__dict__, "client_auth": "post"})
    with pytest.raises(OAuth2Error, match="invalid_client") as caught:
        wrong.exchange_code(GOOD_CODE)
    assert "a-wrong-client-secret" not in str(caught.value)


def test_without_tokens_or_a_refresh_token_it_says_what_to_do(api: ProviderAPI) -> None:
    oauth = credential(api.url)
    with pytest.raises(OAuth2Error, match="No tokens are stored for 'twistOAuth2'"):
        oauth.access_token()
    oauth.store(OAuth2Tokens("at-1", None, timezone.now()))
    with pytest.raises(OAuth2Error, match="no refresh token: authorize again"):
        oauth.access_token()
    assert api.requests == []


def test_a_value_that_is_not_tokens_is_named(api: ProviderAPI) -> None:
    oauth = credential(api.url)
    set_credential("twistOAuth2", "an-access-token-set-by-hand")
    with pytest.raises(OAuth2Error, match="credential 'twistOAuth2' is not OAuth2 tokens"):
        oauth.access_token()
    with pytest.raises(OAuth2Error, match="is not OAuth2 tokens"):
        oauth.refresh()
    assert api.requests == []
