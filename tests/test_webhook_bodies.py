"""Webhook bodies parsed within bounds: any body a signed sender can send is stored or
refused with 400 and its reason, never a 500."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pikku_django.models import CredentialValue, TriggerSource, WebhookReceipt
from pikku_django.webhooks import (
    WebhookEvent,
    WebhookSource,
    credential_name,
    register_source,
    set_credential,
    start_workflow_on,
)
from pikku_django.webhooks import bodies as bodies_module
from pikku_django.webhooks.bodies import (
    MAX_JSON_DEPTH,
    BodyLimitError,
    check_json_text,
    json_depth,
    loads,
)
from pikku_django.webhooks.lifecycle import sync
from pikku_django.webhooks.presets import GitHub
from pikku_django.webhooks.sources import ReceiveContext, unregister_source
from pikku_django.workflows.api import reset_engine
from tests.conftest import database_alias, on_databases

SECRET = "a body-bounds secret"
LIMIT = MAX_JSON_DEPTH
assert LIMIT == 29


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    """The workflow engine follows each test's PIKKU, and none outlives it."""
    reset_engine()
    yield
    reset_engine()


# --- the depth scan ------------------------------------------------------------------------

tricky_text = st.text(alphabet='[]{}"\\,:ab\u00e9\u2028\U0001f600', max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=30,
)


def true_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(true_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(true_depth, value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(value=json_values, ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_the_depth_scan_counts_what_the_parser_would_nest(
    value: Any, ascii_only: bool, indent: int | None
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert json_depth(text) == json_depth(text.encode()) == true_depth(value)


def test_the_bounds_refuse_with_their_reason() -> None:
    assert json_depth(json.dumps(loads("[" * LIMIT + "]" * LIMIT))) == LIMIT
    with pytest.raises(BodyLimitError, match="deeper than 29 levels"):
        loads("[" * (LIMIT + 1) + "]" * (LIMIT + 1))
    with pytest.raises(BodyLimitError, match="deeper than 29 levels"):
        loads("[" * 100_000)  # would raise RecursionError in json.loads
    with pytest.raises(BodyLimitError, match="deeper than 29 levels"):
        loads('{"a":' * 50_000)
    with pytest.raises(BodyLimitError, match="larger than 10 bytes"):
        check_json_text("[1, 2, 3, 4]", max_size=10)
    assert loads(json.dumps(["[" * 40])) == ["[" * 40]  # brackets in strings do not count
    with pytest.raises(ValueError, match="NaN is not JSON"):
        loads("[NaN]")
    assert not isinstance(_raised(lambda: loads("[1,")), BodyLimitError)


def _raised(fn: Any) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:
        return exc
    return None


def test_the_context_and_events_apply_the_bounds(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bodies_module, "MAX_JSON_DEPTH", 3)
    settings.PIKKU = {"WEBHOOK_MAX_BODY": 100}
    ctx = ReceiveContext(source=None, body=b"[[[[1]]]]", verified=True)  # type: ignore[arg-type]
    with pytest.raises(BodyLimitError, match="deeper than 3"):
        ctx.json()
    with pytest.raises(BodyLimitError, match="deeper than 3"):
        ctx.body_event("doc")
    with pytest.raises(BodyLimitError, match="larger than 100 bytes"):
        WebhookEvent.from_json("doc", "[" + "1," * 60 + "1]")
    shallow = ReceiveContext(source=None, body=b"[[[1]]]", verified=True)  # type: ignore[arg-type]
    assert shallow.json() == [[[1]]]
    settings.PIKKU = {"WEBHOOK_MAX_BODY": "1 MB"}
    with pytest.raises(Exception, match="WEBHOOK_MAX_BODY"):
        loads("[]")


# --- through the view ----------------------------------------------------------------------


def receive_parsed(request: Any, ctx: Any) -> Any:
    return [WebhookEvent("doc", data=ctx.json())]


def receive_as_text(request: Any, ctx: Any) -> Any:
    return [ctx.body_event("doc")]


ROUTES = {"parsed": "/pikku/webhooks/wh-bounds-parsed/", "text": "/pikku/webhooks/wh-bounds-text/"}
_deliveries = itertools.count()


@pytest.fixture
def bounded_sources() -> Iterator[None]:
    declared = [
        WebhookSource(
            name="wh-bounds-parsed", verify=GitHub(), receive=receive_parsed, events={"doc": None}
        ),
        WebhookSource(
            name="wh-bounds-text", verify=GitHub(), receive=receive_as_text, events={"doc": None}
        ),
    ]
    for source in declared:
        register_source(source)
        start_workflow_on(f"{source.name}:doc", "wh.deploy")
    try:
        yield
    finally:
        for source in declared:
            unregister_source(source.name)


def enable() -> None:
    """Both sources switched on (their switches on the default database)."""
    sync()
    TriggerSource.objects.filter(name__startswith="wh-bounds-").update(enabled=True)
    for name in ("wh-bounds-parsed", "wh-bounds-text"):
        if not CredentialValue.objects.filter(credential=credential_name(name)).exists():
            set_credential(credential_name(name), SECRET)


def post(client: Client, how: str, body: bytes) -> Any:
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return client.post(
        ROUTES[how],
        body,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=signature,
        HTTP_X_GITHUB_DELIVERY=f"d-{next(_deliveries)}",
    )


def nested(depth: int) -> bytes:
    return ("[" * depth + "]" * depth).encode()


bodies = st.one_of(
    st.binary(min_size=1, max_size=300),  # a body without one is a handshake
    json_values.map(lambda v: json.dumps(v).encode()),
    st.integers(min_value=1, max_value=3000).map(lambda n: b"[" * n),
    st.integers(min_value=1, max_value=200).map(nested),
    st.integers(min_value=1, max_value=200).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(min_value=1, max_value=6000).map(lambda n: b"9" * n),
    st.sampled_from([b"NaN", b"[Infinity]", b'"\\ud800"', b'"\\u0000"', b"\xff\xfe[]", b"[1,]"]),
)


@pytest.mark.django_db(transaction=True)
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies, how=st.sampled_from(sorted(ROUTES)))
def test_any_signed_body_is_stored_or_refused_with_400(
    bounded_sources: None, body: bytes, how: str
) -> None:
    enable()
    answer = post(Client(), how, body)
    assert answer.status_code in (200, 400), answer.content
    if json_depth(body) > LIMIT:
        assert answer.status_code == 400
        assert answer.json() == {
            "error": f"the body could not be read: the JSON nests deeper than {LIMIT} levels"
        }
    if answer.status_code == 200:
        assert answer.json()["received"] in (0, 1)


@on_databases("sqlite", "postgres", "mariadb")
def test_deep_bodies_on_each_database(vendor: str, bounded_sources: None, settings: Any) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    enable()
    client = Client()
    for how in sorted(ROUTES):
        answer = post(client, how, b"[" * 100_000)  # a RecursionError before the bounds
        assert answer.status_code == 400
        assert "nests deeper than 29 levels" in answer.json()["error"]
        answer = post(client, how, nested(LIMIT + 1))
        assert answer.status_code == 400
        answer = post(client, how, nested(8))
        assert answer.json() == {"received": 1}, answer.content
        answer = post(client, how, nested(LIMIT))  # at the bound: every database stores it
        assert answer.json() == {"received": 1}, answer.content
    assert WebhookReceipt.objects.using(alias).filter(source__startswith="wh-bounds-").count() == 4


@on_databases("mariadb")
def test_json_too_deep_for_mariadb_is_refused_by_it_not_a_503(
    vendor: str, bounded_sources: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    monkeypatch.setattr(bodies_module, "MAX_JSON_DEPTH", 40)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    enable()
    client = Client()
    # Parsed data the database refuses is dropped (as a NUL in PostgreSQL's JSON is);
    # unparsed text it refuses is a body that could not be read.
    assert post(client, "parsed", nested(35)).json() == {"received": 0}
    assert post(client, "text", nested(35)).status_code == 400
    assert not WebhookReceipt.objects.using(alias).filter(source__startswith="wh-bounds-").exists()


# --- the reason a body is refused ----------------------------------------------------------

READ = "the body could not be read: "


def json_error(body: bytes) -> str:
    """What ``json.loads`` says of ``body``, as this Python words it."""
    try:
        json.loads(body)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    raise AssertionError("the body is JSON")


TRAILING_COMMA = b'{"a": 1,}'
#: Bodies the docs promise a reason for, and that reason (too deep: above).
REFUSED = {
    "nan": (b'{"ref": NaN}', "NaN is not JSON (JSON has no NaN or Infinity)"),
    "infinity": (b"[1, -Infinity]", "-Infinity is not JSON (JSON has no NaN or Infinity)"),
    "plain-text": (b"hello, this is not JSON", "the body is plain text, not JSON"),
    "form": (
        b"payload=%7B%22a%22%3A1%7D&token=abc",
        "the body is form-encoded (application/x-www-form-urlencoded), not JSON",
    ),
    "big-integer": (
        b'{"n": ' + b"9" * 4400 + b"}",
        "the JSON holds an integer of 4400 digits, more than the 4300 Python reads",
    ),
    "big-float": (b"[1.5e400]", "the JSON holds the number 1.5e400, beyond the range of a float"),
    "not-utf8": (b'{"a": "\xff"}', "the body is not UTF-8 text (invalid start byte at byte 7)"),
    # json's own words, which differ between Python versions.
    "syntax": (TRAILING_COMMA, "the body is not JSON: " + json_error(TRAILING_COMMA)),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", sorted(ROUTES))
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_body_is_answered_and_logged_with_its_reason(
    bounded_sources: None, how: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    body, reason = REFUSED[case]
    enable()
    with caplog.at_level("INFO", logger="pikku_django.webhooks"):
        answer = post(Client(), how, body)
    assert answer.status_code == 400
    assert answer.json() == {"error": READ + reason}
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("pikku_django.webhooks")]
    assert any(reason in line for line in logged), logged
    assert not any("refused its data" in line for line in logged), logged
    assert not WebhookReceipt.objects.filter(source__startswith="wh-bounds-").exists()


@on_databases("sqlite", "postgres", "mariadb")
def test_a_body_no_worker_could_read_back_is_refused_at_intake_on_each_database(
    vendor: str, bounded_sources: None, settings: Any
) -> None:
    """Stored unparsed, such a body would stop every worker's look at waiting events."""
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    enable()
    client = Client()
    for case in ("big-integer", "big-float", "nan", "form"):
        body, reason = REFUSED[case]
        answer = post(client, "text", body)
        assert answer.json() == {"error": READ + reason}, case
    assert post(client, "text", b'{"n": ' + b"9" * 4300 + b"}").json() == {"received": 1}
    assert WebhookReceipt.objects.using(alias).filter(source__startswith="wh-bounds-").count() == 1


def receive_with_json_loads(request: Any, ctx: Any) -> Any:
    return [WebhookEvent("doc", data=json.loads(ctx.body))]


@pytest.mark.django_db(transaction=True)
def test_a_receive_that_parses_the_body_itself_is_answered_with_the_reason() -> None:
    source = WebhookSource(
        name="wh-bounds-own", verify=GitHub(), receive=receive_with_json_loads, events={"doc": None}
    )
    register_source(source)
    try:
        sync()
        TriggerSource.objects.filter(name="wh-bounds-own").update(enabled=True)
        set_credential(credential_name("wh-bounds-own"), SECRET)
        body = b"a=1&b=2"
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        answer = Client().post(
            "/pikku/webhooks/wh-bounds-own/",
            body,
            content_type="application/x-www-form-urlencoded",
            HTTP_X_HUB_SIGNATURE_256=signature,
        )
    finally:
        unregister_source(source.name)
    assert answer.status_code == 400
    assert answer.json() == {"error": READ + REFUSED["form"][1]}
