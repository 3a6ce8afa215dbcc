"""The agent of bench/restarts.py: the official `openai` client (it retries), three model calls,
and a reward posted with retries too — what an agent that survives a Gateway restart does."""

from __future__ import annotations

import os
import time

import openai

from agentlightning.agent_events import EVENT_REWARD, post_event

REWARD_ATTEMPTS = 30  # 4 s apart after the first few: a Gateway restart (~seconds) fits in them


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
        post_event(EVENT_REWARD, {"value": 1.0}, attempts=REWARD_ATTEMPTS)
