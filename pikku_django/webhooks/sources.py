"""Webhook sources declared in code, and the handlers bound to their events.

Declare them in an installed app's ``webhooks.py``; pikku_django imports it at start-up.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from pikku_django.webhooks.bodies import check_json_text, loads, utf8_text

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")

_lock = threading.RLock()
_sources: dict[str, WebhookSource] = {}
_handlers: dict[str, Handler] = {}


def credential_name(source: str) -> str:
    """A source's default credential name.

    ``microsoft-outlook`` -> ``microsoftOutlookWebhookSecret``.
    """
    parts = [p for p in re.split(r"[^0-9A-Za-z]+", source) if p]
    if not parts:
        return "webhookSecret"
    head, *rest = parts
    return (
        head[0].lower() + head[1:] + "".join(p[0].upper() + p[1:] for p in rest) + ("WebhookSecret")
    )


_UNREAD = object()


class WebhookEvent:
    """One event a source's ``receive`` found in a request: ``name``, the provider's
    ``id`` and ``data``.

    An event made by :meth:`ReceiveContext.body_event` holds the body's JSON text and
    parses it only when ``data`` is read (``ValueError`` if it is not JSON); the text
    is stored as it came, and the database checks that it is JSON. Such text is
    bounded as :mod:`~pikku_django.webhooks.bodies` says (``BodyLimitError``).
    """

    __slots__ = ("_data", "_json", "id", "name")

    def __init__(self, name: str, id: str | None = None, data: Any = None) -> None:
        self.name = name
        self.id = id
        self._data = data
        #: The JSON text of ``data``, when it came from the request unparsed.
        self._json: str | None = None

    @classmethod
    def from_json(cls, name: str, text: str, id: str | None = None) -> WebhookEvent:
        """An event whose data is the JSON ``text``, parsed when first read
        (:class:`~pikku_django.webhooks.bodies.BodyLimitError` at once when the text
        is larger or deeper than the bounds)."""
        check_json_text(text)
        return cls._unread(name, text, id)

    @classmethod
    def _unread(cls, name: str, text: str, id: str | None) -> WebhookEvent:
        event = cls(name, id=id, data=_UNREAD)
        event._json = text
        return event

    @property
    def data(self) -> Any:
        if self._data is _UNREAD:
            self._data = loads(self._json or "")
        return self._data

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WebhookEvent):
            return NotImplemented
        return (self.name, self.id, self.data) == (other.name, other.id, other.data)

    def __hash__(self) -> int:
        return hash((self.name, self.id, self.data))

    def __repr__(self) -> str:
        data = "<unread JSON>" if self._data is _UNREAD else repr(self._data)
        return f"WebhookEvent(name={self.name!r}, id={self.id!r}, data={data})"


def event_json(event: WebhookEvent) -> tuple[str, bool] | None:
    """The JSON text an event's data came as, and whether it was parsed since (so is
    known to be JSON); None for an event made with a value."""
    if event._json is None:
        return None
    return event._json, event._data is not _UNREAD


@dataclass(frozen=True)
class Received:
    """What ``receive`` returns: events, and optionally the answer to send instead."""

    events: Sequence[WebhookEvent] = ()
    response: HttpResponse | None = None


@dataclass
class ReceiveContext:
    """What ``receive`` is given besides the request."""

    source: WebhookSource
    body: bytes
    verified: bool
    delivery_id: str | None = None

    def json(self) -> Any:
        """The body parsed as JSON: a ``BodyNotJSONError`` when it is not JSON, a
        ``BodyLimitError`` when it is out of bounds (both ``ValueError``, saying why)."""
        return loads(self.body)

    def body_event(self, name: str, id: str | None = None) -> WebhookEvent:
        """One event whose data is the whole JSON body, stored as it came rather than
        parsed and encoded again (a body that is not JSON, or is out of bounds, is
        answered 400 with the reason)."""
        check_json_text(self.body)
        return WebhookEvent._unread(name, utf8_text(self.body), id)


@dataclass
class ProviderContext:
    """What ``check``, ``setup`` and ``teardown`` are given."""

    source: WebhookSource
    url: str
    label: str
    events: list[str]
    state: dict[str, Any] | None
    secrets: list[str] = field(default_factory=list)
    new_secret: str | None = None

    def set_secret(self, value: str) -> None:
        """Record a signing secret the provider issued (stored in the credential)."""
        self.new_secret = value


EventSchema = Callable[[Any], Any] | None


@dataclass
class WebhookSource:
    """A source of signed webhook requests.

    ``verify`` is a verifier from :mod:`pikku_django.webhooks.verify` (or a preset);
    ``receive(request, ctx)`` returns a :class:`Received`, a list of
    :class:`WebhookEvent`, or an ``HttpResponse`` (a handshake answer). ``events``
    maps each event it emits to an optional schema: a callable that returns a
    falsy value or raises ValueError for data it refuses.
    """

    name: str
    receive: Callable[[HttpRequest, ReceiveContext], Any]
    verify: Any = None
    events: Mapping[str, EventSchema] = field(default_factory=dict)
    route: str | None = None
    credential: str | None = None
    check: Callable[[ProviderContext], str] | None = None
    setup: Callable[[ProviderContext], dict[str, Any] | None] | None = None
    teardown: Callable[[ProviderContext], None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ImproperlyConfigured(
                f"A webhook source name is 1-100 of a-z, 0-9, '-' and '_', got {self.name!r}"
            )
        if self.route is None:
            self.route = f"webhooks/{self.name}/"
        if self.route.startswith("/"):
            self.route = self.route.lstrip("/")
        if self.verify is not None and self.credential is None:
            self.credential = credential_name(self.name)
        if not callable(self.receive):
            raise ImproperlyConfigured(f"Webhook source {self.name!r} needs a receive callable")
        registration = getattr(self.verify, "registration", None)
        if registration is not None:
            if self.check is not None or self.setup is not None or self.teardown is not None:
                raise ImproperlyConfigured(
                    f"Webhook source {self.name!r} registers through {self.verify!r}: "
                    "declare no check, setup or teardown of its own"
                )
            self.check = registration.check
            self.setup = registration.setup
            self.teardown = registration.teardown

    @property
    def event_keys(self) -> list[str]:
        return [f"{self.name}:{event}" for event in self.events]


@dataclass(frozen=True)
class Handler:
    """What runs for one ``<source>:<event>``: a function (by step name), a workflow,
    or an event sent to a waiting run (``send``)."""

    key: str
    step: str | None = None
    workflow: str | None = None
    send: EventBinding | None = None


@dataclass(frozen=True)
class EventBinding:
    """Send each event, as event ``event``, to the run of ``workflow`` whose
    idempotency key ``run_key(data)`` returns, in the transaction that stores its receipt."""

    workflow: str
    event: str
    run_key: Callable[[Any], str]


def register_source(source: WebhookSource) -> WebhookSource:
    """Declare ``source``; a second source with its name or route is an error."""
    with _lock:
        for other in _sources.values():
            if other.name == source.name and other is not source:
                if _same_declaration(other, source):
                    break
                raise ImproperlyConfigured(f"Two webhook sources are named {source.name!r}")
            if other.route == source.route and other.name != source.name:
                raise ImproperlyConfigured(
                    f"Webhook sources {other.name!r} and {source.name!r} share the route "
                    f"{source.route!r}"
                )
        _sources[source.name] = source
    return source


def _same_declaration(a: WebhookSource, b: WebhookSource) -> bool:
    def ident(fn: Any) -> str:
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', fn)}"

    return ident(a.receive) == ident(b.receive)


def webhook_source(**options: Any) -> Callable[[Callable[..., Any]], WebhookSource]:
    """Declare a source whose ``receive`` is the decorated function."""

    def register(receive: Callable[..., Any]) -> WebhookSource:
        return register_source(WebhookSource(receive=receive, **options))

    return register


def on_webhook(key: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the decorated ``fn(event)`` on a worker for each ``<source>:<event>``."""
    from pikku_django.workflows.registry import step

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        step_name = f"webhook:{key}:{getattr(fn, '__qualname__', 'handler')}"
        step(name=step_name[:200])(fn)
        _bind(Handler(key=key, step=step_name[:200]))
        return fn

    _check_key(key)
    return register


def start_workflow_on(key: str, workflow: str | Callable[..., Any]) -> None:
    """Start ``workflow`` with each ``<source>:<event>`` event as its input."""
    _check_key(key)
    name = getattr(workflow, "__pikku_workflow__", workflow)
    if not isinstance(name, str):
        raise ImproperlyConfigured(f"{workflow!r} is not a registered workflow")
    _bind(Handler(key=key, workflow=name))


def send_event_on(
    key: str, workflow: str | Callable[..., Any], *, event: str, run_key: Callable[[Any], str]
) -> None:
    """Send each ``<source>:<event>`` event to the run of ``workflow`` started with the
    idempotency key ``run_key(event_data)``, as the workflow event ``event`` (its data
    the webhook event's data, its event id the provider's), in the transaction that
    stores the webhook's receipt: both are stored, or neither."""
    _check_key(key)
    name = getattr(workflow, "__pikku_workflow__", workflow)
    if not isinstance(name, str):
        raise ImproperlyConfigured(f"{workflow!r} is not a registered workflow")
    if not callable(run_key):
        raise ImproperlyConfigured(f"send_event_on run_key= must be callable, not {run_key!r}")
    if not isinstance(event, str) or not event or "#" in event:
        raise ImproperlyConfigured(f"send_event_on event= must be an event name, not {event!r}")
    _bind(Handler(key=key, workflow=name, send=EventBinding(name, event, run_key)))


def _check_key(key: object) -> None:
    if not isinstance(key, str) or key.count(":") != 1 or not all(key.split(":")):
        raise ImproperlyConfigured(f"Bind handlers to '<source>:<event>', not {key!r}")


def _bind(handler: Handler) -> None:
    with _lock:
        existing = _handlers.get(handler.key)
        if existing is not None and existing != handler:
            raise ImproperlyConfigured(f"{handler.key!r} already has a handler")
        _handlers[handler.key] = handler


def get_source(name: str) -> WebhookSource | None:
    return _sources.get(name)


def source_for_route(route: str) -> WebhookSource | None:
    for source in _sources.values():
        if source.route == route:
            return source
    return None


def sources() -> list[WebhookSource]:
    return sorted(_sources.values(), key=lambda s: s.name)


def handler_for(source: str, event: str) -> Handler | None:
    return _handlers.get(f"{source}:{event}")


def unregister_source(name: str) -> None:
    """Forget a declared source and its handlers (for tests)."""
    with _lock:
        _sources.pop(name, None)
        for key in [k for k in _handlers if k.startswith(f"{name}:")]:
            del _handlers[key]


def autodiscover() -> None:
    """Import ``webhooks`` from every installed app."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("webhooks")
