"""The read-only lease admin."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.factories import LeaseFactory

pytestmark = pytest.mark.django_db


def test_changelist_shows_live_and_released_leases(admin_client: Any) -> None:
    LeaseFactory(key="nightly-report", holder="worker-1", token=7)
    LeaseFactory(key="old-job", holder="worker-2", token=3, expires_at=0)
    response = admin_client.get(reverse("admin:pikku_django_lease_changelist"))
    assert response.status_code == 200
    body = response.content.decode()
    assert "nightly-report" in body
    assert "worker-1" in body
    assert "released" in body
    assert 'alt="True"' in body
    assert 'alt="False"' in body


@pytest.mark.parametrize(
    ("live", "shown", "hidden"), [("yes", "a-live", "b-gone"), ("no", "b-gone", "a-live")]
)
def test_live_filter(admin_client: Any, live: str, shown: str, hidden: str) -> None:
    LeaseFactory(key="a-live")
    LeaseFactory(key="b-gone", expires_at=1)
    response = admin_client.get(reverse("admin:pikku_django_lease_changelist"), {"live": live})
    body = response.content.decode()
    assert shown in body
    assert hidden not in body


def test_leases_cannot_be_added_changed_or_deleted(admin_client: Any) -> None:
    lease = LeaseFactory()
    assert admin_client.get(reverse("admin:pikku_django_lease_add")).status_code == 403
    change = admin_client.post(
        reverse("admin:pikku_django_lease_change", args=[lease.pk]),
        {"holder": "forged", "token": 99, "expires_at": 0},
    )
    assert change.status_code == 403
    lease.refresh_from_db()
    assert lease.holder != "forged"
    delete = admin_client.post(
        reverse("admin:pikku_django_lease_delete", args=[lease.pk]), {"post": "yes"}
    )
    assert delete.status_code == 403
    lease.refresh_from_db()


def test_view_needs_permission(client: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    url = reverse("admin:pikku_django_lease_changelist")
    assert client.get(url).status_code == 403
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="view_lease"))
    assert client.get(url).status_code == 200
