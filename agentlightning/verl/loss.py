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

The KL term to the reference model (`use_kl_loss`) gets the same weights. verl's `ppo_loss` adds
its KL term aggregated over `response_mask` alone, so the backend hands the actor
`per_rollout_ppo_loss` instead (`set_loss_fn`, verl's own door for it): verl's `ppo_loss` with its
KL term off, plus `kl_loss_coef · Σ loss_weights · kl_penalty(log_prob, ref_log_prob)` (× dp_size),
with verl's `kl_penalty` and the batch's `ref_log_prob` from verl's reference worker. The torch
backend's loss is the same sum (`torch_backend/policy.py`).

Ray workers are separate processes: each must register the loss before verl looks it up.
`register()` is idempotent and is the `worker_process_setup_hook` of the Ray runtime env.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from verl.trainer.ppo import core_algos
from verl.utils.metric import AggregationType, Metric
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from agentlightning.verl.batch import LOSS_WEIGHTS

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


@dataclasses.dataclass(frozen=True)
class KLTerm:
    """`kl_loss_coef · KL(π ‖ π_ref)` per token, verl's `kl_penalty` estimator `kl_loss_type`."""

    coef: float
    kind: str


def per_rollout_ppo_loss(
    config: Any, model_output: Any, data: Any, dp_group: Any = None, kl: KLTerm | None = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's `ppo_loss` (its own KL term off: `config.use_kl_loss` is false here), plus the KL term
    weighted like the policy term: `kl.coef · Σ loss_weights · kl_penalty` (× dp_size)."""
    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    if kl is None:
        return loss, metrics
    if "ref_log_prob" not in data or LOSS_WEIGHTS not in data:
        raise ValueError(
            f"the KL term needs the batch's ref_log_prob and {LOSS_WEIGHTS} (the verl backend sets both "
            "when actor_rollout_ref.actor.use_kl_loss is true)"
        )
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    padded = data.select("ref_log_prob", LOSS_WEIGHTS).to_padded_tensor()
    kld = core_algos.kl_penalty(logprob=log_prob, ref_logprob=padded["ref_log_prob"], kl_penalty=kl.kind)
    kl_loss = (kld * padded[LOSS_WEIGHTS]).sum() * data["dp_size"]
    metrics["kl_loss"] = Metric(value=kl_loss, aggregation=AggregationType.SUM)
    metrics["kl_coef"] = kl.coef
    return loss + kl.coef * kl_loss, metrics


def actor_loss(actor_config: Any) -> Any:
    """The loss the backend sets on verl's actor: `per_rollout_ppo_loss` on `actor_config` with
    verl's own KL term off and ours on where `use_kl_loss` asks for it."""
    from functools import partial

    if not actor_config.use_kl_loss:
        return partial(per_rollout_ppo_loss, config=actor_config)
    term = KLTerm(coef=float(actor_config.kl_loss_coef), kind=str(actor_config.kl_loss_type))
    return partial(per_rollout_ppo_loss, config=dataclasses.replace(actor_config, use_kl_loss=False), kl=term)


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
