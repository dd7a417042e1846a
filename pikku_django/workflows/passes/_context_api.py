"""What the context's event, publishing and version helpers use of a
:class:`~pikku_django.workflows.WorkflowContext` (so they need not import it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pikku_django.models import WorkflowStep
    from pikku_django.workflows.passes._recorder import StepRecorder


class StepCalls(Protocol):
    """A pass's context: its recorder, its step naming and its look-up of recorded steps."""

    @property
    def _recorder(self) -> StepRecorder: ...

    @property
    def _seen(self) -> Mapping[str, int]: ...

    def _step_name(self, name: object, *, internal: bool = False) -> str: ...

    @property
    def _recorded_at_start(self) -> int: ...

    @property
    def _reached(self) -> int: ...

    def _existing(
        self, name: str, kind: str, function: str, *, new: bool = True
    ) -> WorkflowStep | None: ...
