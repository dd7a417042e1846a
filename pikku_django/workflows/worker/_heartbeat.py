"""A worker's heartbeat row: recorded at start, every few seconds, and at shutdown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from pikku_django.heartbeats import record_heartbeat

logger = logging.getLogger(__name__)

#: Seconds between a running worker's heartbeats.
HEARTBEAT_INTERVAL = 15.0


class WorkerHeartbeats:
    """Records one worker's heartbeat; a failed write is logged and tried next time."""

    def __init__(
        self,
        worker_id: str,
        *,
        queues: Sequence[str],
        concurrency: int,
        using: str,
        interval: float = HEARTBEAT_INTERVAL,
    ) -> None:
        self.worker_id = worker_id
        self.queues = tuple(queues)
        self.concurrency = concurrency
        self.using = using
        self.interval = interval
        self._last = float("-inf")
        self._lock = threading.Lock()

    def due(self) -> bool:
        """Whether the interval has passed since the last heartbeat."""
        return time.monotonic() - self._last >= self.interval

    def beat(self, running: int, *, stopping: bool = False) -> bool:
        """Record the heartbeat now, with ``running`` steps in hand: whether it was written."""
        with self._lock:
            self._last = time.monotonic()
            try:
                record_heartbeat(
                    self.worker_id,
                    queues=self.queues,
                    concurrency=self.concurrency,
                    running=running,
                    stopping=stopping,
                    using=self.using,
                )
                return True
            except Exception:
                logger.warning(
                    "Worker %s could not record its heartbeat", self.worker_id, exc_info=True
                )
                return False
