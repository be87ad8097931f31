"""A loopback TCP proxy a test can cut and restore: to its clients the server behind it goes away
(open connections drop, new ones are refused) and comes back on the same port, while the real server
(shared by every test) stays up."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttableProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; ``cut()`` drops everything, ``restore()`` listens again.
    With ``serve_only=N`` the server goes away after its first N connections: later ones are dropped as
    they arrive (the connections made so far go on)."""

    def __init__(self, target: tuple[str, int], *, serve_only: int | None = None) -> None:
        self.target = target
        self._left = serve_only
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self.port = self._listen(0)

    def _listen(self, port: int) -> int:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(16)
        self._listener = listener
        self._spawn(self._accept, listener)
        return int(listener.getsockname()[1])

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            if self._left is not None:
                if self._left <= 0:
                    client.close()
                    continue
                self._left -= 1
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, server}
            self._spawn(self._pump, client, server)
            self._spawn(self._pump, server, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """The server is gone: open connections drop and the port refuses new ones."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept(); close alone does not
            listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = [t for t in self._threads if t.is_alive()]

    def restore(self) -> None:
        """The server is back, on the same port."""
        self._listen(self.port)

    def close(self) -> None:
        self.cut()
