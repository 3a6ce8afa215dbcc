"""The demo's calculator agent made naive, as most agents are, for bench/chaos.py: a model call
that still fails after a few tries ends the episode, and the agent reports reward 0 for it like
for any wrong answer (the demo's own agent raises instead).

`CHAOS_AGENT_FAULT_RATE` fails that share of training rollouts' model calls inside the agent,
before they reach the Gateway: faults the Gateway cannot see, which the trainer can only take at
the agent's word. Which calls fail is a keyed hash (`CHAOS_FAULT_SEED`) of the rollout's proxy URL
and the messages, so the same call tried again fails again, as `proxy.fault_rate` strikes calls
at the Gateway (with `proxy.fault_modes=[train]`: validation calls are never struck).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from typing import Any

from openai import APIConnectionError, AsyncOpenAI, InternalServerError, RateLimitError

from agentlightning.demo.agent import CalcAgent, solve

log = logging.getLogger("chaos_agent")
SERVER_TRIES = 3  # tries of a call the server failed before the agent gives up on it


class ModelDown(Exception):
    """A model call failed on its way to the Gateway (an injected fault)."""


def struck(url: str, messages: Any, rate: float, seed: str) -> bool:
    digest = hashlib.blake2b(json.dumps(messages, sort_keys=True).encode(), digest_size=8, key=seed.encode())
    digest.update(url.encode())
    return int.from_bytes(digest.digest(), "big") / 2**64 < rate


class _Completions:
    def __init__(self, client: AsyncOpenAI) -> None:
        self.client = client
        self.url = str(client.base_url)
        training = "/mode/train/" in self.url  # the rollout's proxy URL names its mode
        self.rate = float(os.environ.get("CHAOS_AGENT_FAULT_RATE", "0")) if training else 0.0
        self.seed = os.environ.get("CHAOS_FAULT_SEED", "0")

    async def create(self, **kwargs: Any) -> Any:
        if self.rate and struck(self.url, kwargs.get("messages"), self.rate, self.seed):
            raise ModelDown("the model call failed before reaching the Gateway (injected fault)")
        failed = 0
        while True:
            try:
                return await self.client.chat.completions.create(**kwargs)
            except RateLimitError as exc:  # the Gateway pauses calls while the trainer swaps weights
                await asyncio.sleep(float(exc.response.headers.get("retry-after", "1")))
            except (InternalServerError, APIConnectionError):
                failed += 1
                if failed >= SERVER_TRIES:
                    raise
                await asyncio.sleep(0.2 * failed)


class _Chat:
    def __init__(self, client: AsyncOpenAI) -> None:
        self.completions = _Completions(client)


class _NaiveClient:
    def __init__(self, client: AsyncOpenAI) -> None:
        self.chat = _Chat(client)


class NaiveCalcAgent(CalcAgent):
    def client(self, base_url: str, key: str) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=base_url, api_key=key or "unused", max_retries=0, timeout=300.0)

    async def answer(self, client: AsyncOpenAI, question: str, tools: list[tuple[int, str]]) -> str | None:
        try:
            return await solve(
                _NaiveClient(client),
                question,
                model=os.environ.get("AGL_MODEL", "policy"),
                tool_results=tools,
            )
        except (ModelDown, InternalServerError, APIConnectionError) as exc:
            log.warning("model call failed, answering nothing (reward 0): %s", exc)
            return None
