"""The agent APIs the proxy serves, one row each: read by the fast path (asgi.py), the declared
routes (routes.py), the agent token's scope (server/auth.py) and the handler."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Api = Literal["chat.completions", "completions", "responses", "anthropic.messages"]
ROOT = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}"


@dataclass(frozen=True)
class AgentApi:
    api: Api
    route: str  # after an attempt's ROOT
    upstream: str  # the inference server's path that serves it (Responses and Messages: translated)
    summary: str


AGENT_APIS = (
    AgentApi(
        "chat.completions",
        "openai/v1/chat/completions",
        "/chat/completions",
        "OpenAI chat completions, streamed or not, for one attempt of a rollout.",
    ),
    AgentApi(
        "completions",
        "openai/v1/completions",
        "/completions",
        "OpenAI (legacy) completions, streamed or not, for one attempt of a rollout.",
    ),
    AgentApi(
        "responses",
        "openai/v1/responses",
        "/chat/completions",
        "OpenAI Responses API (stateless), streamed or not, served as a chat call and recorded as one.",
    ),
    AgentApi(
        "anthropic.messages",
        "anthropic/v1/messages",
        "/chat/completions",
        "Anthropic Messages API, streamed or not, served as a chat call and recorded as one.",
    ),
)
BY_ROUTE = {a.route: a for a in AGENT_APIS}
BY_API: dict[Api, AgentApi] = {a.api: a for a in AGENT_APIS}
ROUTES = "|".join(re.escape(a.route) for a in AGENT_APIS)  # a regex alternation of the routes
SERVED = ", ".join(f"POST .../{a.route}" for a in AGENT_APIS)
