"""`per_rollout_mean`: the trainer core's loss as a verl policy loss (v1.0's name).

The core weights every trainable token so that, over one mini-batch,

    loss = Σ loss_weight · response_mask · token_loss

averages each rollout's token losses, then averages over rollouts. `batch.py` puts
`loss_weight · response_mask` in `rollout_is_weights` (the one per-token key besides the mask,
log-probs and advantages that verl 0.9.1's `ppo_loss` passes on), and this loss multiplies it
into verl's own clipped PPO token loss (`compute_policy_loss_vanilla`: clip low/high, dual clip)
and aggregates with `token-sum`. verl's FSDP engine backpropagates each micro-batch's loss as
is (gradients add up over micro-batches) and averages gradients over data-parallel ranks;
`token-sum` multiplies by `dp_size` to undo that average. So the gradient is the one of the
formula above under any micro-batching and any data-parallel split.

Ray workers are separate processes: each must register the loss before verl looks it up.
`register()` is idempotent and is the `worker_process_setup_hook` of the Ray runtime env.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo import core_algos

PER_ROLLOUT_MEAN = "per_rollout_mean"
LOSS_AGG_MODE = "token-sum"


def per_rollout_mean_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = LOSS_AGG_MODE,
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Σ rollout_is_weights · mask · PPO token loss (× dp_size, see the module docstring)."""
    if rollout_is_weights is None:
        raise ValueError(
            f"policy loss {PER_ROLLOUT_MEAN!r} needs the per-token loss weights in the batch's "
            "rollout_is_weights (agentlightning.verl.batch.rows_to_batch puts them there)"
        )
    if loss_agg_mode != LOSS_AGG_MODE:
        raise ValueError(
            f"policy loss {PER_ROLLOUT_MEAN!r} needs actor_rollout_ref.actor.loss_agg_mode={LOSS_AGG_MODE}, "
            f"got {loss_agg_mode!r}: the weights already normalise the loss"
        )
    return core_algos.compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=LOSS_AGG_MODE,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )


# `actor_rollout_ref.actor.policy_loss.loss_mode` as users write it (the torch backend's names)
# -> the loss registered with verl. `per_rollout_mean` is the older spelling of `vanilla`.
WEIGHTED_LOSSES = {
    "vanilla": PER_ROLLOUT_MEAN,
    PER_ROLLOUT_MEAN: PER_ROLLOUT_MEAN,
    "gspo": "per_rollout_gspo",
    "cispo": "per_rollout_cispo",
}


def _weighted(verl_mode: str) -> Any:
    """verl's own `verl_mode` loss, fed the core's weights in `rollout_is_weights`, token-sum."""

    def loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = LOSS_AGG_MODE,
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        if rollout_is_weights is None or loss_agg_mode != LOSS_AGG_MODE:
            raise ValueError(f"policy loss per_rollout_{verl_mode} needs the core's weights and token-sum")
        return core_algos.get_policy_loss_fn(verl_mode)(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=response_mask,
            loss_agg_mode=LOSS_AGG_MODE,
            config=config,
            rollout_is_weights=rollout_is_weights,
        )

    loss.__name__ = f"per_rollout_{verl_mode}_loss"
    return loss


_REGISTERED: dict[str, Any] = {}


def register() -> None:
    """Register the losses with verl: `per_rollout_mean`, and `per_rollout_gspo` / `_cispo` where
    this verl has `gspo` / `cispo` (idempotent; the Ray worker hook)."""
    if core_algos.POLICY_LOSS_REGISTRY.get(PER_ROLLOUT_MEAN) is not per_rollout_mean_loss:
        core_algos.register_policy_loss(PER_ROLLOUT_MEAN)(per_rollout_mean_loss)
    for mode in ("gspo", "cispo"):
        name = WEIGHTED_LOSSES[mode]
        if mode not in core_algos.POLICY_LOSS_REGISTRY:
            continue
        fn = _REGISTERED.setdefault(name, _weighted(mode))
        if core_algos.POLICY_LOSS_REGISTRY.get(name) is not fn:
            core_algos.register_policy_loss(name)(fn)


register()
