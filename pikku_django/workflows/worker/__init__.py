"""The worker behind ``manage.py pikku_worker``: its loop, the threads that carry runs,
where idle threads wait, its heartbeat and tally, and the event loop for async steps."""
