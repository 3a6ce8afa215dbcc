"""uvicorn's httptools protocol, with the writes of one event-loop turn sent as one.

uvicorn writes an answer's head when the app starts it and its body when the app sends it: two
send() calls per answer. On loopback a send runs the receiver's TCP path inline, and under
`bench/proxy.py` send() was a third of the Gateway's CPU on a pass-through call (py-spy
--native). Writes made in one turn of the event loop are joined and sent at the end of that
turn: a whole answer goes out in one send, and a stream's head and events go out as soon as
before (no wait for anything that comes later). The bytes on the wire are the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport whose writes wait for the end of the loop's turn; everything else is the
    transport's own. Closing sends what is pending first."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def writelines(self, data: Iterable[bytes]) -> None:  # behind what is pending, as write
        for chunk in data:
            self.write(chunk)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatewayHttpProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
