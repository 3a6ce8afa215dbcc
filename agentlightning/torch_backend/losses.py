"""Per-token policy losses, rollout correction and training-health statistics of the torch backend.

Every function works on `[B, K]` tensors (rows × response tokens, right-aligned) and returns a
per-token loss; the caller weighs it with the trainer core's loss weights
(`Σ loss_weight · mask · token_loss`), which carry the aggregation (`loss_agg_mode`). With
`r = exp(logp − old_logp)`, A the advantage, ε_l/ε_h = `clip_ratio_low/high`, c = `clip_ratio_c`:

* `vanilla` (PPO, verl's `compute_policy_loss_vanilla`): `max(−A·r, −A·clip(r, 1−ε_l, 1+ε_h))`,
  for A < 0 also `min(·, −A·c)` (dual clip). GRPO, Dr.GRPO, DAPO, RLOO and REINFORCE++ use it.
* `gspo` (GSPO, Zheng et al. 2025, arXiv:2507.18071; verl's `gspo`): the ratio of a sequence
  (a row) is the geometric mean of its tokens' ratios, `s = exp(mean_t (logp − old_logp))`,
  and each token uses `s_t = sg(s) · exp(logp − sg(logp))` (value s, gradient of its own
  log-prob) in `max(−A·s_t, −A·clip(s_t, 1−ε_l, 1+ε_h))`.
* `cispo` (CISPO, MiniMax-M1 2025, arXiv:2506.13585): `−sg(clip(r, 1−ε_l, 1+ε_h)) · A · logp`:
  the IS weight is clipped and detached, but no token's gradient is cut off.

Rollout correction (verl's `algorithm.rollout_correction` names) reweighs the loss by how far
the sampler's log-probs (`rollout_log_probs`, possibly from an older policy) are from the
trainer's old policy, ρ_t = exp(old_logp − rollout_logp):

* `rollout_is: token`: truncated IS per token, `min(ρ_t, C)` (TIS);
  `sequence`: one weight per row, `min(Π_t ρ_t, C)`; C = `rollout_is_threshold`.
* `rollout_rs: sequence | geometric`: masked IS (MIS) — a row whose ratio (`Π_t ρ_t`, or its
  geometric mean `exp(mean_t log ρ_t)`) is outside `[rollout_rs_threshold_lower,
  rollout_rs_threshold]` is masked out of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_MODES = ("vanilla", "gspo", "cispo")
V1_LOSS_MODE = "per_rollout_mean"  # v1.0's name of its loss: the vanilla loss on the core's weights
IS_LEVELS = (None, "token", "sequence")
RS_LEVELS = (None, "sequence", "geometric")


def _row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)


def token_policy_loss(
    mode: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token loss of `mode` and per-token indicators (`clipped`, `clipped_lower`,
    `approx_kl`, `ratio`) for metrics."""
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    if mode == V1_LOSS_MODE:
        mode = "vanilla"
    if mode == "gspo":
        seq_log_ratio = _row_mean(log_ratio, mask).detach().unsqueeze(-1)
        ratio = torch.exp((logp - logp.detach() + seq_log_ratio).clamp(max=10.0))
        l1 = -advantage * ratio
        l2 = -advantage * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        loss = torch.maximum(l1, l2)
        clipped = (l2 > l1).float()
        clipped_lower = torch.zeros_like(loss)
    elif mode == "cispo":
        ratio = log_ratio.exp()
        weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
        loss = -advantage * weight * logp
        clipped = (weight != ratio.detach()).float()
        clipped_lower = torch.zeros_like(loss)
    elif mode == "vanilla":
        ratio = log_ratio.exp()
        l1 = -advantage * ratio
        l2 = -advantage * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        clipped_loss = torch.maximum(l1, l2)
        l3 = -advantage * clip_c
        dual = torch.minimum(l3, clipped_loss)
        loss = torch.where(advantage < 0, dual, clipped_loss)
        clipped = (l2 > l1).float()
        clipped_lower = ((clipped_loss > l3) & (advantage < 0)).float()
    else:
        raise ValueError(f"policy_loss.loss_mode must be one of {', '.join(LOSS_MODES)}, got {mode!r}")
    info = {
        "clipped": clipped,
        "clipped_lower": clipped_lower,
        "approx_kl": -log_ratio.detach(),
        "ratio": ratio.detach(),
    }
    return loss, info


@dataclass
class RolloutCorrection:
    """`algorithm.rollout_correction.*` (verl's names) that the torch backend reads."""

    rollout_is: str | None = None  # null | token (TIS) | sequence
    rollout_is_threshold: float = 2.0  # C: the cap of the IS weights
    rollout_rs: str | None = None  # null | sequence | geometric (MIS: mask rows out of range)
    rollout_rs_threshold: float = 2.0  # upper bound of the row ratio
    rollout_rs_threshold_lower: float | None = None  # None: 1 / rollout_rs_threshold

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None

    def validate(self) -> None:
        key = "algorithm.rollout_correction"
        if self.rollout_is not in IS_LEVELS:
            raise ValueError(f"{key}.rollout_is must be null, token or sequence, got {self.rollout_is!r}")
        if self.rollout_rs not in RS_LEVELS:
            raise ValueError(f"{key}.rollout_rs must be null, sequence or geometric, got {self.rollout_rs!r}")
        if self.rollout_is_threshold <= 0:
            raise ValueError(f"{key}.rollout_is_threshold must be > 0, got {self.rollout_is_threshold}")
        if self.rollout_rs_threshold <= 0:
            raise ValueError(f"{key}.rollout_rs_threshold must be > 0, got {self.rollout_rs_threshold}")
        if self.rollout_rs_threshold_lower is not None and not (
            0 <= self.rollout_rs_threshold_lower <= self.rollout_rs_threshold
        ):
            raise ValueError(f"{key}.rollout_rs_threshold_lower must be in [0, rollout_rs_threshold]")


def rollout_correction_weights(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrection
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token factors (IS weight × RS mask, detached) and their statistics over trainable tokens."""
    log_rho = ((old_logp - rollout_logp) * mask).clamp(-20.0, 20.0).detach()
    n_tokens = mask.sum().clamp_min(1.0)
    rows = mask.sum(-1) > 0
    n_rows = rows.sum().clamp_min(1)
    weight = torch.ones_like(log_rho)
    stats: dict[str, float] = {}
    if rc.rollout_is == "token":
        rho = log_rho.exp()
        weight = rho.clamp(max=rc.rollout_is_threshold)
        stats["rollout_is_clipped_frac"] = float(
            ((rho > rc.rollout_is_threshold).float() * mask).sum() / n_tokens
        )
    elif rc.rollout_is == "sequence":
        seq = log_rho.sum(-1).clamp(-20.0, 20.0).exp()
        capped = seq.clamp(max=rc.rollout_is_threshold)
        weight = capped.unsqueeze(-1).expand_as(log_rho)
        stats["rollout_is_clipped_frac"] = float(((seq > rc.rollout_is_threshold) & rows).sum() / n_rows)
    if rc.rollout_rs is not None:
        if rc.rollout_rs == "geometric":
            log_seq = log_rho.sum(-1) / mask.sum(-1).clamp_min(1.0)
        else:
            log_seq = log_rho.sum(-1)
        seq = log_seq.clamp(-20.0, 20.0).exp()
        lower = rc.rollout_rs_threshold_lower
        if lower is None:
            lower = 1.0 / rc.rollout_rs_threshold
        keep = ((seq <= rc.rollout_rs_threshold) & (seq >= lower)).float()
        weight = weight * keep.unsqueeze(-1)
        stats["rollout_rs_masked_frac"] = float((((1 - keep) > 0) & rows).sum() / n_rows)
    masked_weight = weight * mask
    stats["rollout_is_weight_mean"] = float(masked_weight.sum() / n_tokens)
    return weight, stats


def health_stats(
    logp: torch.Tensor,
    rollout_logp: torch.Tensor | None,
    ratio: torch.Tensor,
    weight: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[dict[str, float], dict[str, float]]:
    """Training-health numbers, as (weighted sums over the mini-batch, maxima): the policy ratio's
    mean and max, and with the sampler's log-probs the sampler–trainer KL (k1 and k3 estimates of
    KL(π_sampler ‖ π_trainer) from the sampled tokens) and the sampler→trainer IS ratio."""
    sums: dict[str, float] = {"ratio_mean": float((ratio * weight).sum())}
    maxes: dict[str, float] = {"ratio_max": float(ratio.masked_fill(mask == 0, 0.0).max())}
    if rollout_logp is not None:
        log_r = (logp.detach() - rollout_logp).clamp(-20.0, 20.0)  # log π_trainer/π_sampler
        k1 = -log_r
        k3 = log_r.exp() - 1 - log_r
        rho = log_r.exp()
        sums["sampler_trainer_kl"] = float((k1 * weight).sum())
        sums["sampler_trainer_kl_k3"] = float((k3 * weight).sum())
        sums["sampler_trainer_is_mean"] = float((rho * weight).sum())
        maxes["sampler_trainer_is_max"] = float(rho.masked_fill(mask == 0, 0.0).max())
    return sums, maxes
