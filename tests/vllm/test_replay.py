"""A harness's own conversation on real vLLM: recorded against the scripted model, replayed by a
tiny Qwen2 fitted to it (`replay.py`), checked by `agl-doctor` against vLLM.

Claude Code is the harness: its conversation is the longest of the shipped ones (its own system
prompt and tools, thousands of tokens), it speaks the Anthropic Messages API and streams."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentlightning.doctor.analysis import PASS_THROUGH, TOKEN_PATH
from agentlightning.doctor.run import AgentSpec, DoctorSettings, run_doctor
from agentlightning.tiny_model import build_model
from agentlightning.torch_backend.vllm_server import VLLMServer, VLLMServerConfig
from tests.examples import test_swe_claude_code as claude
from tests.examples.stack import EXAMPLES
from tests.examples.swe_engineer import SOLVED, SWE_PYTHON
from tests.fakes.scripted_model import ScriptedChatModel, build_tokenizer, encode

from .replay import (
    MODEL,
    WINDOW_STEP,
    Call,
    Recorder,
    ReplayConflict,
    _answer_logits,
    _constants,
    _items,
    fit,
    save_replay_model,
    window_for,
)

EOS = build_tokenizer().convert_tokens_to_ids("<|im_end|>")


def _call(prompt: str, answer: str) -> Call:
    return Call(tuple(encode(prompt)), (*encode(answer), EOS))


def test_the_window_is_the_shortest_that_tells_apart_the_calls_that_want_different_answers() -> None:
    head = "You are a coding agent. " * 200
    near = [_call(head + "fix foo.py", "cat foo.py"), _call(head + "fix bar.py", "cat bar.py")]
    assert window_for([*near, near[0]]) == WINDOW_STEP
    assert len(_items([*near, near[0]], WINDOW_STEP)) == 2  # a repeated call is fitted once
    far = [_call("fix foo.py\n" + head, "cat foo.py"), _call("fix bar.py\n" + head, "cat bar.py")]
    tail = len(encode(head))
    assert tail < window_for(far) <= tail + 2 * WINDOW_STEP and window_for(far) % WINDOW_STEP == 0
    suffix = _call("Other words. " + head + "fix foo.py", "cat bar.py")  # ends as near[0] does, wholly
    with pytest.raises(ReplayConflict, match="no window up to"):
        window_for([near[0], suffix])


def test_the_answer_logits_from_windows_are_the_models_full_forward() -> None:
    model = build_model(replace(MODEL, sliding_window=40), seed=1, tokenizer=build_tokenizer())
    sequence = torch.randint(0, len(build_tokenizer()), (1, 200), generator=torch.Generator().manual_seed(0))
    full = model(input_ids=sequence).logits[0]
    # The 40 tokens the answer's first token sees, then 20 answer tokens: positions 110..169.
    positions, queries = torch.arange(110, 170)[None], torch.arange(39, 59)[None]
    ours = _answer_logits(model, sequence[:, 110:170], queries, _constants(model, positions, queries))[0]
    assert torch.allclose(ours, full[149:169], atol=1e-5), (ours - full[149:169]).abs().max()


def test_the_fitted_model_answers_long_prompts_from_their_last_tokens() -> None:
    """Fitted on windows, the model gives each recorded answer greedily from the whole prompt,
    and from a prompt that differs beyond its window (a date in a system prompt)."""
    head = "You are a coding agent. Today is 2026-12-07. " * 120
    calls = [
        _call(head + "\nfix the bug in main.py\n", "cat main.py"),
        _call(head + "\nthe tests pass\n", "done"),
    ]
    model = fit(calls)
    assert model.config.sliding_window == WINDOW_STEP
    moved = Call(
        tuple(encode(head.replace("12-07", "12-08", 1) + "\nfix the bug in main.py\n")), calls[0].answer
    )
    assert moved.prompt[-WINDOW_STEP:] == calls[0].prompt[-WINDOW_STEP:] and moved.prompt != calls[0].prompt
    for call in [*calls, moved]:
        out = model.generate(
            torch.tensor([call.prompt]), max_new_tokens=len(call.answer) + 2, do_sample=False
        )
        assert tuple(out[0, len(call.prompt) :].tolist()) == call.answer


@pytest.fixture
def claude_code() -> Iterator[AgentSpec]:
    claude.require_claude_code()
    yield AgentSpec(
        claude.AGENT, {"TASK_ID": "input.task_id"}, str(SWE_PYTHON), str(EXAMPLES / "swe"), claude.AGENT_ENV
    )


@pytest.mark.process
@pytest.mark.timeout(900)
def test_claude_code_replayed_on_vllm_is_one_row_and_vllm_reproduces_every_answer(
    vllm_ready: str, claude_code: AgentSpec, tmp_path: Path
) -> None:
    tasks = [{"task_id": SOLVED.instance_id}]
    recorder = Recorder("Claude Code")
    with ScriptedChatModel(claude.engineer(), scale_out=True, streams=True, record=recorder) as scripted:
        run_doctor(
            DoctorSettings(claude_code, tasks, tmp_path / "record", server=scripted.base_url, rollouts=1,
                           paths=(TOKEN_PATH,), timeout=600),
        )  # fmt: skip
    # read, fix, test, answer (the doctor's probes ask some again)
    assert len({(c.prompt, c.answer) for c in recorder.calls}) == 4
    model_dir = save_replay_model(tmp_path / "model", recorder.calls)
    config = VLLMServerConfig(python=vllm_ready, dtype="float32", max_model_len=MODEL.max_position_embeddings)
    server = VLLMServer(model_dir, "policy", config, tmp_path / "vllm")
    server.start()
    try:
        server.wait_ready()
        settings = DoctorSettings(claude_code, tasks, tmp_path / "replay", server=f"{server.base_url}/v1",
                                  rollouts=1, sample_calls=4, timeout=600)  # fmt: skip
        report = run_doctor(settings)
    finally:
        server.stop()
    assert report.verdict == "trainable", report.to_json()
    for path in (TOKEN_PATH, PASS_THROUGH):
        measured = report.path(path)
        assert measured is not None and measured.apis == {"anthropic.messages": 4}, report.to_json()
        assert "streaming" in measured.features and "tool calls" in measured.features
        assert str(measured.calls_per_rollout) == "4" and str(measured.rows_per_rollout) == "1"
        assert measured.rewards == [1.0] and measured.calls_failed == 0
    token_path = report.path(TOKEN_PATH)
    assert token_path is not None and token_path.token_exact_calls == 4
    # vLLM's render of each request is the recorded prompt, its greedy answer from the recorded
    # prompt ids is the recorded answer (all four calls), and its stream gives the same ids.
    checks = sorted(p.check for p in report.probes)
    assert checks == ["regenerate"] * 4 + ["render"] * 4 + ["stream"], report.to_json()
    assert all(p.ok for p in report.probes), report.to_json()
