"""The trigger source page's Enable and Disable buttons, their confirmation and log."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import reverse

from pikku_django.models import TriggerSource
from pikku_django.webhooks.lifecycle import sync
from tests import webhook_provider_defs as defs
from tests.webhook_provider_defs import FakeProvider


def client_for(django_user_model: Any, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(
        f"op-{uuid.uuid4().hex[:8]}", password="pw", is_staff=True
    )
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def entries_for(obj: Any) -> list[LogEntry]:
    ct = ContentType.objects.get_for_model(type(obj))
    return list(
        LogEntry.objects.filter(content_type=ct, object_id=str(obj.pk)).order_by("action_time")
    )


# -- the source page's buttons -----------------------------------------------------------


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    monkeypatch.delenv("PIKKU_DEV_WEBHOOK_URL", raising=False)
    sync()
    yield from defs.running_provider()


def switch(name: str, way: str) -> str:
    return reverse("admin:pikku_django_triggersource_switch", args=[name, way])


@pytest.mark.django_db(transaction=True)
def test_enable_and_disable_buttons_confirm_switch_and_log(
    admin_client: Client, provider: FakeProvider
) -> None:
    source_page = reverse("admin:pikku_django_triggersource_change", args=["prov-hooks"])
    page = text(admin_client.get(source_page))
    assert f'href="{switch("prov-hooks", "enable")}"' in page
    # No address is recorded: the confirmation asks for one, offering this site's.
    form = text(admin_client.get(switch("prov-hooks", "enable")))
    assert 'value="http://testserver/pikku/"' in form
    bad = text(admin_client.post(switch("prov-hooks", "enable"), {"pikku_base_url": "ftp://x"}))
    assert "is not an http(s) URL" in bad
    assert TriggerSource.objects.get(name="prov-hooks").enabled is False
    done = admin_client.post(
        switch("prov-hooks", "enable"), {"pikku_base_url": "http://testserver/pikku/"}
    )
    assert done.status_code == 302
    row = TriggerSource.objects.get(name="prov-hooks")
    assert row.enabled is True
    assert len(provider.registrations) == 1
    assert f'href="{switch("prov-hooks", "disable")}"' in text(admin_client.get(source_page))
    assert admin_client.post(switch("prov-hooks", "disable")).status_code == 302
    assert TriggerSource.objects.get(name="prov-hooks").enabled is False
    assert provider.registrations == {}
    messages = [e.change_message for e in entries_for(row)]
    assert messages == [
        "Enabled from the admin; provider step: ok (registered (missing)) "
        "(base URL http://testserver/pikku/)",
        "Disabled from the admin; provider step: disabled (removed from the provider)",
    ]


@pytest.mark.django_db(transaction=True)
def test_source_buttons_need_the_change_permission(
    django_user_model: Any, provider: FakeProvider
) -> None:
    client = client_for(django_user_model, "view_triggersource")
    page = text(client.get(reverse("admin:pikku_django_triggersource_change", args=["prov-hooks"])))
    assert "pikku-switch-" not in page
    assert client.get(switch("prov-hooks", "enable")).status_code == 403
    post = client.post(switch("prov-hooks", "enable"), {"pikku_base_url": "http://x/"})
    assert post.status_code == 403
    assert TriggerSource.objects.get(name="prov-hooks").enabled is False
    assert provider.registrations == {}
