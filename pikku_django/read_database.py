"""Where the screens people only read draw the workflow tables from.

``PIKKU["READ_DATABASE"]`` names a replica of ``PIKKU["WORKFLOW_DATABASE"]``. Only
what a person reads goes there (the admin's lists and pages, the dashboard,
``pikku_runs list`` and ``show``, the JSON status endpoint): a replica may lag and,
read from several at once, show histories that never happened together (Jepsen's
Long Fork), so claims, leases, settles, starts, the status stream and every worker
read and write ``WORKFLOW_DATABASE`` only.
"""

from __future__ import annotations

from pikku_django.conf import pikku_settings


def read_database(using: str | None = None) -> str:
    """The alias to read ``using``'s tables from for a person: ``READ_DATABASE`` when it
    is set and ``using`` (default: ``WORKFLOW_DATABASE``) is the database it mirrors,
    else ``using`` itself."""
    primary = pikku_settings.WORKFLOW_DATABASE
    using = using or primary
    replica: str | None = pikku_settings.READ_DATABASE
    return replica if replica and using == primary else using


__all__ = ["read_database"]
