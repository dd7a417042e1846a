"""A run's lifecycle: starting it (one or many at once), its state machine (ending,
suspending, waking), waiting for it, sending to it, forking it from a step, versions, its
status, the signals sent as it changes, and pruning."""
