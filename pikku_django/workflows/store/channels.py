"""The PostgreSQL channels workers are told of work on."""

#: The PostgreSQL channel that new work is announced on.
CHANNEL = "pikku_work"

#: The PostgreSQL channel that a run's end is announced on, with the run's id.
RUN_DONE_CHANNEL = "pikku_run_done"
