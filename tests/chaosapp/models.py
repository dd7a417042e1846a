"""What the chaos test's steps leave behind, to check afterwards."""

from django.db import models


class ChaosEffect(models.Model):
    """The database effect of a transactional step: written inside the step's transaction."""

    run_id = models.CharField(max_length=64)
    step = models.CharField(max_length=255)
    nonce = models.CharField(max_length=32)
    pid = models.IntegerField()

    class Meta:
        app_label = "pikku_chaosapp"

    def __str__(self) -> str:
        return f"{self.run_id}/{self.step} by {self.pid}"


class ChaosExecution(models.Model):
    """One execution of a chaos step function, written at its start on a connection of
    its own in autocommit, so it survives a rollback and a SIGKILL."""

    run_id = models.CharField(max_length=64)
    step = models.CharField(max_length=255)
    nonce = models.CharField(max_length=32, unique=True)
    pid = models.IntegerField()
    thread = models.BigIntegerField()
    started_at = models.DateTimeField()

    class Meta:
        app_label = "pikku_chaosapp"

    def __str__(self) -> str:
        return f"{self.run_id}/{self.step} in {self.pid}:{self.thread}"
