"""Where a new run's ``trace_context`` comes from: set by ``pikku_django.telemetry.install()``.

The engine stores the caller's trace context on each run it starts (children inherit
their parent's), and passes it on its signals, so that spans of the run's passes and
steps sit under the trace that started it. Without a provider runs carry none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

TraceContextProvider = Callable[[], "dict[str, str] | None"]

_provider: TraceContextProvider | None = None


def set_trace_context_provider(provider: TraceContextProvider | None) -> None:
    """Use ``provider`` for the trace context of runs started from now on (None: none)."""
    global _provider
    _provider = provider


def current_trace_context() -> dict[str, str] | None:
    """The caller's trace context, from the provider; None without one (or if it fails)."""
    provider = _provider
    if provider is None:
        return None
    try:
        return provider() or None
    except Exception:
        logger.warning("Could not read the current trace context", exc_info=True)
        return None
