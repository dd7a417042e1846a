"""``python manage.py lease_demo``: a short tour of pikku_django's fenced leases."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pikku_django import (
    Lease,
    LeaseLostError,
    LeaseService,
    LeaseTakenError,
    get_lease_service,
    hold_lease,
)
from pikku_django.leases.base import now_ms

KEY = "nightly-report"


class Command(BaseCommand):
    help = (
        "Tell the story of a lease, step by step: two workers want to build the "
        f"{KEY!r} job at the same time. Shows acquire/refuse/release, the fencing "
        "token, hold_lease() renewing in the background, LeaseTakenError and "
        "LeaseLostError, using the project's lease service (settings.PIKKU). "
        "Run `manage.py migrate` first; takes a few seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--ttl-ms",
            type=int,
            default=1500,
            help="Length of every lease in the demo, in milliseconds (default: 1500). "
            "The demo runs for about twice this.",
        )

    def handle(self, *args: Any, ttl_ms: int, **options: Any) -> None:
        if not 300 <= ttl_ms <= 60_000:
            raise CommandError("--ttl-ms must be between 300 and 60000")
        self.ttl_ms = ttl_ms
        service = get_lease_service()
        self.say(
            f"Lease service: {type(service).__name__} "
            f"(leases judged on {'the store' if service.judged_on_store_clock else 'this process'}"
            f"'s clock). Every lease below lasts {ttl_ms} ms."
        )
        self.wait_until_free(service)

        lease = self.step_acquire(service)
        new_lease = self.step_fencing(service, lease)
        self.step_hold(service, new_lease.token)
        self.step_lost(service)

        self.heading("That's the story")
        self.ok(
            "Leases are refused while held, tokens only go up, hold_lease() keeps a lease "
            "alive and tells you when it is gone."
        )
        self.say(
            "Tokens keep counting across runs: a released row keeps its token. See them with "
            "`make serve` (after `manage.py createsuperuser`) at /admin/pikku_django/lease/."
        )

    # The steps of the story.

    def step_acquire(self, service: LeaseService) -> Lease:
        self.heading("1. Worker A takes the lease")
        lease = service.acquire(KEY, "worker-a", self.ttl_ms)
        if lease is None:  # wait_until_free() just saw it free: someone else is running
            raise CommandError(f"{KEY!r} was taken by someone else meanwhile; try again")
        self.ok(
            f"worker-a holds {KEY!r} with fencing token {lease.token}, "
            f"for {lease.expires_at - now_ms()} ms more."
        )

        self.heading("2. Worker B wants it too")
        if service.acquire(KEY, "worker-b", self.ttl_ms) is None:
            current = service.get(KEY)
            holder = current.holder if current else "nobody"
            self.refused(
                f"worker-b is refused at once (acquire() returned None): {holder} holds it. "
                "Nothing waits or blocks."
            )
        return lease

    def step_fencing(self, service: LeaseService, lease: Lease) -> Lease:
        self.heading("3. Worker A releases; the next token is higher")
        service.release(lease)
        self.say(f"worker-a released {KEY!r} (token {lease.token}).")
        new_lease = service.acquire(KEY, "worker-b", self.ttl_ms)
        if new_lease is None:
            raise CommandError(f"{KEY!r} was taken by someone else meanwhile; try again")
        self.ok(f"worker-b now holds it with token {new_lease.token} (> {lease.token}).")
        self.say(
            "Pass the token to whatever the lease protects and have it refuse lower tokens: "
            f"a late write from worker-a (token {lease.token}) after worker-b's "
            f"(token {new_lease.token}) is then rejected, even if worker-a stalled and never "
            "noticed it lost the lease."
        )
        service.release(new_lease)
        return new_lease

    def step_hold(self, service: LeaseService, last_token: int) -> None:
        self.heading("4. hold_lease(): the lease for the length of a block")
        self.say(f"    with hold_lease({KEY!r}, ttl_ms={self.ttl_ms}) as held: ...")
        work_s = self.ttl_ms * 1.5 / 1000
        with hold_lease(KEY, ttl_ms=self.ttl_ms, holder="worker-a") as held:
            first_expiry = held.lease.expires_at
            self.ok(
                f"worker-a holds {KEY!r}: held.token={held.token} (> {last_token}), "
                f"held.lost.is_set()={held.lost.is_set()}"
            )
            self.say(
                f"Working for {work_s:.1f} s, longer than the {self.ttl_ms} ms lease; "
                f"a background thread renews it every {self.ttl_ms // 3} ms..."
            )
            for _ in range(3):
                time.sleep(work_s / 3)
                self.say(
                    f"  ...still held: token {held.token}, expiry moved "
                    f"{held.lease.expires_at - first_expiry} ms later, "
                    f"held.lost.is_set()={held.lost.is_set()}"
                )
            current = service.get(KEY)
            self.ok(
                f"The first {self.ttl_ms} ms are long gone and the store still says "
                f"{current.holder if current else 'nobody'} holds it."
            )

            self.heading("5. Another worker tries hold_lease() on the same key")
            try:
                with hold_lease(KEY, ttl_ms=self.ttl_ms, holder="worker-b"):
                    raise CommandError("worker-b should not have got the lease")
            except LeaseTakenError as exc:
                self.refused(f"worker-b gets LeaseTakenError at once: {exc}")
        self.ok("worker-a's block finished with the lease still held; it was released on exit.")

    def step_lost(self, service: LeaseService) -> None:
        self.heading("6. The lease is taken away in the middle of a block")
        try:
            with hold_lease(KEY, ttl_ms=self.ttl_ms, holder="worker-a") as held:
                self.say(f"worker-a holds {KEY!r} with token {held.token} and starts working.")
                # Simulate worker-a stalling past its expiry: the lease goes, and
                # worker-b takes the key under a higher token.
                service.release(held.lease)
                taken = service.acquire(KEY, "worker-b", self.ttl_ms)
                if taken is None:
                    raise CommandError(f"{KEY!r} was taken by someone else meanwhile; try again")
                self.say(f"Meanwhile worker-b took {KEY!r} with token {taken.token}.")
                held.lost.wait(timeout=self.ttl_ms / 1000)
                self.refused(
                    f"held.lost.is_set()={held.lost.is_set()}: the renewal thread noticed. "
                    "Long work should check held.lost and stop early. "
                    "(pikku_django logs a WARNING about it too.)"
                )
        except LeaseLostError as exc:
            self.refused(f"Leaving the block raised LeaseLostError: {exc}")
            self.say("Its work must be treated as not done under the lease.")
        else:
            raise CommandError("LeaseLostError was expected")
        finally:
            current = service.get(KEY)
            if current is not None and current.holder == "worker-b":
                service.release(current)

    # Helpers.

    def wait_until_free(self, service: LeaseService) -> None:
        """Wait for a lease left behind by an interrupted earlier run to lapse."""
        current = service.get(KEY)
        if current is None:
            return
        wait_s = max(0, current.expires_at - now_ms()) / 1000
        self.say(
            f"{KEY!r} is still held by {current.holder} (an interrupted earlier run?); "
            f"waiting {wait_s:.1f} s for it to lapse."
        )
        deadline = time.monotonic() + min(wait_s, 60) + 1
        while service.get(KEY) is not None:
            if time.monotonic() > deadline:
                raise CommandError(f"{KEY!r} is still held; is another demo running?")
            time.sleep(0.1)

    def say(self, message: str) -> None:
        self.stdout.write(message)
        self.stdout.flush()  # keep order with log lines when the output is piped

    def heading(self, message: str) -> None:
        self.say("")
        self.say(self.style.MIGRATE_HEADING(message))

    def ok(self, message: str) -> None:
        self.say(self.style.SUCCESS(message))

    def refused(self, message: str) -> None:
        self.say(self.style.WARNING(message))
