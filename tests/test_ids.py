"""Time-ordered run ids (RFC 9562 version 7)."""

from __future__ import annotations

import time
import uuid

import pytest

from pikku_django.ids import time_ordered_uuid
from tests.factories import WorkflowRunFactory


def test_a_time_ordered_uuid_is_version_7_with_the_time_first() -> None:
    before = time.time_ns() // 1_000_000
    value = time_ordered_uuid()
    after = time.time_ns() // 1_000_000
    assert isinstance(value, uuid.UUID)
    assert value.version == 7
    assert value.variant == uuid.RFC_4122
    assert before <= value.int >> 80 <= after


def test_time_ordered_uuids_sort_by_the_millisecond_they_were_made_in() -> None:
    first = time_ordered_uuid()
    time.sleep(0.002)
    second = time_ordered_uuid()
    assert first.hex < second.hex  # so they sort the same way as text and as numbers
    assert len({time_ordered_uuid() for _ in range(10_000)}) == 10_000


@pytest.mark.django_db
def test_a_new_run_gets_a_time_ordered_id() -> None:
    assert WorkflowRunFactory().id.version == 7
