"""Flow control: per-key concurrency, queue rate limits, queue pauses, deadlines and
debounced starts."""
