"""How a task's attempts are retried: the backend's ``OPTIONS``, then each task's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from pikku_django.workflows.durations import parse_duration
from pikku_django.workflows.registry import check_backoff, check_retries

#: The keys of ``TASKS[alias]["OPTIONS"]``, which are also the extra ``@task`` options.
OPTION_KEYS = ("retries", "retry_delay", "backoff", "transactional")


@dataclass(frozen=True)
class RetryPolicy:
    """Retries after the first attempt, the delay before each, and its backoff.

    ``None`` leaves a value to ``PIKKU``'s step defaults (``STEP_RETRIES``,
    ``STEP_RETRY_DELAY``, ``STEP_BACKOFF``). ``transactional`` runs the task function
    in the transaction that records its result.
    """

    retries: int | None = None
    retry_delay: float | None = None
    backoff: str | None = None
    transactional: bool | None = None

    @classmethod
    def parse(cls, values: Any, where: str) -> RetryPolicy:
        """Read ``values`` (a dict of :data:`OPTION_KEYS`); ValueError names ``where``."""
        if values is None:
            return cls()
        if not isinstance(values, dict):
            raise ValueError(f"{where} must be a dict, not {type(values).__name__}")
        unknown = sorted(set(values) - set(OPTION_KEYS))
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}; known: {', '.join(OPTION_KEYS)}")
        try:
            retries = values.get("retries")
            delay = values.get("retry_delay")
            backoff = values.get("backoff")
            transactional = values.get("transactional")
            if transactional is not None and not isinstance(transactional, bool):
                raise ValueError(f"transactional must be True or False, not {transactional!r}")
            return cls(
                retries=None if retries is None else check_retries(retries),
                retry_delay=None if delay is None else parse_duration(delay, what="retry_delay"),
                backoff=None if backoff is None else check_backoff(backoff),
                transactional=transactional,
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from exc

    @classmethod
    def from_backend_options(cls, alias: str, options: Any) -> RetryPolicy:
        """The policy of ``TASKS[alias]["OPTIONS"]``; ImproperlyConfigured if it is wrong."""
        try:
            return cls.parse(options, f"TASKS[{alias!r}]['OPTIONS']")
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from exc

    def over(self, defaults: RetryPolicy) -> RetryPolicy:
        """This policy, with ``defaults`` where it leaves a value unset."""
        return RetryPolicy(
            retries=defaults.retries if self.retries is None else self.retries,
            retry_delay=defaults.retry_delay if self.retry_delay is None else self.retry_delay,
            backoff=defaults.backoff if self.backoff is None else self.backoff,
            transactional=defaults.transactional
            if self.transactional is None
            else self.transactional,
        )

    def as_step_options(self) -> dict[str, Any]:
        """The keyword arguments of ``ctx.do`` this policy sets."""
        return {
            "retries": self.retries,
            "retry_delay": self.retry_delay,
            "backoff": self.backoff,
            "transactional": self.transactional,
        }
