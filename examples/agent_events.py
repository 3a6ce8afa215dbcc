"""Post an event of an example's agent to the Gateway (shared by the agents of search_r1,
llm_in_sandbox, science_world, gsm8k, openai_agents and langgraph; they put this folder on
`sys.path`, as the train scripts do for `launcher.py`; the async ones call it in a thread).
Calc-X and swe keep their own: their images are built from their folders alone.

`post_event(event_type, data)` sends `{"event_type", "data"}` to `AGL_EVENT_URL` with the
attempt's `AGL_KEY` as a bearer token, five tries with backoff (0.5, 1, 2, 4 s) on any HTTP
error; the last error is raised.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx


def post_event(event_type: str, data: dict[str, Any]) -> None:
    key = os.environ.get("AGL_KEY", "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"event_type": event_type, "data": data}
    with httpx.Client(timeout=30.0, trust_env=False) as http:
        for attempt in range(5):
            try:
                http.post(os.environ["AGL_EVENT_URL"], json=body, headers=headers).raise_for_status()
                return
            except httpx.HTTPError:
                if attempt == 4:
                    raise
                time.sleep(0.5 * 2**attempt)
