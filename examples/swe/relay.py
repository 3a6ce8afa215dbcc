"""A harness in a sandbox with no network that can still reach the Gateway, and nothing else.

The sandbox (`bwrap --unshare-net`) has only its own loopback. Two byte relays join it to the
Gateway through a Unix socket bound into the sandbox:

    harness -> 127.0.0.1:PORT (inside) -> SOCKET (a file both sides see) -> Gateway host:port (outside)

`GatewayRelay` is the outer half (a thread in the rollout agent, connecting only to the Gateway's
address); `INNER` is the source of the inner half, run in the sandbox by its own Python
(`python -c INNER SOCKET PORT -- COMMAND...`): it listens on the sandbox's loopback, starts
COMMAND and exits with its status. What runs inside reaches the Gateway (with the rollout's scoped
key) and no other address: the local counterpart of a Job whose NetworkPolicy admits only the
Gateway.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

# The inner half, stdlib only (it runs on the sandbox's interpreter with nothing else mounted).
INNER = r"""
import socket, subprocess, sys, threading

def pipe(src, dst):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

def serve(listener, path):
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()

path, port, sep, *command = sys.argv[1:]
listener = socket.create_server(("127.0.0.1", int(port)))
threading.Thread(target=serve, args=(listener, path), daemon=True).start()
sys.exit(subprocess.call(command))
"""


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class GatewayRelay:
    """Accept on a Unix socket at `path`; join each connection to the Gateway at (host, port)."""

    def __init__(self, path: Path, host: str, port: int) -> None:
        self.path = path
        self.address = (host, port)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        os.chmod(path, 0o600)
        self._listener.listen(64)
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._serve, name="gateway-relay", daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(self.address, timeout=30)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self._open |= {client, upstream}
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()

    def __enter__(self) -> GatewayRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()
        for s in list(self._open):
            try:
                s.close()
            except OSError:
                pass
        self._thread.join(5)
        self.path.unlink(missing_ok=True)
