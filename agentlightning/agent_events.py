"""An agent's events to the Gateway: the reward, or any other event, with bounded retries.

An agent the Controller starts finds two variables in its environment: `AGL_EVENT_URL`, its
attempt's events URL, and `AGL_KEY`, the attempt's key, sent as `Authorization: Bearer KEY`.
`post_event(event_type, data)` POSTs `{"event_type": event_type, "data": data}` there, and
`post_reward(value, **data)` the reward, `{"value": value, **data}`. `apost_event` and
`apost_reward` do the same without blocking an event loop.

What may pass is tried again: a connection error, a timeout, a 429 or a 5xx answer (a Gateway
restarting or busy), after 0.5, 1, 2, 4, 4, ... s, `attempts` tries in all (5 by default); then
the last error is raised. Any other answer is raised at once: a 401 (the attempt's token is no
longer valid) or a 422 (a reward without a finite `value`) would be the same the next time.

Light on purpose, httpx and the standard library only: an agent's own venv or image needs this
file and `agentlightning/__init__.py`, nothing else of the package.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import httpx

ATTEMPTS = 5
TIMEOUT_SECONDS = 30.0
FIRST_DELAY_SECONDS = 0.5
MAX_DELAY_SECONDS = 4.0
EVENT_REWARD = "reward"


def event_request(event_type: str, data: dict[str, Any]) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(URL, headers, JSON body) of an event, from the environment; no header without a key."""
    key = os.environ.get("AGL_KEY", "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return os.environ["AGL_EVENT_URL"], headers, {"event_type": event_type, "data": data}


def post_event(event_type: str, data: dict[str, Any], attempts: int = ATTEMPTS) -> None:
    url, headers, body = event_request(event_type, data)
    with httpx.Client(timeout=TIMEOUT_SECONDS, trust_env=False) as http:
        for attempt in range(attempts):
            try:
                http.post(url, json=body, headers=headers).raise_for_status()
                return
            except httpx.HTTPError as exc:
                if attempt == attempts - 1 or not transient(exc):
                    raise
            time.sleep(retry_delay(attempt))


def post_reward(value: float, **data: Any) -> None:
    post_event(EVENT_REWARD, {"value": value, **data})


async def apost_event(event_type: str, data: dict[str, Any], attempts: int = ATTEMPTS) -> None:
    url, headers, body = event_request(event_type, data)
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS, trust_env=False) as http:
        for attempt in range(attempts):
            try:
                (await http.post(url, json=body, headers=headers)).raise_for_status()
                return
            except httpx.HTTPError as exc:
                if attempt == attempts - 1 or not transient(exc):
                    raise
            await asyncio.sleep(retry_delay(attempt))


async def apost_reward(value: float, **data: Any) -> None:
    await apost_event(EVENT_REWARD, {"value": value, **data})


def transient(exc: httpx.HTTPError) -> bool:
    """Whether trying again may succeed: no answer at all, or a 429 or 5xx."""
    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return status == 429 or status >= 500
    return False


def retry_delay(attempt: int) -> float:
    """Seconds to wait after the failed try number `attempt` (from 0): doubling, capped."""
    return float(min(FIRST_DELAY_SECONDS * 2**attempt, MAX_DELAY_SECONDS))
