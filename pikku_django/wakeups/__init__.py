"""Wake-ups: how workers, run waits and status streams learn of new work and of runs' ends.

On PostgreSQL a write announces itself with ``NOTIFY`` in its own transaction, so the
announcement goes out as it commits; waiters ``LISTEN``. Everywhere else, and where no
connection can listen, waiters poll. This package holds the whole of it:

- the channels and their payloads (:data:`WORK_CHANNEL`, :data:`RUN_DONE_CHANNEL`,
  :data:`SOURCES_CHANNEL`);
- what a database can do (:func:`notifies`, :func:`listen_alias`, :func:`pooling_of`),
  which the rest of the package asks instead of which database it is on;
- announcing (:func:`announce`, and :data:`announcer`, which coalesces a busy process's
  announcements);
- listening (:class:`ChannelListener`, one connection of its own;
  :func:`shared_listener`, one per process and channel shared by every waiter; and
  :func:`session_listener`, notices kept on a request's own connection).

Behind a pooler in transaction mode (``PIKKU["DATABASE_POOLING"]``) a pooled connection
cannot listen (each transaction may run on another server session): waiters listen
through the alias ``PIKKU["LISTEN_DATABASES"]`` names for that database, or poll,
workers every ``PIKKU["WORKER_POOLED_POLL_INTERVAL"]``. Announcing is one statement in
the writing transaction and works through any pooler.
"""

from pikku_django.pooling import Pooling, pooling_of
from pikku_django.wakeups.announcing import Announcer, announce, announce_run_end, announcer
from pikku_django.wakeups.channels import (
    ANY_WORK,
    KEYS_WAITING,
    RECEIPTS_WAITING,
    RUN_DONE_CHANNEL,
    SOURCES_CHANNEL,
    WORK_CHANNEL,
    listen_alias,
    notifies,
    worker_poll_interval,
)
from pikku_django.wakeups.listening import (
    ChannelListener,
    SharedListener,
    idle_listeners,
    session_listener,
    shared_listener,
    work_listener,
)

__all__ = [
    "ANY_WORK",
    "KEYS_WAITING",
    "RECEIPTS_WAITING",
    "RUN_DONE_CHANNEL",
    "SOURCES_CHANNEL",
    "WORK_CHANNEL",
    "Announcer",
    "ChannelListener",
    "Pooling",
    "SharedListener",
    "announce",
    "announce_run_end",
    "announcer",
    "idle_listeners",
    "listen_alias",
    "notifies",
    "pooling_of",
    "session_listener",
    "shared_listener",
    "work_listener",
    "worker_poll_interval",
]
