"""Wake-ups for long-poll reads: a waiter sleeps until the next change or its deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class ChangeSignal:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._closed = False

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def close(self) -> None:
        """The server is shutting down: waiters answer now, and later polls do not wait (a poll
        still waiting when the server's grace period ends is cancelled mid-request)."""
        self._closed = True
        self.notify()

    async def poll(
        self, query: Callable[[], Awaitable[T]], ready: Callable[[T], bool], wait_seconds: float
    ) -> T:
        """Run `query` until `ready(result)` or `wait_seconds` passed; re-run after each change."""
        deadline = time.monotonic() + wait_seconds
        while True:
            event = self._event  # taken before the query, so a change during it is not missed
            result = await query()
            remaining = deadline - time.monotonic()
            if ready(result) or remaining <= 0 or self._closed:
                return result
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                return await query()
