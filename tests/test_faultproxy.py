"""The fault-injecting proxy the fault tests put between workers and their servers."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.once


@pytest.fixture
def echo() -> Iterator[int]:
    """A server that sends back whatever it receives; its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a reset is what some tests do
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


@pytest.fixture
def proxy(echo: int) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo) as proxy:
        yield proxy


def roundtrip(sock: socket.socket, data: bytes = b"ping") -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        got += chunk
    return got


def connect(proxy: FaultProxy, timeout: float = 5) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def test_forwards_both_ways(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock, b"x" * 200_000) == b"x" * 200_000


def test_cut_resets_open_connections_and_accepts_new_ones(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.cut()
        with pytest.raises(ConnectionError):
            roundtrip(sock)
            roundtrip(sock)
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_outage_refuses_until_restored_on_the_same_port(proxy: FaultProxy) -> None:
    port = proxy.port
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"  # the proxy holds the link before it is cut
        proxy.outage()
        with pytest.raises(ConnectionError):
            roundtrip(sock)
            roundtrip(sock)
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)
    proxy.restore()
    assert proxy.port == port
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_outage_keeps_the_port_from_other_processes(proxy: FaultProxy) -> None:
    proxy.outage()
    with socket.socket() as other, pytest.raises(OSError, match="in use"):
        other.bind(("127.0.0.1", proxy.port))
    proxy.restore()
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_stall_holds_everything_until_restored(proxy: FaultProxy) -> None:
    with connect(proxy, timeout=0.5) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.stall()
        with pytest.raises(TimeoutError):
            roundtrip(sock)
        # A new connection is accepted, and answered by nobody.
        with connect(proxy, timeout=0.5) as fresh, pytest.raises(TimeoutError):
            roundtrip(fresh)
        proxy.restore()
        sock.settimeout(5)
        assert sock.recv(4096) == b"ping"  # what was held is delivered, nothing lost


def test_slow_delays_each_chunk(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        proxy.slow(0.3)
        started = time.monotonic()
        assert roundtrip(sock) == b"ping"
        assert time.monotonic() - started >= 0.6  # one delay each way
        proxy.restore()
        assert roundtrip(sock) == b"ping"
