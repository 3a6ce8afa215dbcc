"""The scripted model renders and parses like vLLM with a Qwen2.5 template, and the merge-break
analysis names the real cause. No processes: token ids are built directly (and served in-process once)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from agentlightning.aggregation import AggregationStats, aggregate_rollout
from tests.examples.stack import first_merge_break
from tests.fakes.model_server import Reply
from tests.fakes.scripted_model import (
    ScriptedChatModel,
    build_tokenizer,
    chat_response,
    decode,
    encode,
    hermes_parse,
    render_prompt,
    tool_call_text,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 17 * 24?"}]


def _triplet(body: dict[str, Any], text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    response = chat_response({**body, "return_token_ids": True}, lambda m, t: text)
    triplet = {
        "event_type": "model_request",
        "data": {
            "prompt_token_ids": response["prompt_token_ids"],
            "response_token_ids": response["choices"][0]["token_ids"],
            "response_log_probs": None,
        },
    }
    return response, triplet


def _two_calls(compact: bool, tools_on_second: bool) -> list[dict[str, Any]]:
    first, t1 = _triplet(
        {"messages": QUESTION, "tools": TOOLS},
        tool_call_text("calculate", {"expression": "17 * 24"}, compact),
    )
    message = first["choices"][0]["message"]
    history = [
        *QUESTION,
        {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "408"},
    ]
    _, t2 = _triplet({"messages": history, "tools": TOOLS if tools_on_second else None}, "ANSWER: 408")
    return [t1, t2]


def test_the_tokenizer_is_lossless_and_keeps_markers_whole() -> None:
    text = 'é 17×24 <tool_call>\n{"a": 1}\n</tool_call><|im_end|>'
    assert decode(encode(text)) == text
    tok = build_tokenizer()
    assert tok.convert_tokens_to_ids("<tool_call>") in encode(text)
    assert tok.convert_tokens_to_ids("<|im_end|>") == encode("<|im_end|>")[0]


def test_prompt_renders_tools_and_the_generation_prompt() -> None:
    prompt = render_prompt(QUESTION, TOOLS)
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]) in prompt
    assert prompt.endswith("<|im_start|>user\nWhat is 17 * 24?<|im_end|>\n<|im_start|>assistant\n")


def test_hermes_parsing_like_vllm() -> None:
    content, calls = hermes_parse(
        'Let me see.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "1"}}\n</tool_call>'
    )
    assert content == "Let me see.\n"
    assert [c["function"] for c in calls] == [{"name": "calculate", "arguments": '{"expression": "1"}'}]
    assert hermes_parse("<tool_call>\nnot json\n</tool_call>") == ("<tool_call>\nnot json\n</tool_call>", [])
    assert hermes_parse("ANSWER: 4") == ("ANSWER: 4", [])


def test_template_style_tool_calls_merge_into_one_row() -> None:
    calls = _two_calls(compact=False, tools_on_second=True)
    rows = aggregate_rollout(calls, "r", "g", 1.0, stats=AggregationStats())
    assert len(rows) == 1 and rows[0].n_calls == 2
    assert first_merge_break(calls) is None


def test_compact_tool_json_is_re_rendered_differently() -> None:
    calls = _two_calls(compact=True, tools_on_second=True)
    assert len(aggregate_rollout(calls, "r", "g", 1.0, stats=AggregationStats())) == 2
    reason = first_merge_break(calls)
    assert reason is not None and "re-renders an earlier model turn" in reason
    assert '"calculate","arguments"' in reason and '"calculate", "arguments"' in reason


def test_a_call_without_tools_renders_another_system_prompt() -> None:
    calls = _two_calls(compact=False, tools_on_second=False)
    assert len(aggregate_rollout(calls, "r", "g", 1.0, stats=AggregationStats())) == 2
    assert "sent without `tools`" in (first_merge_break(calls) or "")


def test_served_over_http_by_the_fake_servers_layer_with_its_faults_and_scale_out() -> None:
    """The scripted model is the one OpenAI server over a `PolicyBackend`, with the fake's faults: answers
    as `chat_response` builds them, a scripted fault first, 400 (reason kept) for what it cannot do,
    and vLLM's scale-out calls that round-trip to the same tokens."""
    text = tool_call_text("calculate", {"expression": "17 * 24"})
    body = {"model": "policy", "messages": QUESTION, "tools": TOOLS, "return_token_ids": True}
    with ScriptedChatModel(lambda m, t: text, scale_out=True) as model:
        model.script(Reply(status=503))
        with httpx.Client(base_url=model.base_url, trust_env=False, timeout=30) as http:
            assert http.post("/chat/completions", json=body).status_code == 503
            answer = http.post("/chat/completions", json=body).json()
            expected = chat_response(body, lambda m, t: text)
            assert answer["prompt_token_ids"] == expected["prompt_token_ids"]
            assert answer["choices"][0]["token_ids"] == expected["choices"][0]["token_ids"]
            assert answer["choices"][0]["finish_reason"] == "tool_calls"
            assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "calculate"

            streamed = http.post("/chat/completions", json={**body, "stream": True})
            assert streamed.status_code == 400 and "does not stream" in streamed.json()["error"]["message"]
            assert model.errors == ["ValueError: this model does not stream"]

            rendered = http.post("/chat/completions/render", json=body).json()
            assert rendered["token_ids"] == expected["prompt_token_ids"]
            generated = http.post(
                f"{model.url}/inference/v1/generate",
                json={"token_ids": rendered["token_ids"], "scripted": rendered["scripted"]},
            ).json()
            assert generated["choices"][0]["token_ids"] == expected["choices"][0]["token_ids"]
            derendered = http.post(
                "/chat/completions/derender", json={"generate_response": generated, "model": "policy"}
            ).json()
            assert derendered["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "calculate"


def test_two_rollouts_generating_the_same_answer_at_once_both_derender() -> None:
    """Two rollouts that write the same answer at the same moment (the scripted engineer's last
    words in a solved and a wrong rollout) have the same token ids: each derender finds its own
    generation, whichever comes first."""
    body = {"model": "policy", "messages": QUESTION, "tools": TOOLS}
    with ScriptedChatModel(lambda m, t: "Done.", scale_out=True) as model:
        with httpx.Client(base_url=model.base_url, trust_env=False, timeout=30) as http:
            generated = []
            for _ in range(2):
                rendered = http.post("/chat/completions/render", json=body).json()
                generated.append(
                    http.post(
                        f"{model.url}/inference/v1/generate",
                        json={"token_ids": rendered["token_ids"], "scripted": rendered["scripted"]},
                    ).json()
                )
            assert generated[0]["choices"][0]["token_ids"] == generated[1]["choices"][0]["token_ids"]
            for generation in reversed(generated):
                answer = http.post(
                    "/chat/completions/derender", json={"generate_response": generation, "model": "policy"}
                )
                assert answer.status_code == 200, answer.text
                assert answer.json()["choices"][0]["message"]["content"] == "Done."
            assert model.errors == []
