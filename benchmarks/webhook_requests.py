"""The requests of ``benchmarks/webhooks.py``: a signed GitHub ``push`` delivery, and a
``Poster`` that sends it through a WSGI application as a new push each time (its own
``after`` commit, signed, and a fresh delivery id)."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

DEFAULT_POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/pikku_bench"
POSTGRES_URL = os.environ.get("PIKKU_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
SOURCE = "bench-github"  # as declared in webhook_bench/webhooks.py
WORKFLOW = "webhook_bench.push"  # as declared in webhook_bench/workflows.py
SECRET = "bench-github-webhook-secret-8f3a91c2"  # noqa: S105 - a benchmark's fixed secret
RETIRED_SECRET = "bench-github-webhook-secret-retired-5d0e"  # noqa: S105
EXPECTED = b'{"received": 1}'
#: Each side and the path it answers on.
PATHS = {
    "raw": "/bench/raw/",
    "pikku": f"/pikku/webhooks/{SOURCE}/",
    "notify": "/bench/notify/",
    "defer": "/bench/defer/",
}


class BenchError(RuntimeError):
    """A request or a row count was not what the benchmark expects."""


# --- the request --------------------------------------------------------------------------


def push_body(size: int) -> bytes:
    """A compact GitHub ``push`` payload of at least ``size`` bytes (commits pad it)."""
    sha = "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"
    event: dict[str, Any] = {
        "ref": "refs/heads/main",
        "before": sha,
        "after": sha[::-1],
        "created": False,
        "deleted": False,
        "forced": False,
        "compare": "https://github.com/pikku/bench/compare/9f8e7d6c5b4a...234567890a1b",
        "repository": {
            "id": 123456789,
            "name": "bench",
            "full_name": "pikku/bench",
            "private": False,
            "html_url": "https://github.com/pikku/bench",
            "default_branch": "main",
        },
        "pusher": {"name": "bench", "email": "bench@example.com"},
        "sender": {"login": "bench", "id": 42, "type": "User"},
        "commits": [],
    }
    while len(compact(event)) < size:
        i = len(event["commits"])
        event["commits"].append(
            {
                "id": f"{i:040x}",
                "message": f"Commit number {i} of the benchmark push",
                "timestamp": "2026-01-01T12:00:00Z",
                "author": {"name": "Bench", "email": "bench@example.com"},
                "added": [],
                "removed": [],
                "modified": [f"src/module_{i}.py"],
            }
        )
    return compact(event)


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Poster:
    """POSTs the body to ``path`` through a WSGI application as a new push per call (its
    ``after`` commit and delivery id made from a counter, the body signed again), and
    checks the answer; ``count`` says how many it has sent.

    A new body each time, as GitHub sends: GitHub signs no delivery id, so pikku_django
    takes a body it has accepted before for a replay.
    """

    def __init__(self, app: Callable[..., Any], path: str, body: bytes) -> None:
        self.app = app
        after = body.index(b'"after":"') + len(b'"after":"')
        self.head, self.tail = body[:after], body[after + 40 :]
        # GitHub's delivery ids are UUIDs: a random prefix, then the counter.
        self.prefix = str(uuid.uuid4())[:24]
        self.commit = uuid.uuid4().hex[:28]  # the after commit: this, then the counter
        self.count = 0
        self.status = ""
        self.base = {
            "REQUEST_METHOD": "POST",
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": "",
            "SERVER_NAME": "testserver",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "testserver",
            "HTTP_USER_AGENT": "GitHub-Hookshot/pikku-bench",
            "HTTP_ACCEPT": "*/*",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_X_GITHUB_EVENT": "push",
            "HTTP_X_GITHUB_HOOK_ID": "123456",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }

    def _start_response(self, status: str, headers: Any, exc_info: Any = None) -> None:
        self.status = status

    def __call__(self) -> None:
        self.count += 1
        environ = self.base.copy()
        body = b"%s%s%012x%s" % (self.head, self.commit.encode(), self.count, self.tail)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["HTTP_X_HUB_SIGNATURE_256"] = sign(body)
        environ["HTTP_X_GITHUB_DELIVERY"] = f"{self.prefix}{self.count:012d}"
        response = self.app(environ, self._start_response)
        try:
            content = b"".join(response)
        finally:
            response.close()
        if self.status != "200 OK" or content != EXPECTED:
            raise BenchError(f"{self.base['PATH_INFO']} answered {self.status}: {content[:300]!r}")
