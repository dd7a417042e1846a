"""An orchestration pass: the workflow function replayed over a run's recorded steps, the
context it is given, the recorder it asks, and the pass written with a step's success."""
