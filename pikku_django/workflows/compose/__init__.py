"""Composition: parallel groups and child runs, events sent to runs, and the values a run
publishes."""
