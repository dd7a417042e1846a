"""factory-boy factories for pikku_django's models."""

from __future__ import annotations

import time

import factory
from django.utils import timezone

from pikku_django.models import (
    Lease,
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)


class LeaseFactory(factory.django.DjangoModelFactory):
    """A live lease an hour from expiry; pass ``expires_at=0`` for a released one."""

    class Meta:
        model = Lease

    key = factory.Sequence(lambda n: f"lease-{n}")
    holder = factory.Faker("uuid4")
    token = factory.Sequence(lambda n: n + 1)
    expires_at = factory.LazyFunction(lambda: int(time.time() * 1000) + 3_600_000)


class _OnDatabaseFactory(factory.django.DjangoModelFactory):
    """Creates its row on the alias given as ``database=`` (default ``"default"``)."""

    class Meta:
        abstract = True

    database = "default"

    @classmethod
    def _build(cls, model_class: type, *args: object, **kwargs: object) -> object:
        kwargs.pop("database", None)
        return super()._build(model_class, *args, **kwargs)

    @classmethod
    def _create(cls, model_class: type, *args: object, **kwargs: object) -> object:
        using = kwargs.pop("database", None) or "default"
        return model_class._default_manager.using(using).create(*args, **kwargs)


class WorkflowRunFactory(_OnDatabaseFactory):
    """A run of an (unregistered unless named) workflow; ``status`` defaults to running."""

    class Meta:
        model = WorkflowRun

    workflow = factory.Sequence(lambda n: f"factory-workflow-{n}")
    status = RunStatus.RUNNING
    input = factory.Dict({"n": factory.Sequence(int)})
    output = factory.LazyAttribute(
        lambda o: {"done": True} if o.status == RunStatus.COMPLETED else None
    )
    wake_at = None


class WorkflowStepFactory(_OnDatabaseFactory):
    """A queued step, scheduled now, of a run on the same database."""

    class Meta:
        model = WorkflowStep

    run = factory.SubFactory(WorkflowRunFactory, database=factory.SelfAttribute("..database"))
    name = factory.Sequence(lambda n: f"step-{n}")
    kind = StepKind.QUEUED
    function = "factory-step"
    input = None
    status = StepStatus.SCHEDULED
    retries = 5
    retry_delay = 1.0
    available_at = factory.LazyFunction(timezone.now)


class StepAttemptFactory(_OnDatabaseFactory):
    """One attempt of a step, on the step's database."""

    class Meta:
        model = StepAttempt

    step = factory.SubFactory(WorkflowStepFactory, database=factory.SelfAttribute("..database"))
    attempt = 1
    status = StepStatus.RUNNING
    worker = "factory-worker"
