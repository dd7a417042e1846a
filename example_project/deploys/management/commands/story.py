"""``manage.py story``: the whole example, from a signed GitHub push to an approved deploy."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from pikku_django.models import WebhookReceipt, WorkflowRun, WorkflowStep
from pikku_django.webhooks import credential_values, set_credential
from pikku_django.webhooks.lifecycle import enable
from pikku_django.workflows import resume_workflow

SECRET_NAME = "githubWebhookSecret"  # noqa: S105  (a credential name, not a secret)


class Command(BaseCommand):
    help = (
        "Run the example story: migrate, create the demo admin user (admin/admin), enable the "
        "GitHub webhook source, start the web server and pikku_worker, send a signed push, and "
        "print the deploy run's progress step by step until it waits for your approval in the "
        "admin. Stop with Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="Web server port (8000).")
        parser.add_argument(
            "--approve",
            action="store_true",
            help="Approve the deploy automatically and exit when it is done (for scripts).",
        )
        parser.add_argument(
            "--timeout", type=float, default=120, help="Seconds to wait for each stage (120)."
        )

    def handle(self, *args: Any, port: int, approve: bool, timeout: float, **options: Any) -> None:
        self.children: list[subprocess.Popen[bytes]] = []
        previous = signal.signal(signal.SIGTERM, self._terminate)
        try:
            self._story(port, approve, timeout)
        except KeyboardInterrupt:
            self.stdout.write("\nStopping the server and the worker...")
        finally:
            self._stop_children()
            signal.signal(signal.SIGTERM, previous)

    def _terminate(self, signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    def _say(self, text: str, style: Any = None) -> None:
        self.stdout.write(style(text) if style else text)
        self.stdout.flush()

    def _story(self, port: int, approve: bool, timeout: float) -> None:
        base = f"http://127.0.0.1:{port}"
        call_command("migrate", verbosity=0)
        self._say("1. Database migrated.", self.style.SUCCESS)

        user_model = get_user_model()
        if not user_model.objects.filter(username="admin").exists():
            user_model.objects.create_superuser("admin", "admin@example.com", "admin")
        self._say(f"2. Demo admin user: admin / admin  ({base}/admin/)", self.style.SUCCESS)

        if not credential_values(SECRET_NAME):
            set_credential(SECRET_NAME, secrets.token_hex(20))
        secret = credential_values(SECRET_NAME)[0]
        outcome = enable("github", base_url=f"{base}/pikku/")
        self._say(
            f"3. Webhook source 'github' enabled ({outcome.status}): signed pushes to "
            f"{base}/pikku/webhooks/github/ start deploys.",
            self.style.SUCCESS,
        )

        self._spawn(["runserver", f"127.0.0.1:{port}", "--noreload"], "server.log")
        self._spawn(["pikku_worker", "--concurrency", "2", "--poll-interval", "0.2"], "worker.log")
        self._wait_for_server(base, timeout)
        self._say(
            "4. Web server and pikku_worker started (logs: server.log, worker.log).",
            self.style.SUCCESS,
        )

        delivery = str(uuid.uuid4())
        body = json.dumps(
            {"ref": "refs/heads/main", "after": hashlib.sha1(delivery.encode()).hexdigest()}  # noqa: S324
        ).encode()
        signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        request = urllib.request.Request(  # noqa: S310  (our own local server)
            f"{base}/pikku/webhooks/github/",
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "X-GitHub-Event": "push",
                "X-GitHub-Delivery": delivery,
                "X-Hub-Signature-256": signature,
            },
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310  (local)
            answer = json.loads(response.read())
        self._say(
            f"5. Sent a signed push (delivery {delivery}): the server answered {answer}.",
            self.style.SUCCESS,
        )

        run = self._wait(
            lambda: (
                WebhookReceipt.objects.filter(provider_id=delivery)
                .exclude(run=None)
                .values_list("run", flat=True)
                .first()
            ),
            timeout,
        )
        self._say(f"6. Deploy run {run} is under way:")
        status = self._follow(
            run, until={"suspended", "completed", "failed", "cancelled"}, timeout=timeout
        )
        if status != "suspended":
            raise CommandError(f"The deploy ended {status} before asking for approval")
        admin_url = f"{base}/admin/pikku_django/workflowrun/{run}/change/"
        self._say(
            f"\nThe deploy waits for your approval. Open {admin_url} (admin / admin), then in "
            f"the run list tick it and choose 'Resume'. Ctrl-C stops everything.",
            self.style.WARNING,
        )
        if approve:
            resume_workflow(run, {"approved_by": "story --approve"})
            self._say("(approved automatically)")
        status = self._follow(
            run,
            until={"completed", "failed", "cancelled"},
            timeout=None if not approve else timeout,
        )
        final = WorkflowRun.objects.get(id=run)
        style = self.style.SUCCESS if status == "completed" else self.style.ERROR
        self._say(f"\nThe deploy {status}: {json.dumps(final.output)}", style)
        if not approve:
            self._say("Still serving; Ctrl-C to stop.")
            while True:
                time.sleep(1)

    def _spawn(self, args: list[str], log: str) -> None:
        path = os.path.join(settings.BASE_DIR, log)
        with open(path, "ab") as out:
            self.children.append(
                subprocess.Popen(  # noqa: S603
                    [sys.executable, "manage.py", *args],
                    cwd=settings.BASE_DIR,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    def _stop_children(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(timeout=40)
            except subprocess.TimeoutExpired:
                child.kill()
        self.children = []

    def _wait_for_server(self, base: str, timeout: float) -> None:
        def up() -> bool:
            try:
                with urllib.request.urlopen(f"{base}/admin/login/", timeout=2):  # noqa: S310
                    return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        self._wait(lambda: up() or None, timeout)

    def _wait(self, probe: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            for child in self.children:
                if child.poll() is not None:
                    raise CommandError(f"{' '.join(child.args[2:3])} exited; see its log")
            time.sleep(0.2)
        raise CommandError(f"Timed out after {timeout:g}s")

    def _follow(self, run_id: Any, until: set[str], timeout: float | None) -> str:
        """Print each change of the run and its steps until its status is in ``until``."""
        seen = self.__dict__.setdefault("_seen_steps", {})
        last_status = self.__dict__.get("_last_status", "")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = WorkflowRun.objects.get(id=run_id)
            for name, status, attempt in (
                WorkflowStep.objects.filter(run=run)
                .order_by("id")
                .values_list("name", "status", "attempt")
            ):
                if seen.get(name) != (status, attempt):
                    seen[name] = (status, attempt)
                    self._say(f"   step {name:<24} {status:<10} attempt {attempt}")
            if run.status != last_status:
                last_status = self._last_status = run.status
                self._say(
                    f"   run  {run.status}"
                    + (f": {run.suspend_reason}" if run.suspend_reason else "")
                )
            if run.status in until:
                return run.status
            if deadline is not None and time.monotonic() > deadline:
                raise CommandError(f"Timed out waiting for the run to reach {sorted(until)}")
            time.sleep(0.3)
