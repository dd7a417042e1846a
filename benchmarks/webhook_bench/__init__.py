"""The tiny app behind ``benchmarks/webhooks.py``: a GitHub-style source, its workflow,
and the bare view (with its one-table model) it is compared with."""
