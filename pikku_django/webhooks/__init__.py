"""Webhook sources: declared in code, verified before anything runs, dispatched durably."""

from pikku_django.webhooks.bodies import BodyError, BodyLimitError, BodyNotJSONError
from pikku_django.webhooks.credentials import credential_values, set_credential
from pikku_django.webhooks.secret_checks import InvalidSecretError
from pikku_django.webhooks.sources import (
    ProviderContext,
    ReceiveContext,
    Received,
    WebhookEvent,
    WebhookSource,
    credential_name,
    on_webhook,
    register_source,
    send_event_on,
    start_workflow_on,
    webhook_source,
)

__all__ = [
    "BodyError",
    "BodyLimitError",
    "BodyNotJSONError",
    "InvalidSecretError",
    "ProviderContext",
    "ReceiveContext",
    "Received",
    "WebhookEvent",
    "WebhookSource",
    "credential_name",
    "credential_values",
    "on_webhook",
    "register_source",
    "send_event_on",
    "set_credential",
    "start_workflow_on",
    "webhook_source",
]
