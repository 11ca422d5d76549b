"""A loopback endpoint whose bytes a test writes itself (every framing of an answer, a hang-up, a
hostile or endless answer), for the model client's transport tests: one thread accepts, and one
thread per connection runs the subclass's :meth:`ScriptedSocketServer.serve`."""

from __future__ import annotations

import socket
import threading
from typing import BinaryIO


class ScriptedSocketServer:
    """Listens on 127.0.0.1 (``base_url`` is its OpenAI-style ``/v1``); ``connections`` counts the
    connections accepted. A subclass sets its own fields before calling ``__init__``, which starts
    accepting."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.connections = 0
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.connections += 1
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "ScriptedSocketServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_request(reader: BinaryIO) -> tuple[bytes, bytes] | None:
    """The next request on a connection: its head (up to and with its blank line) and its
    ``Content-Length`` body; None once the client has closed the connection."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = reader.readline()
        if not line.endswith(b"\n"):
            return None
        head += line
    length = next((int(value) for name, _, value in (line.partition(b":") for line in head.split(b"\r\n"))
                   if name.strip().lower() == b"content-length"), 0)
    return head, reader.read(length)
