"""Errors of the workflow engine, and how errors are stored."""

from __future__ import annotations

import re
import traceback
from typing import Any


class WorkflowError(Exception):
    """Base class of workflow errors."""

    code = "WORKFLOW_ERROR"


class WorkflowNotFoundError(WorkflowError, LookupError):
    """No workflow is registered under that name."""

    code = "WORKFLOW_NOT_FOUND"


class WorkflowRunNotFoundError(WorkflowError, LookupError):
    """No run has that id."""

    code = "RUN_NOT_FOUND"


class WorkflowRunStateError(WorkflowError):
    """The run is not in a status that allows the operation (e.g. resuming a running run)."""

    code = "RUN_STATE"


class StepFunctionNotFoundError(WorkflowError, LookupError):
    """A step names a function that is not registered in this process."""

    code = "RPC_NOT_FOUND"

    def __init__(self, function: str) -> None:
        super().__init__(f"Step function {function!r} is not registered")
        self.function = function


class WorkflowDefinitionError(WorkflowError):
    """A workflow or step was declared or called wrongly."""

    code = "DEFINITION"


class NonDeterministicWorkflowError(WorkflowError):
    """A replay does not match what the run recorded: a step name now calls another
    function than the one recorded, or the replay reached a new step without
    reaching steps recorded earlier."""

    code = "NON_DETERMINISTIC"


class WorkflowStepLimitError(WorkflowError):
    """A run was about to record more steps than its limit allows."""

    code = "STEP_LIMIT"

    def __init__(self, run_id: object, step: str, limit: int) -> None:
        super().__init__(
            f"Run {run_id} would record step {step!r} beyond its limit of {limit} steps. A "
            "run that needs more: raise PIKKU['MAX_STEPS_PER_RUN'], or the workflow's "
            "@workflow(max_steps=...); or split the work into child runs"
        )
        self.run_id = run_id
        self.step = step
        self.limit = limit


class NotSerializableError(WorkflowError, TypeError):
    """A step result, workflow input or output is not plain JSON."""

    code = "NOT_SERIALIZABLE"


class StepFailedError(WorkflowError):
    """A step failed on its last attempt; raised inside the workflow function."""

    code = "STEP_FAILED"

    def __init__(self, step: str, error: dict[str, Any] | None) -> None:
        error = error or {}
        super().__init__(
            f"Step {step!r} failed: {error.get('type', 'Error')}: {error.get('message', '')}"
        )
        self.step = step
        self.error = error


class WorkflowStepSupersededError(WorkflowError):
    """A step write came from an attempt that a newer claim has replaced."""

    code = "STEP_SUPERSEDED"

    def __init__(self, step_id: int, attempt: int) -> None:
        super().__init__(f"Attempt {attempt} of step {step_id} was superseded by a newer claim")
        self.step_id = step_id
        self.attempt = attempt


class WorkflowStepLeaseExpiredError(WorkflowError):
    """A step lost its worker on every one of its attempts."""

    code = "STEP_LEASE_EXPIRED"

    def __init__(self, step: str, attempts: int) -> None:
        super().__init__(f"Step {step!r} lost its worker on every one of its {attempts} attempts")
        self.step = step
        self.attempts = attempts


class StepTimeoutError(WorkflowError):
    """A step's attempt ran past its ``timeout``: it is failed, and retried by its policy.

    The function's Python code is not interrupted; what it returns late is refused.
    """

    code = "STEP_TIMEOUT"

    def __init__(self, step: str, attempt: int, timeout: float) -> None:
        super().__init__(f"Attempt {attempt} of step {step!r} ran past its timeout of {timeout:g}s")
        self.step = step
        self.attempt = attempt
        self.timeout = timeout


class WorkflowTimeoutError(WorkflowError):
    """A run passed its deadline: it failed, and its waiting steps and child runs were
    cancelled."""

    code = "RUN_TIMEOUT"

    def __init__(self, run_id: object, deadline: object) -> None:
        super().__init__(f"Run {run_id} passed its deadline of {deadline}")
        self.run_id = run_id
        self.deadline = deadline


class SuspendTimeoutError(WorkflowError):
    """A ``ctx.suspend(..., timeout=...)`` was not resumed in time; raised inside the
    workflow function, which may catch it."""

    code = "SUSPEND_TIMEOUT"

    def __init__(self, step: str, timeout: float) -> None:
        super().__init__(f"Suspension {step!r} was not resumed within {timeout:g}s")
        self.step = step
        self.timeout = timeout


#: What a character no database stores in text is stored as: U+FFFD, the Unicode
#: replacement character (one character for one, so the rest of the text is as it was).
STORED_STAND_IN = "\ufffd"

#: NUL, which PostgreSQL refuses in text and JSON, and the UTF-16 surrogates, which
#: are not text at all (a lone one comes from undecodable bytes, e.g. a file name
#: decoded with ``surrogateescape``): PostgreSQL and MariaDB refuse them in JSON.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` with each NUL character and each surrogate replaced by U+FFFD
    (:data:`STORED_STAND_IN`), so every database stores it; other text is kept."""
    return UNSTORABLE.sub(STORED_STAND_IN, text)


def storable_error(error: Any) -> Any:
    """A stored error (its dict, or any JSON value) with every str in it, keys too,
    made :func:`storable_text`."""
    if isinstance(error, str):
        return storable_text(error)
    if isinstance(error, dict):
        return {storable_error(k): storable_error(v) for k, v in error.items()}
    if isinstance(error, list | tuple):
        return [storable_error(v) for v in error]
    return error


def serialize_error(exc: BaseException) -> dict[str, Any]:
    """An exception as stored: type, message, traceback (its notes and the exceptions
    it was raised from or during included), and a code when it has one.

    Every text is :func:`storable_text`: a NUL character or a surrogate in it is
    stored as U+FFFD, the same on every database.
    """
    cls = type(exc)
    data: dict[str, Any] = {
        "type": cls.__name__
        if cls.__module__ == "builtins"
        else f"{cls.__module__}.{cls.__qualname__}",
        "message": _message(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        data["code"] = code
    return {key: storable_text(value) for key, value in data.items()}


def _message(exc: BaseException) -> str:
    """``str(exc)``, or what the traceback module shows when that raises."""
    try:
        return str(exc)
    except Exception:
        return "<exception str() failed>"


class UnknownPatchError(NonDeterministicWorkflowError):
    """The run took a ``ctx.patched`` branch this code does not have: another
    worker, with the code that does, passes it."""


class RunWaitTimeoutError(WorkflowError, TimeoutError):
    """``wait_for_run`` gave up: the run had not ended within its timeout."""

    def __init__(self, run_id: object, status: str, timeout: float) -> None:
        super().__init__(f"Run {run_id} is still {status} after {timeout:g}s")
        self.run_id = run_id
        self.status = status
        self.timeout = timeout
