"""The workflow that ``benchmarks/recovery.py`` runs in real ``pikku_worker`` processes."""
