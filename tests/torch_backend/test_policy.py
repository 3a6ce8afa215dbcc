"""The GRPO/PPO update: direction, per-rollout weighting, clipping, micro-batching, KL, state."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest
import torch

from agentlightning.rows import TrainingRow
from agentlightning.torch_backend.policy import (
    ActorConfig,
    OptimConfig,
    PolicyUpdater,
    kl_penalty,
    policy_loss,
)
from agentlightning.trainer.shaping import set_loss_weights

from .tiny import fresh_copy

pytestmark = pytest.mark.timeout(600)  # a hang guard, not a speed test: machines may be busy


def make_row(
    rid: str,
    prompt: list[int],
    response: list[int],
    advantage: float,
    mask: list[int] | None = None,
    log_probs: list[float] | None = None,
) -> TrainingRow:
    return TrainingRow(
        rollout_id=rid,
        group_id="g",
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask if mask is not None else [1] * len(response),
        rollout_log_probs=log_probs,
        model_versions=[0] * len(response),
        reward=advantage,
        advantage=advantage,
    )


def toy_rows(seed: int = 0) -> list[TrainingRow]:
    rng = random.Random(seed)
    rows = []
    for i, adv in enumerate([1.0, -1.0, 1.0, -1.0]):
        prompt = [rng.randrange(256) for _ in range(5 + i)]
        response = [rng.randrange(256) for _ in range(6 + 2 * i)]
        rows.append(make_row(f"r{i}", prompt, response, adv))
    return rows


def with_rollout_log_probs(updater: PolicyUpdater, rows: list[TrainingRow]) -> None:
    for row, lp in zip(rows, updater.compute_log_probs(rows), strict=True):
        row.rollout_log_probs = [x if m else 0.0 for x, m in zip(lp, row.response_mask, strict=True)]


def fresh_log_probs(model: Any, prompt: list[int], response: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    return lp.gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1).tolist()


def test_recomputed_log_probs_match_a_plain_forward_pass(tiny_model: Any, tokenizer: Any) -> None:
    updater = PolicyUpdater(fresh_copy(tiny_model, tokenizer), ActorConfig(ppo_micro_batch_size_per_gpu=3))
    rows = toy_rows()
    for row, lp in zip(rows, updater.compute_log_probs(rows), strict=True):
        ref = fresh_log_probs(updater.model, row.prompt_ids, row.response_ids)
        assert lp == pytest.approx(ref, abs=1e-5)


def test_grpo_step_moves_positive_tokens_up_and_negative_down(tiny_model: Any, tokenizer: Any) -> None:
    updater = PolicyUpdater(
        fresh_copy(tiny_model, tokenizer), ActorConfig(optim=OptimConfig(lr=3e-3, weight_decay=0.0))
    )
    rows = toy_rows()
    with_rollout_log_probs(updater, rows)
    set_loss_weights(rows)
    before = updater.compute_log_probs(rows)
    metrics = updater.update([rows])
    after = updater.compute_log_probs(rows)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)  # fresh data: ratio 1
    assert metrics["actor/pg_clipfrac"] == 0.0
    for row, b, a in zip(rows, before, after, strict=True):
        delta = torch.tensor(a) - torch.tensor(b)
        if row.advantage > 0:
            assert delta.mean() > 0 and (delta > 0).float().mean() >= 0.8, delta
        else:
            assert delta.mean() < 0 and (delta < 0).float().mean() >= 0.8, delta


def test_context_tokens_do_not_contribute(tiny_model: Any, tokenizer: Any) -> None:
    """Masked (tool output) tokens carry no loss: garbage log-probs there change no gradient."""
    rows = [make_row("a", [1, 2, 3], [4, 5, 6, 7, 8], 1.0, mask=[1, 1, 0, 0, 1])]
    grads = []
    for ctx_adv in (0.0, 5.0):
        updater = PolicyUpdater(fresh_copy(tiny_model, tokenizer), ActorConfig())
        with_rollout_log_probs(updater, rows)
        set_loss_weights(rows)
        assert rows[0].loss_weight == pytest.approx(1 / 3)
        rows[0].rollout_log_probs[2] += ctx_adv  # type: ignore[index]  # garbage where masked
        updater.backward(rows)
        grads.append(grads_of(updater))
    assert torch.allclose(grads[0], grads[1])


def test_per_rollout_weights_sum_to_one_per_rollout_whatever_the_rows() -> None:
    rows = [
        make_row("x", [1], [1] * 10, 1.0),
        make_row("x", [1], [1] * 5, 1.0, mask=[1, 1, 0, 0, 1]),
        make_row("x", [1], [1] * 5, 1.0),
        make_row("y", [1], [1] * 4, -1.0),
        make_row("z", [1], [1, 1], 0.5, mask=[0, 0]),  # nothing trainable: no weight
    ]
    set_loss_weights(rows)
    total: dict[str, float] = {}
    for r in rows:
        total[r.rollout_id] = total.get(r.rollout_id, 0.0) + r.loss_weight * sum(r.response_mask)
    assert total["x"] == pytest.approx(0.5) and total["y"] == pytest.approx(0.5) and total["z"] == 0.0


def test_a_rollout_weighs_the_same_as_one_row_or_split_in_two(tiny_model: Any, tokenizer: Any) -> None:
    """Splitting a rollout's trajectory into two rows leaves the gradient unchanged."""
    prompt, resp1, ctx, resp2 = [10, 11, 12], [20, 21, 22, 23], [30, 31], [40, 41, 42]
    other = make_row("o", [50, 51], [60, 61, 62, 63, 64, 65], -1.0)
    merged = make_row("a", prompt, resp1 + ctx + resp2, 1.0, mask=[1] * 4 + [0] * 2 + [1] * 3)
    split = [
        make_row("a", prompt, resp1, 1.0),
        make_row("a", prompt + resp1 + ctx, resp2, 1.0),
    ]
    grads = []
    for rows in ([merged, other], [*split, other]):
        rows = [
            make_row(r.rollout_id, r.prompt_ids, r.response_ids, r.advantage, list(r.response_mask))
            for r in rows
        ]
        updater = PolicyUpdater(
            fresh_copy(tiny_model, tokenizer), ActorConfig(ppo_micro_batch_size_per_gpu=1)
        )
        with_rollout_log_probs(updater, rows)
        set_loss_weights(rows)
        assert sum(
            r.loss_weight * sum(r.response_mask) for r in rows if r.rollout_id == "a"
        ) == pytest.approx(0.5)
        updater.backward(rows)
        grads.append(grads_of(updater))
    assert torch.allclose(grads[0], grads[1], atol=1e-7, rtol=1e-4)


def grads_of(updater: PolicyUpdater) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in updater.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("dynamic", [False, True])
def test_micro_batches_accumulate_to_the_full_batch_gradient(
    tiny_model: Any, tokenizer: Any, dynamic: bool
) -> None:
    grads = []
    for micro in (1, 16):
        cfg = ActorConfig(
            ppo_micro_batch_size_per_gpu=micro,
            use_dynamic_bsz=dynamic and micro == 1,
            ppo_max_token_len_per_gpu=40,
        )
        updater = PolicyUpdater(fresh_copy(tiny_model, tokenizer), cfg)
        rows = toy_rows(seed=3)
        with_rollout_log_probs(updater, rows)
        set_loss_weights(rows)
        n_micro = len(list(updater.micro_batches(rows)))
        assert n_micro == (len(rows) if micro == 1 and not dynamic else 1 if micro == 16 else n_micro)
        if dynamic and micro == 1:
            assert 1 < n_micro < len(rows) + 1
        updater.backward(rows)
        grads.append(grads_of(updater))
    assert torch.allclose(grads[0], grads[1], atol=1e-7, rtol=1e-4)


def test_clipping_and_dual_clip() -> None:
    logp = torch.tensor([0.0, 0.0, 0.0, 0.0], requires_grad=True)
    old = torch.tensor([-1.0, -1.0, 1.0, -5.0])  # ratios e, e, 1/e, e^5
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, info = policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    loss.sum().backward()
    # A>0, ratio above 1+high: clipped (constant, no gradient).
    assert loss[0].item() == pytest.approx(-1.28) and logp.grad[0] == 0  # type: ignore[index]
    # A<0, ratio e: unclipped side is the max -> -A*ratio = e, below the dual clip 3.
    assert loss[1].item() == pytest.approx(torch.e, rel=1e-5) and logp.grad[1] != 0  # type: ignore[index]
    # A>0, ratio 1/e below 1-low: min(ratio, clip) -> loss = -ratio (keeps gradient).
    assert loss[2].item() == pytest.approx(-1 / torch.e, rel=1e-5)
    # A<0, huge ratio: the dual clip caps the loss at -A*clip_c = 3.
    assert loss[3].item() == pytest.approx(3.0) and logp.grad[3] == 0  # type: ignore[index]
    assert info["clipped"].tolist() == [1.0, 0.0, 0.0, 0.0]  # a huge ratio with A<0 is the dual clip's
    assert info["clipped_lower"].tolist() == [0.0, 0.0, 0.0, 1.0]


def test_kl_estimators() -> None:
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
    assert kl_penalty(logp, ref, "kl").tolist() == pytest.approx([0.5, 0.0])
    assert kl_penalty(logp, ref, "mse").tolist() == pytest.approx([0.125, 0.0])
    k3 = kl_penalty(logp, ref, "low_var_kl")
    assert k3[1] == 0 and k3[0] == pytest.approx(torch.exp(torch.tensor(-0.5)).item() + 0.5 - 1)


def test_kl_to_reference_and_recomputed_old_log_probs(tiny_model: Any, tokenizer: Any) -> None:
    cfg = ActorConfig(optim=OptimConfig(lr=1e-2), use_kl_loss=True, kl_loss_coef=0.1, ppo_epochs=2)
    updater = PolicyUpdater(fresh_copy(tiny_model, tokenizer), cfg)
    rows = toy_rows()  # no rollout log-probs: the old ones are recomputed
    set_loss_weights(rows)
    first = updater.update([rows])
    assert first["actor/old_log_prob_recomputed"] == 1.0
    assert first["actor/optimizer_steps"] == 2.0
    second = updater.update([rows])
    assert second["actor/kl_loss"] > first["actor/kl_loss"] >= 0.0


def test_checkpoint_state_round_trips(tiny_model: Any, tokenizer: Any) -> None:
    cfg = ActorConfig(optim=OptimConfig(lr=1e-3, lr_warmup_steps=3))
    a = PolicyUpdater(fresh_copy(tiny_model, tokenizer), cfg)
    rows = toy_rows()
    with_rollout_log_probs(a, rows)
    set_loss_weights(rows)
    a.update([rows])
    b = PolicyUpdater(fresh_copy(tiny_model, tokenizer, seed=9), cfg)
    buffer = io.BytesIO()  # through bytes, as a checkpoint on disk would be
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b.load_state_dict(torch.load(buffer, weights_only=True))
    assert b.steps == 1 and b.optimizer.param_groups[0]["lr"] == pytest.approx(
        a.optimizer.param_groups[0]["lr"]
    )
    a.update([rows])
    b.update([rows])
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.allclose(pa, pb)


def test_bad_rows_and_config_are_rejected(tiny_model: Any, tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="old_log_prob_source"):
        PolicyUpdater(fresh_copy(tiny_model, tokenizer), ActorConfig(old_log_prob_source="nope"))
    updater = PolicyUpdater(fresh_copy(tiny_model, tokenizer), ActorConfig())
    bad = make_row("a", [1], [2, 3], 1.0, mask=[1])
    with pytest.raises(ValueError, match="response_mask"):
        updater.compute_log_probs([bad])
    with pytest.raises(ValueError, match="empty prompt"):
        updater.compute_log_probs([make_row("a", [], [2], 1.0)])


def test_an_update_logs_the_training_health(tiny_model: Any, tokenizer: Any) -> None:
    """actor/entropy equals the loss-weighted entropy of a plain forward pass; on fresh data the
    sampler–trainer KL is 0 and every ratio 1."""
    updater = PolicyUpdater(fresh_copy(tiny_model, tokenizer), ActorConfig(optim=OptimConfig(lr=0.0)))
    rows = toy_rows()
    with_rollout_log_probs(updater, rows)
    set_loss_weights(rows)
    expected = 0.0
    with torch.no_grad():
        for row in rows:
            logits = updater.model(torch.tensor([row.prompt_ids + row.response_ids])).logits[0].float()
            lp = torch.log_softmax(logits, -1)[len(row.prompt_ids) - 1 : -1]
            expected += float(-(lp.exp() * lp).sum(-1).sum()) * row.loss_weight
    metrics = updater.update([rows])
    assert metrics["actor/entropy"] == pytest.approx(expected, rel=1e-4)
    assert metrics["actor/sampler_trainer_kl"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["actor/sampler_trainer_kl_k3"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["actor/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["actor/sampler_trainer_is_max"] == pytest.approx(1.0, abs=1e-4)
