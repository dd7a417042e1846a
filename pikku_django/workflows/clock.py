"""The clock the engine schedules by, replaceable in tests."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from django.utils import timezone


class Clock:
    """Wall time for scheduling (retries, sleeps, wake-ups) and a way to wait."""

    def now(self) -> datetime:
        return timezone.now()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock(Clock):
    """A clock that moves only when told to; ``sleep`` advances it instead of waiting."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or timezone.now()
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float | timedelta) -> datetime:
        delta = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        with self._lock:
            self._now += delta
            return self._now

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)
