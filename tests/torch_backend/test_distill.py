"""On-policy distillation: the per-token reverse KL and its advantage (hand-computed), the teacher's
prompt log-probs through the torch server's API, the advantage reaching the loss per token, and a
teacher of another vocabulary refused before training."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from agentlightning.config.schema import ConfigError
from agentlightning.tiny_model import build_tokenizer, byte_tokenizer
from agentlightning.torch_backend.config import load_torch_backend_config
from agentlightning.torch_backend.openai_backend import InferenceServer
from agentlightning.torch_backend.policy import PolicyUpdater
from agentlightning.trainer.distill import (
    DistillConfig,
    DistillError,
    Teacher,
    check_same_tokenizer,
    distill,
    parse_prompt_logprobs,
    reverse_kl,
    token_advantages,
)

from .test_policy import make_row
from .test_server import fresh_log_probs

pytestmark = pytest.mark.timeout(600)


# --- the signal, by hand ----------------------------------------------------------------------


def test_the_advantage_is_the_negative_reverse_kl_on_each_sampled_token() -> None:
    student = [-1.0, -0.5, -2.0, -0.25]
    teacher = [-0.25, -4.0, -3.0, -0.25]
    mask = [1, 0, 1, 1]  # the second token is context (tool output): no signal
    # A_t = log π_teacher − log π_student: +0.75 (teacher likes it more), 0 (context), −1.0, 0
    assert token_advantages(student, teacher, mask) == [0.75, 0.0, -1.0, 0.0]
    # kl_coef 2, plus 0.5 × the rollout's advantage 2.0 on trainable tokens only
    assert token_advantages(student, teacher, mask, 2.0, 2.0, 0.5) == [2.5, 0.0, -1.0, 1.0]
    # reverse KL estimate, log π_student − log π_teacher, mean over trainable tokens: (−0.75 + 1 + 0) / 3
    assert reverse_kl(student, teacher, mask) == pytest.approx(0.25 / 3)
    with pytest.raises(ValueError, match="3 student, 4 teacher log-probs for 4 tokens"):
        token_advantages(student[:3], teacher, mask)


def test_distill_sets_per_token_advantages_that_the_loss_uses(tiny_model: Any) -> None:
    row = make_row("r", [1, 2, 3], [4, 5, 6], advantage=2.0, mask=[1, 0, 1], log_probs=[-1.0, 0.0, -2.0])
    metrics = distill(
        [row], [[-0.5, -7.0, -2.5]], [row.rollout_log_probs or []], DistillConfig(reward_coef=0.25)
    )
    assert row.token_advantages == [0.5 + 0.5, 0.0, -0.5 + 0.5]
    assert metrics["distill/reverse_kl"] == pytest.approx((-0.5 + 0.5) / 2)
    batch = PolicyUpdater(tiny_model)._collate([row])
    assert batch.advantage[0].tolist() == [1.0, 0.0, 0.0]
    row.token_advantages = None  # the scalar advantage broadcast again
    assert PolicyUpdater(tiny_model)._collate([row]).advantage[0].tolist() == [2.0, 0.0, 2.0]


# --- the teacher --------------------------------------------------------------------------------


def test_the_torch_server_scores_a_sequence_as_a_forward_pass_does(
    server: InferenceServer, tiny_model: Any
) -> None:
    teacher = Teacher(DistillConfig(enable=True, teacher_url=server.base_url, teacher_tokenizer="demo"))
    assert teacher.model == "policy"  # the one model it serves
    prompt, response = [5, 17, 33, 8], [40, 41, 9]
    row = make_row("r", prompt, response, 0.0)
    (scores,) = teacher.score_rows([row])
    expected = fresh_log_probs(tiny_model, prompt, response, 1.0)
    assert torch.allclose(torch.tensor(scores), expected, atol=1e-4), (scores, expected.tolist())
    teacher.close()


def test_a_score_for_another_token_is_refused() -> None:
    entries = [None, {"7": {"logprob": -0.5}}, {"99": {"logprob": -1.0}}]
    assert parse_prompt_logprobs(entries, [1, 7, 99]) == [-0.5, -1.0]
    with pytest.raises(
        DistillError, match="scored tokens \\['99'\\] at position 2 where the student's sequence has 8"
    ):
        parse_prompt_logprobs(entries, [1, 7, 8])
    with pytest.raises(DistillError, match="returned 2 prompt log-probs for 3 tokens"):
        parse_prompt_logprobs(entries[:2], [1, 7, 8])


def test_a_teacher_of_another_vocabulary_is_refused() -> None:
    check_same_tokenizer(build_tokenizer(), build_tokenizer())  # the same: accepted
    with pytest.raises(ConfigError, match="the teacher's vocabulary differs from the student's"):
        check_same_tokenizer(build_tokenizer(), byte_tokenizer())


def test_the_distill_block_is_checked() -> None:
    def cfg(**distill: Any) -> Any:
        return OmegaConf.create({"algorithm": {"distill": distill}})

    config = load_torch_backend_config(cfg(enable=True, teacher_url="http://t/v1", teacher_tokenizer="demo"))
    assert config.distill.enable and config.distill.kl_coef == 1.0
    with pytest.raises(
        ConfigError, match=r"algorithm\.distill\.enable needs algorithm\.distill\.teacher_url"
    ):
        load_torch_backend_config(cfg(enable=True))
    with pytest.raises(ConfigError, match=r"did you mean algorithm\.distill\.kl_coef"):
        load_torch_backend_config(cfg(kl_coeff=1.0))
    with pytest.raises(ConfigError, match="kl_coef and reward_coef must be >= 0, not both 0"):
        load_torch_backend_config(
            cfg(enable=True, teacher_url="http://t/v1", teacher_tokenizer="demo", kl_coef=0.0)
        )


def test_the_torch_server_refuses_what_it_cannot_score(server: InferenceServer) -> None:
    import httpx

    body = {"model": "policy", "prompt": [5, 17, 33], "max_tokens": 1, "prompt_logprobs": 2}
    answer = httpx.post(f"{server.base_url}/completions", json=body, timeout=60, trust_env=False)
    assert answer.status_code == 400 and "ask prompt_logprobs=0" in answer.text
    body = {**body, "prompt_logprobs": 0, "stream": True}
    answer = httpx.post(f"{server.base_url}/completions", json=body, timeout=60, trust_env=False)
    assert answer.status_code == 400 and "prompt_logprobs with stream" in answer.text
