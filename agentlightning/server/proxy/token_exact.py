"""Tokens in, tokens out: a chat call served on token ids, so the recorded prompt is what the
model saw and a multi-turn rollout stays one token sequence whatever its harness re-serializes.

With an upstream that serves vLLM's scale-out endpoints (`vllm serve --enable-scale-out`):

1. render the chat request with the server's own template (`/v1/chat/completions/render`);
2. where its history repeats an earlier call of the same attempt (request and answer, by
   meaning: history.py), put back that call's exact prompt + response tokens;
3. generate on the token ids (`/inference/v1/generate`), with log-probs;
4. turn the generated tokens into the chat answer with the server's parsers
   (`/v1/chat/completions/derender`: content, reasoning, tool calls).

A streamed chat call generates streamed and derenders each event as it comes (token_stream.py).
A call that continues no earlier call of its attempt would be generated on the server's own
rendering (step 2 changes nothing): it goes to the chat API instead, one request (dispatch.py),
and is noted in the history as the token path notes its calls (`observe`).

Whether an upstream serves these is found out on its first call that continues an earlier one
and remembered per endpoint; one that does not (403 without the flag, 404 elsewhere: our torch
engine, other servers; or a 200 whose body is not vLLM's render answer: a catch-all server, a
proxy in front of vLLM) is served by plain pass-through, said once in a warning, as is everything with
`default_proxy.token_exact: false`. A malformed answer of a later step is the call's 502,
naming the step and what was wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from agentlightning.log import get_logger
from agentlightning.model_call import CallTriplet
from agentlightning.schemas import EVENT_MODEL_REQUEST, Model
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.proxy.history import (
    AttemptHistory,
    Turn,
    answered,
    knows,
    meaning,
    prompt_and_segment,
    segment_of,
    tools_key,
)
from agentlightning.server.proxy.translate import sse
from agentlightning.server.proxy.upstream import Forwarded, UpstreamClient
from agentlightning.server.store import Store
from agentlightning.server.triplet import model_request_triplet

log = get_logger("proxy")
RENDER = "/chat/completions/render"
DERENDER = "/chat/completions/derender"
GENERATE = "/inference/v1/generate"  # at the server's root, not under /v1
UNSUPPORTED = frozenset({403, 404, 405, 501})
RECHECK_SECONDS = 300.0
# Chat request fields the generate step must not see again (the prompt is in token ids).
_NOT_FOR_RENDER = frozenset({"stream", "stream_options", "return_routed_experts"})


def messages_of(chat: dict[str, Any]) -> list[tuple[Any, ...]]:
    """A chat request's messages by meaning (history.meaning)."""
    return [meaning(m) for m in chat.get("messages") or [] if isinstance(m, dict)]


def render_request(chat: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The body to render: the chat request with the proxy's settings, without what only the
    answer's form needs (the proxy asks generate for a stream itself)."""
    request = {k: v for k, v in chat.items() if k not in _NOT_FOR_RENDER}
    request.update({k: v for k, v in params.items() if k not in _NOT_FOR_RENDER})
    return request


def server_root(endpoint: str) -> str:
    endpoint = endpoint.rstrip("/")
    return endpoint[:-3] if endpoint.endswith("/v1") else endpoint


@dataclass
class ExactCall:
    """The outcome of one token-exact call: a chat answer (with prompt and generated token ids,
    log-probs) or the failed step's `Forwarded`; `segment` says how the prompt was made."""

    forwarded: Forwarded
    response: dict[str, Any] | None = None
    segment: dict[str, Any] = field(default_factory=dict)
    tries: int = 0


@dataclass
class Prepared:
    """A token-path call rendered and its prompt made: what generate gets, and what the answer's
    derender and the attempt's history need."""

    request: dict[str, Any]  # the chat request as rendered
    generate_request: dict[str, Any]
    rendered_ids: list[int]
    prompt: list[int]
    messages: list[tuple[Any, ...]]
    tools: str
    segment: dict[str, Any]
    tries: int
    rollout_id: str
    attempt_id: str


class TokenExact:
    def __init__(self, upstream: UpstreamClient) -> None:
        self.upstream = upstream
        # endpoint → (serves render/generate/derender, when that was found)
        self.supported: dict[str, tuple[bool, float]] = {}
        self.warned: set[str] = set()  # endpoints already named in a pass-through warning
        self.history = AttemptHistory()

    def observe(
        self,
        record: CallRecord,
        call: CallTriplet[list[int]],
        chat: dict[str, Any],
        messages: list[tuple[Any, ...]],
        token_exact: bool,
    ) -> None:
        observe_chat_call(self.history, record, call, chat, messages, token_exact)

    async def recall(
        self,
        store: Store,
        rollout_id: str,
        attempt_id: str,
        messages: list[tuple[Any, ...]],
        model: Model | None,
    ) -> list[Turn]:
        """The attempt's turns, read back from the store when the request repeats an answer this
        Gateway did not record: another replica served that call, this one restarted, or it
        forgot the attempt. A read-back call whose prompt was continued is rendered again on
        `model` (the token path) to be continued in turn; on pass-through (`model` None) it
        only says where the next prompt breaks off."""
        turns = self.history.turns(rollout_id, attempt_id)
        if knows(turns, messages):
            return turns
        stored = [
            read
            for event in await store.list_events(rollout_id, attempt_id, EVENT_MODEL_REQUEST)
            if (read := turn_of(orjson.loads(event.record.data))) is not None
        ]
        read_back = [t for t, _ in stored]
        turn = answered(read_back, messages)
        if turn is None:  # an answer the attempt never got: the agent edited it
            return turns
        if turn.rendered is None and model is not None:
            request = next(r for t, r in stored if t is turn)
            rendered = await self._post(model, RENDER, request)
            if rendered.error is None and rendered.status == 200:
                answer, problem = read_answer(rendered.body, render_problem)
                if problem is None:
                    turn.rendered = answer["token_ids"]
        log.debug("history_read_back", rollout_id=rollout_id, attempt_id=attempt_id, calls=len(stored))
        self.history.replace(rollout_id, attempt_id, read_back)
        return self.history.turns(rollout_id, attempt_id)

    def serves(self, endpoint: str) -> bool | None:
        """True/False once known; None before the endpoint's first call, and again a while after
        it was found without the endpoints (it may have been restarted with the flag)."""
        known = self.supported.get(endpoint)
        if known is None:
            return None
        serves, since = known
        if not serves and time.monotonic() - since > RECHECK_SECONDS:
            return None
        return serves

    async def call(
        self,
        model: Model,
        chat: dict[str, Any],
        params: dict[str, Any],
        rollout_id: str,
        attempt_id: str,
        messages: list[tuple[Any, ...]],
        turns: list[Turn],
    ) -> ExactCall | None:
        """Serve one chat call on tokens. None: the endpoint has no token endpoints (now known)."""
        prepared = await self.prepare(model, chat, params, rollout_id, attempt_id, messages, turns)
        if not isinstance(prepared, Prepared):
            return prepared
        generated = await self._post(model, GENERATE, prepared.generate_request, root=True)
        return await self.generated(model, prepared, generated)

    async def stream(
        self,
        model: Model,
        chat: dict[str, Any],
        params: dict[str, Any],
        rollout_id: str,
        attempt_id: str,
        messages: list[tuple[Any, ...]],
        turns: list[Turn],
    ) -> tuple[Prepared, Forwarded] | ExactCall | None:
        """Start one chat call on tokens with generate streamed: the prepared call and generate's
        open event stream (token_stream.py reads it). An engine that answers generate whole is
        answered as `call` does; None: the endpoint has no token endpoints (now known)."""
        prepared = await self.prepare(model, chat, params, rollout_id, attempt_id, messages, turns)
        if not isinstance(prepared, Prepared):
            return prepared
        body = orjson.dumps({**prepared.generate_request, "stream": True})
        target = model.model_copy(update={"endpoint": server_root(model.endpoint)})
        generated = await self.upstream.forward(lambda: target, GENERATE, body, True)
        if generated.stream is not None:
            prepared.tries += generated.tries - 1
            return prepared, generated
        return await self.generated(model, prepared, generated)

    async def prepare(
        self,
        model: Model,
        chat: dict[str, Any],
        params: dict[str, Any],
        rollout_id: str,
        attempt_id: str,
        messages: list[tuple[Any, ...]],
        turns: list[Turn],
    ) -> Prepared | ExactCall | None:
        """Render the call and make its prompt (steps 1-2): the generate request to send; else the
        failed render's `ExactCall`, or None when the endpoint has no token endpoints. `messages`:
        the chat request's by meaning (`messages_of`); `turns`: the attempt's, as `recall` gave them."""
        request = render_request(chat, params)
        rendered = await self._post(model, RENDER, request)
        if rendered.error is None and rendered.status in UNSUPPORTED:
            self._pass_through(model.endpoint, f"{RENDER} answered {rendered.status}")
            return None
        if rendered.error is not None or rendered.status != 200:
            return ExactCall(rendered, tries=rendered.tries)
        generate_request, problem = read_answer(rendered.body, render_problem)
        if problem is not None:  # a 200 that is not vLLM's render: a catch-all server, another engine
            self._pass_through(model.endpoint, f"{RENDER} answered 200 with {problem}")
            return None
        self.supported[model.endpoint] = (True, time.monotonic())
        self.warned.discard(model.endpoint)
        rendered_ids: list[int] = generate_request["token_ids"]

        tools = tools_key(chat)
        prompt, segment = prompt_and_segment(turns, messages, tools, rendered_ids)
        sampling = dict(generate_request.get("sampling_params") or {})
        if isinstance(sampling.get("max_tokens"), int):
            # The server sized max_tokens for the rendered prompt; keep the same total length.
            sampling["max_tokens"] = max(1, sampling["max_tokens"] + len(rendered_ids) - len(prompt))
        if params.get("logprobs") and sampling.get("logprobs") is None:
            sampling["logprobs"] = 0
        generate_request["sampling_params"] = sampling
        generate_request["token_ids"] = prompt
        return Prepared(
            request,
            generate_request,
            rendered_ids,
            prompt,
            messages,
            tools,
            segment,
            rendered.tries,
            rollout_id,
            attempt_id,
        )

    async def generated(self, model: Model, prepared: Prepared, generated: Forwarded) -> ExactCall | None:
        """Generate's whole answer checked, then derendered (steps 3-4)."""
        tries = prepared.tries + generated.tries - 1  # each step's retries count, not the steps
        segment = prepared.segment
        if generated.error is None and generated.status in UNSUPPORTED:
            self._pass_through(model.endpoint, f"{GENERATE} answered {generated.status}")
            return None
        if generated.error is not None or generated.status != 200:
            return ExactCall(generated, segment=segment, tries=tries)
        generation, problem = read_answer(generated.body, generation_problem)
        if problem is not None:
            return ExactCall(malformed(generated, GENERATE, problem), segment=segment, tries=tries)
        prepared.tries = tries
        return await self.answer(model, prepared, generation)

    async def answer(self, model: Model, prepared: Prepared, generation: dict[str, Any]) -> ExactCall | None:
        """The whole generation as the chat answer (derender), noted in the attempt's history."""
        request, prompt, segment = prepared.request, prepared.prompt, prepared.segment
        derendered = await self._post(
            model,
            DERENDER,
            {
                "model": request.get("model"),
                "generate_response": _without_stop_token(generation),
                "prompt_tokens": len(prompt),
                "chat_request": request,
            },
        )
        tries = prepared.tries + derendered.tries - 1
        if derendered.error is None and derendered.status in UNSUPPORTED:
            self._pass_through(model.endpoint, f"{DERENDER} answered {derendered.status}")
            return None
        if derendered.error is not None or derendered.status != 200:
            return ExactCall(derendered, segment=segment, tries=tries)
        response, problem = read_answer(derendered.body, derender_problem)
        if problem is not None:
            return ExactCall(malformed(derendered, DERENDER, problem), segment=segment, tries=tries)
        response = _with_tokens(response, generation, prompt)
        choice = response["choices"][0]
        if choice.get("finish_reason") == "stop" and (choice.get("message") or {}).get("tool_calls"):
            # derender keeps the engine's reason; vLLM's chat path says tool_calls when it parsed some
            choice["finish_reason"] = "tool_calls"
        self.history.add(
            prepared.rollout_id,
            prepared.attempt_id,
            Turn(
                messages=prepared.messages,
                tools=prepared.tools,
                rendered=prepared.rendered_ids,
                prompt=prompt,
                response=choice["token_ids"],
                answer=meaning(choice.get("message") or {}),
                finished=choice.get("finish_reason") in ("stop", "tool_calls"),
            ),
        )
        return ExactCall(derendered, response, segment, tries)

    async def derender_event(
        self, model: Model, prepared: Prepared, event: dict[str, Any], state: Any
    ) -> tuple[dict[str, Any], Any] | str:
        """One event of generate's stream as the agent's chat chunk, with vLLM's streamed derender
        (the state it hands back goes with the next event); a str says what failed."""
        derendered = await self._post(
            model,
            DERENDER,
            {
                "stream": True,
                "model": prepared.request.get("model"),
                "generate_chunk": _without_stop_token(event),
                "stream_state": state,
                "prompt_tokens": len(prepared.prompt),
                "prompt_token_ids": prepared.prompt,
                "chat_request": prepared.request,
            },
        )
        if derendered.error is not None:
            return derendered.error
        where = f"{model.endpoint} answered the token path's streamed {DERENDER} step"
        if derendered.status != 200:
            return f"{where} {derendered.status}: {derendered.body[:1000].decode(errors='replace')}"
        answer, problem = read_answer(derendered.body, derender_chunk_problem)
        if problem is not None:
            return f"{where} with {problem} (it began: {derendered.body[:200].decode(errors='replace')})"
        return answer["chunk"], answer.get("stream_state")

    def _pass_through(self, endpoint: str, why: str) -> None:
        """The endpoint does not serve the token path (until re-checked): its calls are passed
        through. Said once per endpoint, where the user looks."""
        self.supported[endpoint] = (False, time.monotonic())
        if endpoint not in self.warned:
            self.warned.add(endpoint)
            log.warning(
                "token_path_off",
                endpoint=endpoint,
                reason=why,
                hint="calls to this endpoint are passed through, not token-exact; vLLM serves "
                "the token path with --enable-scale-out (set default_proxy.token_exact=false "
                "to pass every call through without trying)",
            )

    async def _post(self, model: Model, path: str, body: dict[str, Any], root: bool = False) -> Forwarded:
        target = model.model_copy(update={"endpoint": server_root(model.endpoint)}) if root else model
        return await self.upstream.forward(lambda: target, path, orjson.dumps(body), False)


# What vLLM's token endpoints answer (vllm/entrypoints/scale_out/token_in_token_out/protocol.py),
# checked before use: each function says what is wrong with an answer, None when nothing is.


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and t >= 0 for t in value)


def render_problem(answer: Any) -> str | None:
    """Render answers a `GenerateRequest`: the prompt's `token_ids` and its `sampling_params`."""
    if not isinstance(answer, dict):
        return "a JSON value that is not an object"
    if not _is_ids(answer.get("token_ids")) or not answer["token_ids"]:
        return "no 'token_ids' (a non-empty list of token ids)"
    if not isinstance(answer.get("sampling_params"), dict):
        return "no 'sampling_params' object"
    return None


def generation_problem(answer: Any) -> str | None:
    """Generate answers `choices[]`, each with the generated `token_ids` and maybe `logprobs.content[]`."""
    if not isinstance(answer, dict):
        return "a JSON value that is not an object"
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        return "no 'choices' (a non-empty list of objects)"
    if not _is_ids(choices[0].get("token_ids")):
        return "no 'choices[0].token_ids' (a list of token ids)"
    logprobs = choices[0].get("logprobs")
    if logprobs is not None:
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if not isinstance(logprobs, dict) or not (
            content is None or (isinstance(content, list) and all(isinstance(e, dict) for e in content))
        ):
            return "a 'choices[0].logprobs' that is not an object with a 'content' list"
    return None


def derender_problem(answer: Any) -> str | None:
    """Derender answers a chat completion: `choices[0].message`."""
    if not isinstance(answer, dict):
        return "a JSON value that is not an object"
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "no 'choices' (a non-empty list of objects)"
    if not isinstance(choices[0].get("message"), dict):
        return "no 'choices[0].message' object"
    return None


def generate_event_problem(event: Any) -> str | None:
    """A streamed generate event: `choices[0]` with the new `token_ids` (maybe none) and maybe
    `logprobs.content[]` (the same shape as the whole answer's)."""
    if isinstance(event, dict) and isinstance(event.get("choices"), list):
        choices = event["choices"]
        if choices and isinstance(choices[0], dict) and choices[0].get("token_ids") is None:
            event = {**event, "choices": [{**choices[0], "token_ids": []}, *choices[1:]]}
    return generation_problem(event)


def derender_chunk_problem(answer: Any) -> str | None:
    """Streamed derender answers `{chunk: <chat completion chunk>, stream_state}`."""
    if not isinstance(answer, dict):
        return "a JSON value that is not an object"
    chunk = answer.get("chunk")
    if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
        return "no 'chunk' (a chat completion chunk with 'choices')"
    if not all(isinstance(c, dict) for c in chunk["choices"]):
        return "a 'chunk.choices' that is not a list of objects"
    return None


def read_answer(body: bytes, problem_of: Callable[[Any], str | None]) -> tuple[Any, str | None]:
    """An upstream step's answer parsed, and what is wrong with it (None: nothing)."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, "a body that is not JSON"
    problem = problem_of(answer)
    return answer, None if problem is None else f"a body that is not vLLM's answer: {problem}"


def malformed(forwarded: Forwarded, path: str, problem: str) -> Forwarded:
    """A token-path step that answered 200 with a body it cannot use: the call's 502."""
    endpoint = forwarded.model.endpoint if forwarded.model is not None else "the inference server"
    head = forwarded.body[:200].decode(errors="replace")
    return Forwarded(
        502,
        forwarded.model,
        forwarded.tries,
        error=f"{endpoint} answered the token path's {path} step with {problem} (it began: {head})",
    )


def _without_stop_token(generation: dict[str, Any]) -> dict[str, Any]:
    """The generation as derender should read it: without the end-of-turn token that stopped it.

    vLLM's own chat path never puts the stopping token in the answer's text, but derender keeps
    special tokens for the tool parser, so `<|im_end|>` would end the content. The recorded ids keep
    it (the model produced it; pass-through records it too). A stop string (`stop_reason` a str)
    leaves no such token. An answer that is only the stop token leaves nothing to derender: vLLM
    refuses it, and the call falls back to pass-through."""
    choices = []
    for choice in generation.get("choices") or []:
        ids = choice.get("token_ids") or []
        if choice.get("finish_reason") == "stop" and not isinstance(choice.get("stop_reason"), str) and ids:
            choice = {**choice, "token_ids": ids[:-1]}
            logprobs = choice.get("logprobs") or {}
            if isinstance(logprobs.get("content"), list) and len(logprobs["content"]) == len(ids):
                choice["logprobs"] = {**logprobs, "content": logprobs["content"][:-1]}
        choices.append(choice)
    return {**generation, "choices": choices}


def _with_tokens(response: dict[str, Any], generation: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
    """The derendered chat answer with what a pass-through call records: the prompt's and the
    answer's token ids and the answer's log-probs (`logprobs.content[].logprob`)."""
    generated = (generation.get("choices") or [{}])[0]
    ids = generated.get("token_ids") or []
    content = ((generated.get("logprobs") or {}).get("content")) or None
    choice = response["choices"][0]
    choice["token_ids"] = ids
    if content is not None:
        choice["logprobs"] = token_logprobs(content)
    response["prompt_token_ids"] = prompt
    return response


def token_logprobs(content: list[dict[str, Any]]) -> dict[str, Any]:
    """Generate's log-probs (token ids, no text: that server has no tokenizer) in the chat
    answer's shape, `logprobs.content[].logprob`, as a pass-through call records them."""
    return {
        "content": [
            {"token": f"token_id:{e.get('token_id')}", "logprob": e.get("logprob"), "top_logprobs": []}
            for e in content
        ]
    }


def turn_of(data: dict[str, Any]) -> tuple[Turn, dict[str, Any]] | None:
    """A recorded chat-shaped call (a `model_request` event's data) as the turn it left, with the
    body that renders its request again; None for a call that left none (failed, no token ids)."""
    chat = data.get("chat_request") or data.get("request")
    response = data.get("response")
    if data.get("status") != "ok" or not isinstance(chat, dict) or not isinstance(response, dict):
        return None
    triplet = model_request_triplet(data)
    prompt, answer_ids = triplet["prompt_token_ids"], triplet["response_token_ids"]
    choices = response.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    if not prompt or not answer_ids or not isinstance(choice.get("message"), dict):
        return None  # completions have no message
    segment = data.get("segment") or {}
    continued = segment.get("continues") is True and segment.get("token_exact") is True
    turn = Turn(
        messages=messages_of(chat),
        tools=tools_key(chat),
        rendered=None if continued else prompt,  # a prompt not continued is the server's rendering
        prompt=prompt,
        response=answer_ids,
        answer=meaning(choice["message"]),
        finished=choice.get("finish_reason") in ("stop", "tool_calls"),
    )
    return turn, render_request(chat, data.get("params") or {})


def observe_chat_call(
    history: AttemptHistory,
    record: CallRecord,
    call: CallTriplet[list[int]],
    chat: dict[str, Any],
    messages: list[tuple[Any, ...]],
    token_exact: bool,
) -> None:
    """Note a call served by the server's chat API: its segment (whether the prompt the server
    rendered continues the attempt's previous call token for token, and if not, why and where:
    `segment.break`) and its turn. `token_exact`: the call's prompt is the one the token path
    would have made (no earlier turn it could continue: `history.continuable`), else it is a
    pass-through call. `call` is the record's `model_request_triplet`."""
    d = record.data
    response = d.get("response")
    if d.get("status") != "ok" or not isinstance(response, dict):
        return
    prompt, answer_ids = call["prompt_token_ids"], call["response_token_ids"]
    if not prompt:
        return
    tools = tools_key(chat)
    turns = history.turns(record.rollout_id, record.attempt_id)
    d["segment"] = segment_of(turns, messages, tools, prompt, token_exact)
    choices = response.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    history.add(
        record.rollout_id,
        record.attempt_id,
        Turn(
            messages=messages,
            tools=tools,
            rendered=prompt,
            prompt=prompt,
            response=answer_ids,
            answer=meaning(choice.get("message") or {}),
            finished=choice.get("finish_reason") in ("stop", "tool_calls"),
        ),
    )


def chat_stream(response: dict[str, Any], include_usage: bool) -> bytes:
    """A chat completion's event stream, made from the finished answer (token-exact calls
    generate first): the whole message in one chunk (with its token ids and log-probs), the
    finish reason, the usage chunk when asked for, then [DONE]."""
    choice = response["choices"][0]
    message = choice.get("message") or {}
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        delta["reasoning_content"] = reasoning
    if message.get("tool_calls"):
        delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(message["tool_calls"])]
    head = {
        "id": response.get("id"),
        "object": "chat.completion.chunk",
        "created": response.get("created"),
        "model": response.get("model"),
    }
    chunks = [
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": choice.get("logprobs"),
                    "finish_reason": None,
                    "token_ids": choice.get("token_ids"),
                }
            ],
            "prompt_token_ids": response.get("prompt_token_ids"),
        },
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]},
    ]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": response.get("usage")})
    return b"".join(sse("chunk", c, named=False) for c in chunks) + b"data: [DONE]\n\n"
