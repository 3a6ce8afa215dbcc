"""Forwarding to inference servers, with retries.

aiohttp, not httpx, carries the upstream calls. With an unlimited pool and 256-1024 calls
in flight, httpx spent 11-19 ms of CPU per call (its pool scans every connection on each
request) and managed 19-27 calls/s, httpx2 1.4-3.9 ms; aiohttp spent 0.14-0.20 ms and kept
up with the model (measured side by side; numbers in docs/gateway.md). The pool has no
cap by default: every agent's call gets its own connection at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.payload import BytesPayload
from yarl import URL

from agentlightning.schemas import Model
from agentlightning.server.config import ProxyConfig

RETRY_STATUSES = frozenset({408, 409, 429})
GET_TIMEOUT_SECONDS = 10.0


def is_retryable(status: int) -> bool:
    return status in RETRY_STATUSES or status >= 500


@dataclass
class Forwarded:
    """The outcome of forwarding one call.

    `status` is the HTTP status for the agent. A streamed answer is still open in `stream`
    (the caller reads and closes it); otherwise `body` holds the whole answer. `error` says
    what went wrong when the call failed; `tries` counts the upstream attempts made.
    """

    status: int
    model: Model | None
    tries: int
    body: bytes = b""
    content_type: str = "application/json"
    stream: aiohttp.ClientResponse | None = None
    error: str | None = None


class UpstreamClient:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None
        self._headers: dict[str, str] = {}
        self._urls: dict[str, URL] = {}  # parsed once per endpoint and path
        if config.upstream_key:
            self._headers["Authorization"] = f"Bearer {config.upstream_key}"

    async def open(self) -> None:
        c = self.config
        connector = aiohttp.TCPConnector(
            limit=c.max_connections,
            limit_per_host=0,
            keepalive_timeout=c.keepalive_seconds or None,
            force_close=c.keepalive_seconds == 0,
            ttl_dns_cache=300,
        )
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=c.connect_timeout_seconds, sock_read=c.read_timeout_seconds
        )
        # No cookies between the Gateway and inference servers; the jar costs time on every call.
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def backoff(self, retry: int) -> float:
        c = self.config
        base: float = min(c.backoff_seconds * 2.0**retry, c.max_backoff_seconds)
        return base * random.uniform(1 - c.jitter, 1 + c.jitter)

    def _url(self, endpoint: str, path: str) -> URL:
        key = endpoint + path
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) > 4096:  # endpoints come and go; keep the cache small
                self._urls.clear()
            url = self._urls[key] = URL(endpoint.rstrip("/") + path)
        return url

    async def get_json(self, endpoint: str, path: str) -> Any:
        """GET `{endpoint}{path}` once, its JSON answer; None when it fails, is not JSON or takes
        longer than GET_TIMEOUT_SECONDS (a short wait: the caller holds a model call meanwhile)."""
        if self._session is None:
            raise RuntimeError("the proxy's upstream client is not open")
        try:
            async with self._session.get(
                self._url(endpoint, path),
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=GET_TIMEOUT_SECONDS),
            ) as response:
                return await response.json(content_type=None) if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def forward(
        self, pick: Callable[[], Model | None], path: str, body: bytes, stream: bool
    ) -> Forwarded:
        """POST `body` to `{endpoint}{path}`, retrying transport errors, timeouts and 408/409/429/5xx.

        `pick` chooses the endpoint before every try, so a retry sees re-registered servers.
        A streamed answer is returned open once its status is 200 and it is an event stream.
        """
        if self._session is None:
            raise RuntimeError("the proxy's upstream client is not open")
        error = ""
        timed_out = False
        model: Model | None = None
        for attempt in range(self.config.max_tries):
            if attempt:
                await asyncio.sleep(self.backoff(attempt - 1))
            model = pick()
            if model is None:
                return Forwarded(503, None, attempt, error="no_endpoint")
            url = self._url(model.endpoint, path)
            response: aiohttp.ClientResponse | None = None
            try:
                # A ready payload skips aiohttp's per-call payload type lookup.
                payload = BytesPayload(body, content_type="application/json")
                response = await self._session.post(url, data=payload, headers=self._headers)
                status = response.status
                content_type = response.headers.get("Content-Type", "application/json")
                if is_retryable(status):
                    text = (await response.read())[:1000].decode(errors="replace")
                    error, timed_out = f"{url} answered {status}: {text}", False
                    continue
                if stream and status == 200 and content_type.startswith("text/event-stream"):
                    opened, response = response, None  # the caller closes it
                    return Forwarded(status, model, attempt + 1, content_type=content_type, stream=opened)
                data = await response.read()
                return Forwarded(status, model, attempt + 1, body=data, content_type=content_type)
            except TimeoutError:
                error, timed_out = f"{url} did not answer in time", True
            except aiohttp.ClientError as exc:
                error, timed_out = f"{url} failed: {type(exc).__name__}: {exc}", False
            finally:
                if response is not None:
                    response.release()
        tries = self.config.max_tries
        return Forwarded(504 if timed_out else 502, model, tries, error=f"after {tries} tries: {error}")
