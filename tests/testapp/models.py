"""Rows that steps run by worker processes write, so tests can count effects."""

from django.db import models


class Effect(models.Model):
    """One database effect of a step attempt."""

    run_id = models.CharField(max_length=64)
    step = models.CharField(max_length=255)
    attempt_pid = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "pikku_testapp"

    def __str__(self) -> str:
        return f"{self.run_id}/{self.step} by {self.attempt_pid}"
