"""A TCP proxy for tests that cut a network path: clients connect to a loopback port, the
proxy relays each connection to an upstream TCP address or Unix socket (a PostgreSQL
server's, say), and :meth:`TcpProxy.cut` severs the path as a network partition detected
by TCP does — every relayed connection is reset at once and new ones are refused — until
:meth:`TcpProxy.restore`.

    proxy = TcpProxy("/tmp/pg-socket/.s.PGSQL.5432")
    host, port = proxy.start()
    ...; proxy.cut(); ...; proxy.restore(); ...; proxy.close()

Threads, not asyncio: the proxy keeps relaying while the test's event loop is blocked in
a synchronous call. A connection is two pump threads (one per direction).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

__all__ = ["TcpProxy"]

_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN


def _reset(sock: socket.socket) -> None:
    """Wake the pump blocked on ``sock`` and make its close an RST (a TCP socket)."""
    with contextlib.suppress(OSError):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        sock.shutdown(socket.SHUT_RDWR)


class TcpProxy:
    """Relays ``127.0.0.1:<port>`` to ``upstream`` (``(host, port)`` or a Unix socket path)."""

    def __init__(self, upstream: tuple[str, int] | str, host: str = "127.0.0.1",
                 port: int = 0, record: bool = False) -> None:
        self.upstream = upstream
        self.record = record
        self._listener = socket.create_server((host, port))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        #: Connections relayed, refused (while cut) and reset by a cut, since the start.
        self.accepted = self.refused = self.reset = 0
        #: With ``record``: every byte clients sent upstream, in the order relayed (what
        #: the server read).
        self.sent = bytearray()

    def start(self) -> tuple[str, int]:
        threading.Thread(target=self._accept, name="tcp-proxy-accept", daemon=True).start()
        return self.address

    @property
    def is_cut(self) -> bool:
        return not self._open.is_set()

    def cut(self) -> int:
        """Reset every relayed connection and refuse new ones; returns how many were reset."""
        with self._lock:
            self._open.clear()
            pairs, self._pairs = list(self._pairs), set()
            self.reset += len(pairs)
        for client, upstream in pairs:
            _reset(client)
            _reset(upstream)
        return len(pairs)

    def restore(self) -> None:
        """Relay new connections again."""
        self._open.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    # -- threads ----------------------------------------------------------------------------

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(self.upstream)
            return sock
        return socket.create_connection(self.upstream, timeout=5)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:  # the listener closed
                return
            if not self._open.is_set():
                self.refused += 1
                _reset(client)
                client.close()
                continue
            try:
                upstream = self._connect_upstream()
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                client.close()
                continue
            with self._lock:
                if not self._open.is_set():  # cut meanwhile
                    _reset(client)
                    client.close()
                    upstream.close()
                    continue
                pair = (client, upstream)
                self._pairs.add(pair)
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream, pair),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, pair),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket,
              pair: tuple[socket.socket, socket.socket]) -> None:
        try:
            recording = self.record and src is pair[0]  # client -> upstream
            while data := src.recv(65536):
                if recording:
                    with self._lock:
                        self.sent += data
                dst.sendall(data)
        except OSError:
            pass
        finally:  # one direction ended: the connection is over (both threads close both)
            with self._lock:
                self._pairs.discard(pair)
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
