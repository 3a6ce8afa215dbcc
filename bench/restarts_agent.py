"""The agent of bench/restarts.py: the official `openai` client (it retries), three model calls,
and a reward posted with retries too — what an agent that survives a Gateway restart does."""

from __future__ import annotations

import os
import time

import httpx
import openai


def post_reward(value: float) -> None:
    headers = {"Authorization": f"Bearer {os.environ['AGL_KEY']}"}
    body = {"event_type": "reward", "data": {"value": value}}
    for attempt in range(30):
        try:
            httpx.post(os.environ["AGL_EVENT_URL"], json=body, headers=headers, timeout=30).raise_for_status()
            return
        except (httpx.TransportError, httpx.HTTPStatusError):
            if attempt == 29:
                raise
            time.sleep(min(0.5 * 2**attempt, 4.0))


class RestartProofAgent:
    def run(self) -> None:
        client = openai.OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=10
        )
        messages = [{"role": "user", "content": os.environ.get("QUESTION", "2+2?")}]
        for _ in range(3):
            answer = client.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
            messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
            messages.append({"role": "user", "content": "and then?"})
            time.sleep(0.2)  # tool work between calls: restarts land mid-rollout
        post_reward(1.0)
