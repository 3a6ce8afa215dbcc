"""The torch backend's policy losses (vanilla/PPO, GSPO, CISPO), rollout correction (TIS, MIS) and
health statistics, each against a hand computation on one fixed batch: values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from agentlightning.torch_backend.losses import (
    RolloutCorrection,
    health_stats,
    rollout_correction_weights,
    token_policy_loss,
)

LN = math.log
MASK = torch.ones(1, 3)


def _logp(log_ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Trainable log-probs whose ratios to an old policy of 0s are exp(log_ratios)."""
    logp = torch.tensor([log_ratios], requires_grad=True)
    return logp, torch.zeros(1, len(log_ratios))


def test_vanilla_ppo_clip_and_dual_clip_by_hand() -> None:
    logp, old = _logp([LN(1.5), LN(0.5), 0.0])
    adv = torch.ones(1, 3)
    loss, info = token_policy_loss("vanilla", logp, old, adv, MASK, 0.2, 0.28, 3.0)
    # A=+1: max(−r, −clip(r, 0.8, 1.28)) = −1.28 (clipped), −0.5, −1
    assert loss.tolist()[0] == pytest.approx([-1.28, -0.5, -1.0])
    assert info["clipped"].tolist()[0] == [1.0, 0.0, 0.0]
    loss.sum().backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.5, -1.0])  # −A·r where not clipped
    logp, old = _logp([LN(1.5), LN(4.0), 0.0])
    loss, info = token_policy_loss("vanilla", logp, old, -adv, MASK, 0.2, 0.28, 3.0)
    # A=−1: max(r, clip(r)) = 1.5; r=4 → min(3, 4) = 3 (dual clip); 1
    assert loss.tolist()[0] == pytest.approx([1.5, 3.0, 1.0])
    assert info["clipped_lower"].tolist()[0] == [0.0, 1.0, 0.0]


def test_gspo_uses_the_sequence_ratio_by_hand() -> None:
    logp, old = _logp([LN(1.5), LN(0.5), 0.0])
    s = 0.75 ** (1 / 3)  # geometric mean of 1.5, 0.5, 1 = 0.90856
    loss, info = token_policy_loss("gspo", logp, old, torch.ones(1, 3), MASK, 0.05, 0.05, 3.0)
    # A=+1, s below 1−0.05: max(−s, −0.95) = −s, unclipped, on every token
    assert loss.tolist()[0] == pytest.approx([-s] * 3)
    assert info["ratio"].tolist()[0] == pytest.approx([s] * 3)
    loss.sum().backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([-s] * 3)  # each token: −A·s·∂logp_t
    logp, old = _logp([LN(1.5), LN(0.5), 0.0])
    loss, info = token_policy_loss("gspo", logp, old, -torch.ones(1, 3), MASK, 0.05, 0.05, 3.0)
    assert loss.tolist()[0] == pytest.approx([0.95] * 3)  # A=−1: max(s, 0.95), clipped: no gradient
    assert info["clipped"].tolist()[0] == [1.0, 1.0, 1.0]
    loss.sum().backward()
    assert logp.grad is not None
    assert logp.grad.abs().sum().item() == 0.0


def test_gspo_ignores_masked_tokens_in_the_sequence_ratio() -> None:
    logp, old = _logp([LN(1.5), LN(0.5), 5.0])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, info = token_policy_loss("gspo", logp, old, torch.ones(1, 3), mask, 0.5, 0.5, 3.0)
    assert info["ratio"][0, 0].item() == pytest.approx(math.sqrt(0.75))


def test_cispo_clips_and_detaches_the_weight_but_keeps_every_gradient() -> None:
    logp, old = _logp([LN(1.5), LN(0.5), 0.0])
    loss, info = token_policy_loss("cispo", logp, old, torch.ones(1, 3), MASK, 0.2, 0.28, 3.0)
    w = [1.28, 0.8, 1.0]  # clip(r, 0.8, 1.28)
    assert loss.tolist()[0] == pytest.approx([-w[0] * LN(1.5), -w[1] * LN(0.5), 0.0])
    assert info["clipped"].tolist()[0] == [1.0, 1.0, 0.0]
    loss.sum().backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([-1.28, -0.8, -1.0])  # PPO would give 0 on token 1


def test_an_unknown_loss_mode_is_refused() -> None:
    logp, old = _logp([0.0])
    with pytest.raises(ValueError, match="loss_mode"):
        token_policy_loss("ppo2", logp, old, torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.2, 3.0)


# Two rows; log ρ = old − rollout: row 1 [ln 3, ln 0.5, 0], row 2 [0, ln 2, (context)]
OLD = torch.zeros(2, 3)
ROLLOUT = torch.tensor([[-LN(3.0), -LN(0.5), 0.0], [0.0, -LN(2.0), 0.0]])
RC_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_tis_truncates_each_ratio_by_hand() -> None:
    w, stats = rollout_correction_weights(OLD, ROLLOUT, RC_MASK, RolloutCorrection("token", 2.0))
    assert (w * RC_MASK).flatten().tolist() == pytest.approx([2.0, 0.5, 1.0, 1.0, 2.0, 0.0])
    assert stats["rollout_is_clipped_frac"] == pytest.approx(1 / 5)  # ρ=3 only
    assert stats["rollout_is_weight_mean"] == pytest.approx(6.5 / 5)


def test_sequence_is_truncates_the_product_by_hand() -> None:
    w, stats = rollout_correction_weights(OLD, ROLLOUT, RC_MASK, RolloutCorrection("sequence", 1.8))
    assert w[:, 0].tolist() == pytest.approx([1.5, 1.8])  # Π: 3 · 0.5 · 1 = 1.5; 1 · 2 = 2 → 1.8
    assert stats["rollout_is_clipped_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("level", "upper", "kept"),
    [
        ("geometric", 1.2, [1.0, 0.0]),  # 1.5^(1/3) = 1.145 in range; 2^(1/2) = 1.414 out
        ("sequence", 1.6, [1.0, 0.0]),  # 1.5 in range; 2 out
        ("sequence", 2.5, [1.0, 1.0]),
    ],
)
def test_mis_masks_rows_out_of_range_by_hand(level: str, upper: float, kept: list[float]) -> None:
    w, stats = rollout_correction_weights(
        OLD, ROLLOUT, RC_MASK, RolloutCorrection(rollout_rs=level, rollout_rs_threshold=upper)
    )
    assert w[:, 0].tolist() == kept
    assert stats["rollout_rs_masked_frac"] == pytest.approx(kept.count(0.0) / 2)


def test_mis_lower_bound_masks_rows_the_trainer_finds_unlikely() -> None:
    rollout = torch.tensor([[LN(4.0), 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 1: ρ = 1/4
    w, _ = rollout_correction_weights(
        OLD, rollout, RC_MASK, RolloutCorrection(rollout_rs="sequence", rollout_rs_threshold=2.0)
    )
    assert w[:, 0].tolist() == [0.0, 1.0]  # lower bound 1/2 by default


def test_health_stats_sampler_trainer_kl_and_ratios_by_hand() -> None:
    logp = torch.tensor([[LN(0.5), LN(0.25)]])
    rollout = torch.tensor([[LN(0.25), LN(0.25)]])
    weight = torch.tensor([[0.5, 0.5]])
    ratio = torch.tensor([[1.0, 1.5]])
    sums, maxes = health_stats(logp, rollout, ratio, weight, torch.ones(1, 2))
    # k1 = log π_s − log π_t: ln(0.5), 0; k3 = (ρ − 1) − ln ρ with ρ = π_t/π_s: 1 − ln 2, 0
    assert sums["sampler_trainer_kl"] == pytest.approx(0.5 * LN(0.5))
    assert sums["sampler_trainer_kl_k3"] == pytest.approx(0.5 * (1 - LN(2.0)))
    assert sums["sampler_trainer_is_mean"] == pytest.approx(0.5 * 2 + 0.5 * 1)
    assert maxes["sampler_trainer_is_max"] == pytest.approx(2.0)
    assert sums["ratio_mean"] == pytest.approx(1.25)
    assert maxes["ratio_max"] == pytest.approx(1.5)


def test_rollout_correction_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="rollout_is"):
        RolloutCorrection(rollout_is="tokens").validate()
    with pytest.raises(ValueError, match="rollout_rs"):
        RolloutCorrection(rollout_rs="token").validate()
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        RolloutCorrection(rollout_is="token", rollout_is_threshold=0).validate()
