"""An agent that imports the `openai` package (heavy: about half a second) and makes one model
call through the Gateway's proxy, then reports a reward."""

from __future__ import annotations

import os

import openai

from tests.controller.agents import reward


class OpenAIAgent:
    def run(self) -> None:
        client = openai.OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=2
        )
        answer = client.chat.completions.create(
            model="whatever-the-proxy-rewrites",
            messages=[{"role": "user", "content": os.environ.get("QUESTION", "what is two plus two")}],
        )
        content = answer.choices[0].message.content or ""
        reward(1.0 if content else 0.0, content=content)
