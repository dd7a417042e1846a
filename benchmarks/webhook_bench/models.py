"""The baselines' table: one row per request, under its unique delivery id."""

from django.db import models


class RawDelivery(models.Model):
    """A request body as it came, under the delivery id the sender gave it."""

    delivery = models.CharField(max_length=255, unique=True)
    body = models.BinaryField()

    class Meta:
        db_table = "pikku_bench_webhook_raw"

    def __str__(self) -> str:
        return self.delivery
