"""A TCP forwarder that can cut its traffic: a real store connection that goes away and comes back.

``CutProxy(host, port)`` listens on a free local port and forwards every connection to
``host:port``. ``cut()`` closes every forwarded connection at once (the client sees its server
vanish, as on a failover) and closes each new one as soon as it is accepted (the client's connect
fails) until ``restore()``. Used by tests where one process loses its store and another keeps it
(tests/planes/test_store_loss_leases.py); ``close()`` stops it.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class CutProxy:
    """Forwards 127.0.0.1:``port`` (a free port) to ``target``; see the module docstring."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        threading.Thread(target=self._accept, name="cutproxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._cut
            if cut:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._socks |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), name="cutproxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.discard(s)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()

    def cut(self) -> None:
        """Close every forwarded connection and refuse new ones until :meth:`restore`."""
        with self._lock:
            self._cut = True
            socks = list(self._socks)
        for s in socks:
            self._drop(s)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()
