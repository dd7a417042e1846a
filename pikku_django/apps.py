"""The pikku_django AppConfig."""

from django.apps import AppConfig


class PikkuConfig(AppConfig):
    """Registers pikku_django's models, admin, system checks and settings."""

    name = "pikku_django"
    verbose_name = "Pikku"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        # checks and conf register checks and signals; retention, the retention job.
        from pikku_django import checks, conf, retention  # noqa: F401
        from pikku_django.integrations import checks as integration_checks  # noqa: F401
        from pikku_django.integrations import install_configured
        from pikku_django.schedules import checks as schedule_checks  # noqa: F401
        from pikku_django.schedules import intake as schedule_intake
        from pikku_django.tasks import checks as task_checks  # noqa: F401
        from pikku_django.tasks import runner  # noqa: F401  (registers the task workflows)
        from pikku_django.wakeups import checks as wakeup_checks  # noqa: F401
        from pikku_django.webhooks import checks as webhook_checks  # noqa: F401
        from pikku_django.webhooks import dispatch
        from pikku_django.webhooks.lifecycle import sync_after_migrate
        from pikku_django.webhooks.sources import autodiscover as discover_sources
        from pikku_django.workflows.control import _admission, _deadline_intake
        from pikku_django.workflows.registry import autodiscover as discover_workflows

        dispatch.register()  # stored webhook events start their runs on workers
        schedule_intake.register()  # and so do the due ticks of cron schedules
        _admission.register()  # runs waiting for their concurrency key get their slots
        _deadline_intake.register()  # workers also time out runs and suspensions
        discover_workflows()
        discover_sources()
        post_migrate.connect(sync_after_migrate, sender=self)
        # Behind a transaction pooler the hot statements run as functions (planned once
        # per server session), created after each migrate.
        from pikku_django import prepared
        from pikku_django.workflows.store import routines

        prepared.routine_call = routines.call_for
        post_migrate.connect(routines.install_after_migrate, sender=self)
        install_configured()  # Prometheus and Sentry, where PIKKU switches them on
