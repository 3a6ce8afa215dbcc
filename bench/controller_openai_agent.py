"""Bench agents written with the official `openai` package, as most agents are.

`OpenAIAgent` is written the naive way: it builds its client in run(), so every rollout pays
for a new HTTP client (about 30 ms of CPU to load the CA bundle into a new TLS context, even for
http://) and for the modules `openai` imports on first use (about 25 ms).
`SharedClientOpenAIAgent` does that setup at import, which a warm process does once for all its
rollouts: it builds the HTTP client there (no connection is open yet, so every forked rollout
safely starts from an empty pool) and touches `chat.completions` so that its modules load.
"""

from __future__ import annotations

import os
import time

import openai

from bench.controller_agents import reward

# Built at import, before any connection exists: safe to inherit in each forked rollout.
HTTP_CLIENT = openai.DefaultHttpxClient()
_ = openai.OpenAI(
    base_url="http://unused.invalid/v1", api_key="unused", http_client=HTTP_CLIENT
).chat.completions


def ask(client: openai.OpenAI, started: float) -> None:
    answer = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": os.environ.get("QUESTION", "2+2?")}]
    )
    reward(1.0 if answer.choices[0].message.content else 0.0, started)


class OpenAIAgent:
    def run(self) -> None:
        started = time.time()
        ask(openai.OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"]), started)


class SharedClientOpenAIAgent:
    def run(self) -> None:
        started = time.time()
        client = openai.OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], http_client=HTTP_CLIENT
        )
        ask(client, started)
