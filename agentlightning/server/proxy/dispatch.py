"""The dispatch stage: where a rewritten call is served.

A fault the run scripted (faults.py), the token path (token_exact.py; a stream answered as the
engine generates it, token_stream.py), or the rollout's inference server's own API (upstream.py,
with retries; a stream passed on as it comes, answers.py). The token path serves the calls that
continue an earlier turn of the attempt; a call that continues none (an attempt's first call, a
single-turn agent's every call) has the server's own rendering as its prompt, which vLLM's chat
API with `return_token_ids` serves in one request where the token path makes three. A stream
is its own answer and records the call itself; anything else comes back as what the server
answered, for the answer stage (answers.py).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
from starlette.responses import Response

from agentlightning.server.proxy.answers import StreamAnswer
from agentlightning.server.proxy.apis import BY_API, Api
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.proxy.history import continuable
from agentlightning.server.proxy.rewrite import ProxyRequest, pick_endpoint, wants_usage_chunk
from agentlightning.server.proxy.token_exact import ExactCall, messages_of
from agentlightning.server.proxy.token_stream import ChatStream, TokenStreamAnswer
from agentlightning.server.proxy.translate import ApiStream
from agentlightning.server.proxy.upstream import Forwarded
from agentlightning.server.state import GatewayState


async def dispatch(
    state: GatewayState,
    request: ProxyRequest,
    record: CallRecord,
    raw: bytes,
    api: Api,
    mode: str,
    started: float,
    done: Callable[[], None],
    rollout_gone: Callable[[], None],
) -> Response | tuple[Forwarded, ExactCall | None]:
    """A stream's answer; else what came back (and the token path's call, when it served it)."""
    runtime, model, body = state.proxy, request.model, request.body
    rollout_id, attempt_id = record.rollout_id, record.attempt_id
    upstream_body, params, translation = request.upstream_body, request.params, request.translation
    faults = runtime.faults
    if faults is not None and faults.strikes(mode, rollout_id, attempt_id, raw):
        return faults.failure(), None
    # The token path, where the endpoint serves it (or is not known yet not to).
    exact_ids = (
        state.config.default_proxy.token_exact
        and api != "completions"
        and model is not None
        and runtime.tokens.serves(model.endpoint) is not False
    )
    messages = messages_of(upstream_body) if api != "completions" else []
    turns = []
    if api != "completions":  # the attempt's earlier calls: what this call may continue
        turns = await runtime.tokens.recall(
            state.store, rollout_id, attempt_id, messages, model if exact_ids else None
        )
    # Continuing no earlier turn, the prompt is the server's own rendering: its chat API with
    # `return_token_ids` serves the call token-exact in one request, not three.
    if exact_ids and continuable(turns, messages):
        assert model is not None
        asked = (model, upstream_body, params, rollout_id, attempt_id, messages, turns)
        if request.stream:  # streamed as the engine generates (token_stream.py), in the agent's API
            started_stream = await runtime.tokens.stream(*asked)
            if isinstance(started_stream, tuple):
                prepared, generate = started_stream
                record.data["segment"] = prepared.segment
                events: ApiStream = (
                    ChatStream(wants_usage_chunk(body))
                    if translation is None
                    else translation.Stream(body, len(prepared.prompt))
                )
                return TokenStreamAnswer(
                    runtime.tokens,
                    model,
                    prepared,
                    generate,
                    record,
                    state.store,
                    started,
                    events,
                    done,
                    rollout_gone,
                )
            exact = started_stream
        else:
            exact = await runtime.tokens.call(*asked)
        if exact is not None:
            forwarded = exact.forwarded
            forwarded.tries = exact.tries
            record.data["segment"] = exact.segment
            return forwarded, exact
        exact_ids = False  # the endpoint turned out not to serve the token path: passed through
    if api != "completions":  # where this call's prompt breaks off from the attempt's calls
        record.before_save = lambda saved, call: runtime.tokens.observe(
            saved, call, upstream_body, messages, exact_ids
        )
    forwarded = await runtime.upstream.forward(
        lambda: pick_endpoint(state.models.endpoints(request.model_name), rollout_id),
        BY_API[api].upstream,
        orjson.dumps({**upstream_body, **params}),
        request.stream,
    )
    if forwarded.stream is not None:
        respoken = None if translation is None else translation.Stream(body, None)
        return StreamAnswer(
            forwarded, record, state.store, started, wants_usage_chunk(body), done, rollout_gone, respoken
        )
    return forwarded, None
