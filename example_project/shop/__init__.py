"""A stand-in for your own app: it holds the ``demo`` management command."""
