"""Settings package of the pikku_django example project."""
