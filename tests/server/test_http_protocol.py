"""The Gateway's HTTP protocol sends the writes of one event-loop turn as one, in order, and
sends what is pending before the connection closes."""

from __future__ import annotations

import asyncio
from typing import Any

from agentlightning.server.http_protocol import CoalescingTransport


class RecordingTransport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return f"info:{name}"


async def test_writes_of_one_turn_go_out_as_one_send() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"body")
    assert inner.sent == []
    await asyncio.sleep(0)  # the end of the turn
    assert inner.sent == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    transport.write(b"event")  # a stream's later event: its own send, at the end of its turn
    transport.writelines([b" and", b" more"])
    await asyncio.sleep(0)
    assert inner.sent == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"event and more"]
    assert transport.get_extra_info("peername") == "info:peername"  # the rest is the transport's


async def test_close_sends_what_is_pending_first() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"last words")
    transport.close()
    assert inner.sent == [b"last words"] and inner.closed
    await asyncio.sleep(0)
    assert inner.sent == [b"last words"]  # nothing sent twice, nothing after the close
