from django.apps import AppConfig


class RecoveryBenchConfig(AppConfig):
    """Holds the benchmark's workflow; pikku_django discovers its ``workflows.py``."""

    name = "recovery_app"
    label = "pikku_bench_recovery"
    default_auto_field = "django.db.models.BigAutoField"
