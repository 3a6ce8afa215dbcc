"""A scripted chat model that speaks like vLLM serving a Qwen2.5-style model.

What makes the examples' merge analysis meaningful is that token ids are made the way vLLM
makes them: the prompt is the conversation rendered by a real Hugging Face chat template
(Qwen2.5's hermes template, the Jinja text below) with the request's `tools`, tokenized by a
real `tokenizers` byte-level BPE (Qwen2's pre-tokenizer regex, trained here in code on a fixed
corpus: nothing is downloaded); the answer's ids are the tokenization of the scripted text
plus `<|im_end|>`, and tool calls are parsed from `<tool_call>{json}</tool_call>` text the
way vLLM's hermes parser does. Before rendering, assistant tool-call arguments are parsed
from their JSON string into an object and text content parts are joined, as vLLM does.

Only the *choice* of text is scripted: a `Policy` maps (messages, tools) to the model's raw
output. Nothing else is faked, so when a framework re-sends an earlier turn differently from
how the model wrote it, the next prompt's ids stop extending the previous ones, exactly as
they would on vLLM.

    with ScriptedChatModel(policy) as model:
        ... register model.base_url with the Gateway ...

It is served by the one OpenAI server (`agentlightning.openai_server`) with the fake model
server's scripted faults (`model_server.FakeModelServer`), a `PolicyBackend` in place of
the fake's toy model.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable
from functools import cache
from typing import Any, Self

from agentlightning.openai_server.backend import Answer, BadRequest, Call
from agentlightning.openai_server.shapes import usage
from tests.fakes.model_server import FakeModelServer, token_logprob

# Qwen2.5-Instruct's chat template (hermes tool calling), verbatim in layout.
QWEN25_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Qwen2's pre-tokenizer split (tokenizer.json of every Qwen2/2.5 model).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKER_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
VOCAB_SIZE = 1200

# What the BPE merges are learned from: the template's own text and typical agent traffic.
_CORPUS = [
    "You are a helpful AI assistant. Solve tasks using your tools. Reply with TERMINATE when the task has been completed.",
    "You may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:",
    "For each function call, return a json object with function name and arguments within XML tags:",
    '{"type": "function", "function": {"name": "calculate", "description": "Calculates/evaluates the given expression.", '
    '"parameters": {"type": "object", "properties": {"expression": {"type": "string", "title": "Expression"}}, '
    '"required": ["expression"]}}}',
    '{"name": "calculate", "arguments": {"expression": "(3 + 4) * 12 / 7"}}',
    "Output the answer when you are ready. The answer should be surrounded by three sharps, "
    "in the form of ### ANSWER: <answer> ###.",
    "How many apples does she have left? Natalia sold clips to 48 of her friends in April, and then "
    "she sold half as many clips in May. The answer is #### 72",
    "The result of the calculation is the answer to the question, so the final answer is",
    "Use the tool to compute the value, then answer the question with the number.",
]


@cache
def _tokenizer_json() -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    return tok.to_str()


@cache
def build_tokenizer() -> Any:
    """A `PreTrainedTokenizerFast` in Qwen2.5's shape with the hermes chat template."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(_tokenizer_json())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    # As in Qwen2.5: tool markers are added tokens but not special, so they reach the parser.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = QWEN25_CHAT_TEMPLATE
    return hf


# --- vLLM's request handling ------------------------------------------------------------------


def _content_text(content: Any) -> Any:
    """vLLM's "string" content format: text parts joined with newlines."""
    if isinstance(content, list):
        return "\n".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return content


def vllm_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as vLLM hands it to the template (arguments parsed, parts joined)."""
    out = []
    for message in messages:
        m = dict(message)
        m["content"] = _content_text(m.get("content"))
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            calls = []
            for call in m["tool_calls"]:
                call = json.loads(json.dumps(call))
                function = call.get("function") or {}
                arguments = function.get("arguments")
                if arguments and not isinstance(arguments, dict | list):
                    function["arguments"] = json.loads(arguments)
                elif not arguments:
                    function["arguments"] = {}
                calls.append(call)
            m["tool_calls"] = calls
        out.append(m)
    return out


def vllm_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tools as vLLM hands them to the template: its pydantic models dumped, declared fields
    first (`type`; `name`, `description`, `parameters`, None when absent), extra ones after."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function = dict(tool.get("function") or {})
        declared = {k: function.pop(k, None) for k in ("name", "description", "parameters")}
        out.append({"type": tool.get("type", "function"), "function": {**declared, **function}})
    return out


def render_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    return str(
        build_tokenizer().apply_chat_template(
            vllm_messages(messages), tools=vllm_tools(tools), add_generation_prompt=True, tokenize=False
        )
    )


def encode(text: str) -> list[int]:
    return list(build_tokenizer().encode(text, add_special_tokens=False))


def decode(ids: list[int]) -> str:
    return str(build_tokenizer().decode(ids, skip_special_tokens=False))


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def hermes_parse(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """vLLM's hermes parser (non-streamed): (content before the first call, tool calls)."""
    if "<tool_call>" not in text:
        return text, []
    try:
        raw = [json.loads(a or b) for a, b in _TOOL_CALL.findall(text)]
        calls = [
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
            }
            for c in raw
        ]
    except (json.JSONDecodeError, KeyError, TypeError):
        return text, []  # vLLM: an unparsable call stays text
    content = text[: text.find("<tool_call>")]
    return (content or None), calls


def tool_call_text(name: str, arguments: dict[str, Any], compact: bool = False) -> str:
    """What a Qwen2.5 model writes to call a tool: the template's own layout, or (compact) JSON
    without spaces, which a model may write too and the template will re-render differently."""
    if compact:
        call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, separators=(",", ":"))
        return f"<tool_call>\n{call}\n</tool_call>"
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


# --- the server -----------------------------------------------------------------------------

Policy = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]
"""(the request's messages, its tools) → the model's raw output text."""

_ids = itertools.count(1)


Record = Callable[[list[int], list[int]], None]
"""Told each call's (prompt ids, answer ids) as the model was asked and answered."""


def chat_response(body: dict[str, Any], policy: Policy, record: Record | None = None) -> dict[str, Any]:
    messages = body["messages"]
    tools = body.get("tools")
    prompt_ids = encode(render_prompt(messages, tools))
    text = policy(messages, tools)
    eos = build_tokenizer().convert_tokens_to_ids("<|im_end|>")
    ids = [*encode(text), eos]
    if record is not None:
        record(prompt_ids, ids)
    content, calls = hermes_parse(text)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "tool_calls": calls,
        "reasoning_content": None,
    }
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if calls else "stop",
        "stop_reason": None,
        "token_ids": ids if body.get("return_token_ids") else None,
        "logprobs": None,
    }
    if body.get("logprobs"):
        tokens = build_tokenizer().convert_ids_to_tokens(ids)
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": token_logprob(i, p), "bytes": list(t.encode()), "top_logprobs": []}
                for p, (i, t) in enumerate(zip(ids, tokens, strict=True))
            ]
        }
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model"),
        "choices": [choice],
        "usage": usage(len(prompt_ids), len(ids)),
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if body.get("return_token_ids") else None,
    }


class PolicyBackend:
    """The scripted model behind the one OpenAI server: non-streamed chat and vLLM's scale-out
    calls. A bad request or a policy bug answers 400 and its reason is kept in `errors`."""

    def __init__(
        self, policy: Policy, scale_out: bool = False, streams: bool = False, record: Record | None = None
    ) -> None:
        self.policy = policy
        self.record = record
        self.scale_out = scale_out
        self.streams = streams
        self.errors: list[str] = []
        self._rendered: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {}
        # The text of each generation until its derender, by the generation's request id: two
        # rollouts that write the same answer at once have the same token ids, not the same id.
        self._generated: dict[str, str] = {}

    async def _run(self, step: Callable[[dict[str, Any]], dict[str, Any]], body: Any) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(step, body)
        except Exception as exc:  # a bad request or a policy's bug: answer 400, keep the reason
            self.errors.append(f"{type(exc).__name__}: {exc}")
            raise BadRequest(f"{type(exc).__name__}: {exc}") from None

    async def chat(self, call: Call) -> Answer:
        if call.body.get("stream") and not self.streams:
            self.errors.append("ValueError: this model does not stream")
            raise BadRequest("ValueError: this model does not stream")
        answer = await self._run(self.chat_body, call.body)
        if call.body.get("stream"):
            return Answer(
                chunks=self.stream_chunks(
                    answer, bool((call.body.get("stream_options") or {}).get("include_usage"))
                )
            )
        return Answer(answer)

    def stream_chunks(self, answer: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
        """The whole answer as vLLM streams it with `return_token_ids`: the role (with the prompt's
        ids), the text and tool calls with the answer's ids, then the finish reason."""
        choice, message = answer["choices"][0], answer["choices"][0]["message"]
        head = {k: answer[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        delta: dict[str, Any] = {"content": message["content"] or ""}
        if message["tool_calls"]:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        body = {"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}
        if choice["token_ids"] is not None:
            body["token_ids"] = choice["token_ids"]
        first: dict[str, Any] = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "finish_reason": None,
        }
        last = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
        chunks = [
            {**head, "choices": [first], "prompt_token_ids": answer["prompt_token_ids"]},
            {**head, "choices": [body]},
            {**head, "choices": [last]},
        ]
        if include_usage:
            chunks.append({**head, "choices": [], "usage": answer["usage"]})
        return chunks

    async def completions(self, call: Call) -> Answer:
        self.errors.append("ValueError: this model serves chat completions only")
        raise BadRequest("ValueError: this model serves chat completions only")

    def models(self) -> Answer:
        return Answer({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "fake"}]})

    async def render(self, call: Call) -> dict[str, Any]:
        return await self._run(self.render_body, call.body)

    async def generate(self, call: Call) -> dict[str, Any]:
        return await self._run(self.generate_body, call.body)

    async def derender(self, call: Call) -> dict[str, Any]:
        return await self._run(self.derender_body, call.body)

    def chat_body(self, body: dict[str, Any]) -> dict[str, Any]:
        return chat_response(body, self.policy, self.record)

    def render_body(self, body: dict[str, Any]) -> dict[str, Any]:
        key = f"render-{next(_ids)}"
        # The policy chooses text from the messages: generate finds them by this key (a field
        # of the render answer, which the Gateway sends back with the token ids).
        self._rendered[key] = (body["messages"], body.get("tools"))
        prompt_ids = encode(render_prompt(body["messages"], body.get("tools")))
        sampling = {"max_tokens": body.get("max_tokens"), "logprobs": 0 if body.get("logprobs") else None}
        return {
            "token_ids": prompt_ids,
            "sampling_params": sampling,
            "model": body.get("model"),
            "scripted": key,
        }

    def generate_body(self, body: dict[str, Any]) -> dict[str, Any]:
        messages, tools = self._rendered.pop(body["scripted"])
        text = self.policy(messages, tools)
        ids = [*encode(text), build_tokenizer().convert_tokens_to_ids("<|im_end|>")]
        if self.record is not None:  # the prompt as the Gateway sent it (the model's own earlier turns kept)
            self.record(list(body["token_ids"]), ids)
        request_id = f"gen-{next(_ids)}"
        self._generated[request_id] = text
        logprobs = None
        if (body.get("sampling_params") or {}).get("logprobs") is not None:
            logprobs = {
                "content": [{"token_id": t, "logprob": token_logprob(t, p)} for p, t in enumerate(ids)]
            }
        calls = hermes_parse(text)[1]
        choice = {"index": 0, "token_ids": ids, "finish_reason": "stop", "logprobs": logprobs}
        return {"request_id": request_id, "choices": [choice], "tool_calls_seen": len(calls)}

    def derender_body(self, body: dict[str, Any]) -> dict[str, Any]:
        generation = body["generate_response"]
        ids = generation["choices"][0]["token_ids"]
        text = self._generated.pop(generation["request_id"])
        content, calls = hermes_parse(text)
        message = {"role": "assistant", "content": content, "tool_calls": calls, "reasoning_content": None}
        return {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": usage(int(body.get("prompt_tokens") or 0), len(ids)),
        }


class ScriptedChatModel(FakeModelServer):
    """The scripted model on a loopback port: the one OpenAI server over a `PolicyBackend`, with
    the fake model server's scripted faults (`script(Reply(status=503))`). A bad request or a
    policy bug answers 400 and its reason is kept in `errors`.

    `scale_out`: vLLM's scale-out endpoints (render / generate on tokens / derender), as with
    `vllm serve --enable-scale-out`; without them the Gateway passes calls through. `streams`: chat
    answers `stream: true` (the whole answer in one chunk), else 400. The server is
    lenient, as vLLM is about the fields its schema does not check. `record`: told every call's
    prompt and answer ids."""

    def __init__(
        self,
        policy: Policy,
        host: str = "127.0.0.1",
        scale_out: bool = False,
        streams: bool = False,
        record: Record | None = None,
    ) -> None:
        self.backend = PolicyBackend(policy, scale_out, streams, record)
        super().__init__(host, backend=self.backend, lenient=True)

    @property
    def errors(self) -> list[str]:
        return self.backend.errors

    def start(self, timeout: float = 30.0) -> Self:
        build_tokenizer()  # train once, before the first call
        return super().start(timeout)
