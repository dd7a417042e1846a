#!/usr/bin/env python
"""Django's command-line utility for the pikku_django example project."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise ImportError(
            "Couldn't import Django. Is it installed and is the virtualenv active? "
            "From the repository root, `make demo` creates .venv and installs everything."
        ) from exc
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
