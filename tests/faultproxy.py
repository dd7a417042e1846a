"""A TCP proxy for the fault tests: it forwards to a server, and on demand cuts every
connection, refuses new ones, stalls (accepts and holds everything) or slows
(delays each chunk).

    with FaultProxy("127.0.0.1", 5432) as proxy:
        url = f"postgres://postgres@127.0.0.1:{proxy.port}/db"
        ...
        proxy.outage()     # the server is gone: connections cut, new ones refused
        proxy.restore()    # back, on the same port

Threads, not asyncio: the tests that use it are synchronous, and each connection
needs only two pumps.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import select
import socket
import threading
import time
from types import TracebackType

logger = logging.getLogger(__name__)

CHUNK = 65536
#: How often a pump looks at the proxy's mode while nothing arrives.
TICK = 0.05


class Mode(enum.Enum):
    FORWARD = "forward"
    STALL = "stall"
    SLOW = "slow"


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.closed = threading.Event()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                # An RST rather than a FIN, as when a server's host goes away.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            with contextlib.suppress(OSError):
                sock.close()


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream_host:upstream_port`` until told otherwise."""

    def __init__(self, upstream_host: str, upstream_port: int, *, port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._mode = Mode.FORWARD
        self._delay = 0.0
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._listener: socket.socket | None = None
        #: While refusing: a socket bound to the port but not listening, so no other
        #: process (a parallel test's proxy, an outgoing connection) takes the port.
        self._holder: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._closed = False
        self.port = port
        #: Connections accepted so far (a test can see that clients reconnected).
        self.accepted = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._listen()
        return self

    def close(self) -> None:
        self._closed = True
        self._stop_listening()
        self._release_port()
        self.cut()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- faults ----------------------------------------------------------------------------

    def cut(self) -> None:
        """Reset every open connection (new ones are still accepted)."""
        with self._lock:
            links, self._links = self._links, set()
        for link in links:
            link.close()

    def refuse(self) -> None:
        """Stop listening: new connections are refused, open ones go on. The port stays
        reserved for :meth:`restore`."""
        if self._listener is not None and self._holder is None:
            self._holder = self._bound_socket()
        self._stop_listening()

    def outage(self) -> None:
        """The server is gone: every connection reset, new ones refused."""
        self.refuse()
        self.cut()

    def stall(self) -> None:
        """Accept, but forward nothing either way until :meth:`restore`."""
        with self._lock:
            self._mode = Mode.STALL

    def slow(self, delay_s: float) -> None:
        """Forward each chunk only after ``delay_s`` seconds."""
        with self._lock:
            self._mode, self._delay = Mode.SLOW, delay_s

    def restore(self) -> None:
        """Forward again, listening on the same port."""
        with self._lock:
            self._mode, self._delay = Mode.FORWARD, 0.0
        if self._listener is None and not self._closed:
            self._listen()

    # -- the proxy -------------------------------------------------------------------------

    def _bound_socket(self) -> socket.socket:
        """A socket bound to ``self.port`` (any free port while it is 0). SO_REUSEPORT
        lets the listener and the socket that holds the port while refusing overlap,
        so the port is never free in between."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", self.port))
        return sock

    def _release_port(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.close()

    def _listen(self) -> None:
        listener = self._bound_socket()
        listener.listen(128)
        self._release_port()
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._accepting = threading.Thread(
            target=self._accept, args=(listener,), name=f"faultproxy-{self.port}", daemon=True
        )
        self._accepting.start()

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.close()
        if self._accepting is not None:
            self._accepting.join(5)
            self._accepting = None

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                ready, _, _ = select.select([listener], [], [], TICK)
                if not ready:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):  # closed by refuse() or close()
                return
            self.accepted += 1
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            logger.warning("faultproxy: could not reach %s:%d", *self.upstream)
            client.close()
            return
        link = _Link(client, server)
        with self._lock:
            self._links.add(link)
        for src, dst in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(link, src, dst), daemon=True).start()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not link.closed.is_set():
                with self._lock:
                    mode, delay = self._mode, self._delay
                if mode is Mode.STALL:
                    time.sleep(TICK)  # what arrives waits in the kernel's buffers
                    continue
                ready, _, _ = select.select([src], [], [], TICK)
                if not ready:
                    continue
                data = src.recv(CHUNK)
                if not data:
                    break
                with self._lock:  # the mode when the chunk arrived, not before the wait
                    mode, delay = self._mode, self._delay
                if mode is Mode.SLOW:
                    time.sleep(delay)
                self._wait_while_stalled(link)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._links.discard(link)
            link.close()

    def _wait_while_stalled(self, link: _Link) -> None:
        while not link.closed.is_set():
            with self._lock:
                if self._mode is not Mode.STALL:
                    return
            time.sleep(TICK)
