"""The rewrite stage: what the proxy changes in an agent's request, and which inference server
gets it. A Responses or Messages request becomes the chat request that means the same
(translate.Translation); `max_tokens` is fitted to the served context (context.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentlightning.schemas import Model
from agentlightning.server.config import DefaultProxyConfig
from agentlightning.server.proxy import anthropic_messages, openai_responses
from agentlightning.server.proxy.apis import Api
from agentlightning.server.proxy.context import LIMIT_KEYS, fit_max_tokens
from agentlightning.server.proxy.translate import Translation
from agentlightning.server.state import GatewayState

TRANSLATIONS: dict[Api, Translation] = {
    "responses": openai_responses,
    "anthropic.messages": anthropic_messages,
}


@dataclass
class ProxyRequest:
    """An agent's call after the rewrite stage: what goes upstream, and to which endpoint."""

    body: dict[str, Any]  # the agent's request, as sent
    upstream_body: dict[str, Any]  # the chat request for a translated API; else the agent's body
    params: dict[str, Any]  # what the proxy sets on it (`rewrite`)
    model_name: str
    model: Model | None
    translation: Translation | None  # None for the OpenAI APIs themselves
    stream: bool


async def rewrite_call(
    state: GatewayState, body: dict[str, Any], api: Api, mode: str, rollout_id: str
) -> ProxyRequest:
    """The request as it goes upstream: translated to chat (Responses, Messages), the proxy's
    parameters set, its endpoint picked, `max_tokens` fitted to the served context. Raises
    translate.ApiInputError for a request its API cannot serve (the agent's 400)."""
    config = state.config.default_proxy
    stream = body.get("stream") is True
    translation = TRANSLATIONS.get(api)
    # The policy the agent names (a run with several), else the configured model.
    model_name = served_model(body, config, lambda name: bool(state.models.endpoints(name)))
    if translation is None:
        upstream_body = body
        params = rewrite(body, api, mode, config, model_name)
    else:
        # Served as a chat call, a stream's chunks re-spoken in the agent's API as they come.
        upstream_body = translation.to_chat(body)
        if stream:
            upstream_body["stream"] = True
        params = rewrite(upstream_body, "chat.completions", mode, config, model_name)
    model = pick_endpoint(state.models.endpoints(model_name), rollout_id)
    if model is not None and any(key in upstream_body for key in LIMIT_KEYS):
        fit_max_tokens(upstream_body, params, await state.proxy.context.of(model.endpoint, params["model"]))
    return ProxyRequest(body, upstream_body, params, model_name, model, translation, stream)


def served_model(body: dict[str, Any], config: DefaultProxyConfig, registered: Callable[[str], bool]) -> str:
    """The model (policy) a call goes to: the one the agent names in `model` when the trainer
    registered endpoints under that name (a run with several policies, docs/policies.md), else
    the configured `model_name` (v1.0: every call goes to it, whatever the agent names)."""
    asked = body.get("model")
    if isinstance(asked, str) and asked != config.model_name and registered(asked):
        return asked
    return config.model_name


def rewrite(
    body: dict[str, Any], api: Api, mode: str, config: DefaultProxyConfig, model_name: str | None = None
) -> dict[str, Any]:
    """The parameters the proxy sets on the request; the agent's body is not modified.

    `model` is `model_name` (`served_model`; default the configured one), `temperature` the train or val one, token ids are
    always asked for, and log-probs in train mode when `include_log_probs` is set. A streamed
    call also asks for usage in the stream, so that the recorded answer has it.
    """
    params: dict[str, Any] = {
        "model": model_name or config.model_name,
        "temperature": (config.train if mode == "train" else config.val).temperature,
        "return_token_ids": True,
    }
    if mode == "train" and config.include_log_probs:
        if api == "chat.completions":
            params["logprobs"] = True
        else:
            # Completions take a count of top log-probs; any count returns the sampled token's.
            asked = body.get("logprobs")
            if not isinstance(asked, int) or isinstance(asked, bool) or asked < 0:
                params["logprobs"] = 1
    if mode == "train" and config.include_routed_experts and body.get("stream") is not True:
        # vLLM's MoE routes for R3 (proxy/experts.py). Not for streams: as v1.0, whose proxy
        # refuses streamed calls altogether, streamed calls record no routes.
        params["return_routed_experts"] = True
    if body.get("stream") is True:
        options = body.get("stream_options")
        params["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return params


def wants_usage_chunk(body: dict[str, Any]) -> bool:
    """Whether the agent itself asked for the usage chunk at the end of a stream."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def pick_endpoint(endpoints: list[Model], rollout_id: str) -> Model | None:
    """Sticky routing: `sha256(rollout_id)` over the endpoints sorted by URL, so all calls of a
    rollout reach the same server (and its prefix cache)."""
    if len(endpoints) < 2:
        return endpoints[0] if endpoints else None
    digest = hashlib.sha256(rollout_id.encode()).digest()
    return endpoints[int.from_bytes(digest[:8], "big") % len(endpoints)]
