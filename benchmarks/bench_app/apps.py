from django.apps import AppConfig


class BenchConfig(AppConfig):
    """Workflows and tables of ``benchmarks/throughput.py`` and ``benchmarks/chaos.py``."""

    name = "bench_app"
    label = "pikku_bench"
    default_auto_field = "django.db.models.BigAutoField"
