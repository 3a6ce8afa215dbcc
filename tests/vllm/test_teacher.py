"""vLLM as the on-policy distillation teacher (`algorithm.distill.teacher_url`, docs/distill.md):
its prompt log-probs of the student's exact token sequence (`POST /v1/completions` with the ids as
the prompt and `prompt_logprobs: 0`) are the model's own log-probs of each token, as the torch
model computes them from the same weights; the advantages of a row follow from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentlightning.rows import TrainingRow
from agentlightning.trainer.distill import DistillConfig, Teacher, distill

from .conftest import ScriptedVLLM
from .scripted import FINAL_ANSWER, QUESTION


def _torch_log_probs(model_dir: Path, ids: list[int]) -> list[float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
    return logits.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def test_vllm_scores_the_students_tokens_as_the_model_does(vllm_server: ScriptedVLLM) -> None:
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=False
    )
    assert isinstance(text, str)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    response = tokenizer.encode(FINAL_ANSWER, add_special_tokens=False)
    teacher = Teacher(DistillConfig(enable=True, teacher_url=vllm_server.endpoint, teacher_tokenizer="x"))
    try:
        scores = teacher.score(prompt + response)
        expected = _torch_log_probs(vllm_server.model_dir, prompt + response)
        assert len(scores) == len(prompt) + len(response) - 1
        assert scores == pytest.approx(expected, abs=2e-3)

        # A row's response tokens scored, and the advantage each gets: teacher − student.
        row = TrainingRow(
            rollout_id="r",
            group_id="g",
            prompt_ids=prompt,
            response_ids=response,
            response_mask=[1] * len(response),
            rollout_log_probs=None,
            model_versions=[0] * len(response),
            reward=0.0,
        )
        (teacher_lp,) = teacher.score_rows([row])
        assert teacher_lp == pytest.approx(expected[len(prompt) - 1 :], abs=2e-3)
        student = [lp - 0.5 for lp in teacher_lp]  # a student less sure of each token, by half a nat
        metrics = distill([row], [teacher_lp], [student], teacher.config)
        assert row.token_advantages == pytest.approx([0.5] * len(response))
        assert metrics["distill/reverse_kl"] == pytest.approx(-0.5)
    finally:
        teacher.close()
