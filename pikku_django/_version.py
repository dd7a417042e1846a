"""The version of pikku_django (importable without loading the package's API)."""

__version__ = "0.1.0"
