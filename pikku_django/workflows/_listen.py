"""PostgreSQL LISTEN/NOTIFY for the worker: new work wakes its threads at once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from pikku_django.workflows.intake import intakes
from pikku_django.workflows.store import CHANNEL

logger = logging.getLogger(__name__)


def listen_for_work(
    engine: Any,
    stopping: threading.Event,
    intake_waiting: threading.Event,
    wake: Callable[[], None],
    retry_after: float,
) -> None:
    """Until ``stopping``: on each notification on the workers' channel, call
    ``wake`` (and set ``intake_waiting`` when an intake has work); reconnect
    ``retry_after`` seconds after the connection fails."""
    template = connections[engine.using]
    payloads = {i.notify_payload for i in intakes() if i.notify_payload}
    while not stopping.is_set():
        conn = type(template)(template.settings_dict, engine.using)
        try:
            conn.ensure_connection()
            raw = conn.connection
            raw.autocommit = True
            raw.execute(f"LISTEN {CHANNEL}")
            while not stopping.is_set():
                for notice in raw.notifies(timeout=1.0, stop_after=1):
                    if notice.payload in payloads:
                        intake_waiting.set()
                    wake()
        except Exception:
            if stopping.is_set():
                return
            logger.warning(
                "LISTEN %s failed; reconnecting in %gs", CHANNEL, retry_after, exc_info=True
            )
            stopping.wait(retry_after)
        finally:
            try:
                conn.close()
            except Exception:
                logger.debug("closing the LISTEN connection failed", exc_info=True)
