"""The models and their migrations agree."""

from __future__ import annotations

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_missing_migrations() -> None:
    call_command("makemigrations", "pikku_django", "--check", "--dry-run", verbosity=0)
