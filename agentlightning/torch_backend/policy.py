"""GRPO/PPO policy update in plain PyTorch, on the trainer core's `TrainingRow`s.

For every mini-batch the core hands over (its rows' `loss_weight`s sum to 1 over trainable
tokens, so each rollout counts once whatever its number of rows or tokens):

    loss = Σ_rows Σ_tokens loss_weight · mask · token_loss

    token_loss = PPO clipped surrogate with dual clip (verl's `compute_policy_loss`):
        ratio = exp(logp − old_logp)
        l1 = −A·ratio,  l2 = −A·clip(ratio, 1 − clip_ratio_low, 1 + clip_ratio_high)
        l  = max(l1, l2);  for A < 0: l = min(l, −A·clip_ratio_c)
      (+ kl_loss_coef · KL(π‖π_ref) when use_kl_loss, − entropy_coeff · H when entropy_coeff ≠ 0)

`logp` is recomputed with the current weights as `log_softmax(logits / T)` with T the rollout
temperature — the quantity the inference server reports — so on fresh data `old_logp` can be
the rollout's own log-probs (`old_log_prob_source=rollout`, no extra forward pass) or a
recomputation with the weights before this step's first optimizer step (`recompute`). With
`recompute` and `tis_imp_ratio_cap > 0`, each token is also weighted by the truncated
importance ratio `min(exp(old_logp − rollout_logp), cap)` (stale rollouts in async mode).

Micro-batches accumulate gradients: because the weights are normalised over the mini-batch,
the sum of the micro-batch losses *is* the mini-batch loss, so no rescaling is needed. Then
gradient clipping and one AdamW step. Parameters are fp32; on CUDA the forward pass runs
under bf16 autocast (log-softmax in fp32).
"""

from __future__ import annotations

import copy
import math
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from agentlightning.log import get_logger
from agentlightning.rows import TrainingRow
from agentlightning.torch_backend import hf_compat
from agentlightning.torch_backend.losses import (
    LOSS_MODES,
    V1_LOSS_MODE,
    RolloutCorrection,
    health_stats,
    rollout_correction_weights,
    token_policy_loss,
)
from agentlightning.trainer.config import KL_LOSS_TYPES

log = get_logger("torch_policy")


@dataclass
class OptimConfig:
    """`actor_rollout_ref.actor.optim.*` (verl names)."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    lr_warmup_steps: int = -1  # optimizer steps of linear warm-up; -1: use the ratio
    lr_warmup_steps_ratio: float = 0.0  # of total_training_steps
    total_training_steps: int = -1  # filled in by the trainer when known


@dataclass
class PolicyLossConfig:
    """`actor_rollout_ref.actor.policy_loss.*` (verl's names)."""

    loss_mode: str = "vanilla"  # vanilla (PPO clip: GRPO, DAPO, …) | gspo | cispo (losses.py)


@dataclass
class ActorConfig:
    """`actor_rollout_ref.actor.*` (verl names where they mean the same) plus our additions."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_epochs: int = 1
    ppo_micro_batch_size_per_gpu: int = 8
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    clip_ratio: float = 0.2  # verl: the clip range where clip_ratio_low / clip_ratio_high are null
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2  # DAPO's clip-higher: e.g. 0.28
    clip_ratio_c: float = 3.0
    policy_loss: PolicyLossConfig = field(default_factory=lambda: PolicyLossConfig())
    calculate_entropy: bool = True  # log actor/entropy (v1.0's key); costs one pass over the vocabulary
    grad_clip: float = 1.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"  # kl (k1) | abs | mse (k2) | low_var_kl (k3)
    entropy_coeff: float = 0.0
    # Ours:
    old_log_prob_source: str = "rollout"  # rollout | recompute
    tis_imp_ratio_cap: float = -1.0  # > 0: truncated importance sampling vs the rollout's log-probs
    temperature: float = 1.0  # the rollout temperature (actor_rollout_ref.rollout.temperature)
    dtype: str = "auto"  # auto: fp32 params, bf16 autocast on CUDA | float32 | bfloat16
    gradient_checkpointing: bool = False

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high

    def validate(self) -> None:
        if self.policy_loss.loss_mode == V1_LOSS_MODE:
            log.warning("v1_config_key_value_read_as", key="actor.policy_loss.loss_mode", read_as="vanilla")
            self.policy_loss.loss_mode = "vanilla"
        if self.policy_loss.loss_mode not in LOSS_MODES:
            raise ValueError(
                f"actor.policy_loss.loss_mode must be one of {', '.join(LOSS_MODES)} with the torch backend, "
                f"got {self.policy_loss.loss_mode!r}"
            )
        if not (0 <= self.clip_low < 1) or self.clip_high < 0:
            raise ValueError(
                f"actor.clip_ratio_low must be in [0, 1) and clip_ratio_high >= 0, got {self.clip_low}, {self.clip_high}"
            )
        if self.tis_imp_ratio_cap > 0 and self.old_log_prob_source != "recompute":
            raise ValueError(
                "actor.tis_imp_ratio_cap > 0 needs actor.old_log_prob_source=recompute: with the rollout's own "
                "log-probs as the old policy every importance ratio is 1 and the cap would do nothing"
            )
        if self.old_log_prob_source not in ("rollout", "recompute"):
            raise ValueError(
                f"actor.old_log_prob_source must be 'rollout' or 'recompute', got {self.old_log_prob_source!r}"
            )
        if self.kl_loss_type not in KL_LOSS_TYPES:
            raise ValueError(
                f"actor.kl_loss_type {self.kl_loss_type!r} is not one of {', '.join(KL_LOSS_TYPES)}"
            )
        if self.temperature <= 0:
            raise ValueError(
                f"actor.temperature (the rollout temperature) must be > 0, got {self.temperature}"
            )
        if self.ppo_micro_batch_size_per_gpu < 1:
            raise ValueError("actor.ppo_micro_batch_size_per_gpu must be at least 1")
        if self.ppo_epochs < 1:
            raise ValueError("actor.ppo_epochs must be at least 1")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"actor.dtype must be auto, float32 or bfloat16, got {self.dtype!r}")


@dataclass
class _Batch:
    """Rows as tensors: left-padded so that every response ends at the last position."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    position_ids: torch.Tensor  # [B, L]
    targets: torch.Tensor  # [B, K] the last K tokens (responses, right-aligned)
    mask: torch.Tensor  # [B, K] 1.0 on trainable response tokens
    weight: torch.Tensor  # [B, K] loss_weight · mask
    advantage: torch.Tensor  # [B, K]
    rollout_log_probs: torch.Tensor | None  # [B, K]
    keep: int  # K


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference (verl's `kl_penalty`)."""
    diff = logp - ref_logp
    if kind in ("kl", "k1"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("mse", "k2"):
        return 0.5 * diff.square()
    # k3, "low_var_kl": exp(ref − logp) − (ref − logp) − 1, clamped like verl.
    neg = (ref_logp - logp).clamp(-20, 20)
    return (neg.exp() - neg - 1).clamp(-10, 10)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantage: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO loss with dual clip, and per-token indicators for metrics."""
    return token_policy_loss(
        "vanilla", logp, old_logp, advantage, torch.ones_like(logp), clip_low, clip_high, clip_c
    )


def _correction(config: ActorConfig, correction: RolloutCorrection | None) -> RolloutCorrection:
    """The rollout correction to apply: `algorithm.rollout_correction`, or our older
    `actor.tis_imp_ratio_cap` (token-level TIS), which needs the old log-probs recomputed."""
    rc = correction or RolloutCorrection()
    rc.validate()
    if config.tis_imp_ratio_cap > 0:
        if rc.rollout_is is not None:
            raise ValueError(
                "actor.tis_imp_ratio_cap and algorithm.rollout_correction.rollout_is both ask for importance "
                "sampling: set one (rollout_is=token, rollout_is_threshold=CAP is the same as the cap)"
            )
        rc = RolloutCorrection(
            rollout_is="token",
            rollout_is_threshold=config.tis_imp_ratio_cap,
            rollout_rs=rc.rollout_rs,
            rollout_rs_threshold=rc.rollout_rs_threshold,
            rollout_rs_threshold_lower=rc.rollout_rs_threshold_lower,
        )
    if rc.enabled and config.old_log_prob_source != "recompute":
        raise ValueError(
            "algorithm.rollout_correction needs actor_rollout_ref.actor.old_log_prob_source=recompute: the "
            "correction compares the trainer's old log-probs with the sampler's, and with source=rollout they "
            "are the same numbers"
        )
    return rc


_MAX_STATS = ("ratio_max", "sampler_trainer_is_max")  # aggregated by max, the others by mean


_NORM_SLICE = 1 << 22  # elements per float64 slice in `param_norm` (32 MiB)


class PolicyUpdater:
    """Owns the trainable policy (and its AdamW state) and applies GRPO/PPO updates to it."""

    def __init__(
        self,
        model: Any,
        config: ActorConfig | None = None,
        device: str | torch.device | None = None,
        ref_model: Any = None,
        correction: RolloutCorrection | None = None,
    ) -> None:
        self.config = config or ActorConfig()
        self.config.validate()
        self.correction = _correction(self.config, correction)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(self.device, dtype=torch.float32)
        if self.config.gradient_checkpointing and hasattr(self.model, "gradient_checkpointing_enable"):
            self.model.gradient_checkpointing_enable()
        self.autocast_dtype: torch.dtype | None = None
        if self.config.dtype == "bfloat16" or (self.config.dtype == "auto" and self.device.type == "cuda"):
            self.autocast_dtype = torch.bfloat16
        self.ref_model = None
        if self.config.use_kl_loss:
            self.ref_model = (ref_model if ref_model is not None else copy.deepcopy(self.model)).to(
                self.device
            )
            self.ref_model.eval().requires_grad_(False)
        opt = self.config.optim
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=opt.lr,
            betas=(opt.betas[0], opt.betas[1]),
            eps=opt.eps,
            weight_decay=opt.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.steps = 0  # optimizer steps taken

    # --- log-probs ----------------------------------------------------------------------------

    def _lr_factor(self, step: int) -> float:
        opt = self.config.optim
        warmup = opt.lr_warmup_steps
        if warmup < 0 and opt.lr_warmup_steps_ratio > 0 and opt.total_training_steps > 0:
            warmup = int(opt.lr_warmup_steps_ratio * opt.total_training_steps)
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        return 1.0

    def _autocast(self) -> Any:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _collate(self, rows: Sequence[TrainingRow]) -> _Batch:
        for row in rows:
            if not row.prompt_ids:
                raise ValueError(f"row of rollout {row.rollout_id!r} has an empty prompt")
            if len(row.response_mask) != len(row.response_ids):
                raise ValueError(
                    f"row of rollout {row.rollout_id!r}: response_mask has {len(row.response_mask)} entries "
                    f"for {len(row.response_ids)} response tokens"
                )
        lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
        width = max(lengths)
        keep = max(max(len(r.response_ids) for r in rows), 1)
        b = len(rows)
        ids = torch.zeros((b, width), dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        mask = torch.zeros((b, keep))
        adv = torch.zeros((b, keep))
        weight = torch.zeros((b, keep))
        have_rollout_lp = all(r.rollout_log_probs is not None for r in rows)
        rollout_lp = torch.zeros((b, keep)) if have_rollout_lp else None
        for i, r in enumerate(rows):
            seq = r.prompt_ids + r.response_ids
            ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            attn[i, width - len(seq) :] = 1
            n = len(r.response_ids)
            if n == 0:
                continue
            m = torch.tensor(r.response_mask, dtype=torch.float32)
            mask[i, keep - n :] = m
            if r.token_advantages is not None:  # a per-token signal (distillation)
                adv[i, keep - n :] = torch.tensor(r.token_advantages, dtype=torch.float32) * m
            else:
                adv[i, keep - n :] = r.advantage * m
            weight[i, keep - n :] = r.loss_weight * m
            if rollout_lp is not None:
                assert r.rollout_log_probs is not None
                if len(r.rollout_log_probs) != n:
                    raise ValueError(
                        f"row of rollout {r.rollout_id!r}: {len(r.rollout_log_probs)} rollout log-probs "
                        f"for {n} response tokens"
                    )
                rollout_lp[i, keep - n :] = torch.tensor(r.rollout_log_probs, dtype=torch.float32)
        positions = (attn.cumsum(-1) - 1).clamp_min(0)
        d = self.device
        return _Batch(
            input_ids=ids.to(d),
            attention_mask=attn.to(d),
            position_ids=positions.to(d),
            targets=ids[:, width - keep :].to(d),
            mask=mask.to(d),
            weight=weight.to(d),
            advantage=adv.to(d),
            rollout_log_probs=rollout_lp.to(d) if rollout_lp is not None else None,
            keep=keep,
        )

    def _forward_log_probs(
        self, model: Any, batch: _Batch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self._autocast():
            logits = hf_compat.logits_for_last(
                model, batch.input_ids, batch.attention_mask, batch.position_ids, batch.keep + 1
            )
        logits = logits[:, :-1].float() / self.config.temperature
        log_probs = torch.log_softmax(logits, dim=-1)
        token_lp = log_probs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
        entropy = None
        if with_entropy:
            entropy = -(log_probs.exp() * log_probs).sum(-1)
        elif self.config.calculate_entropy and torch.is_grad_enabled():
            with torch.no_grad():  # a metric only: no graph kept for it
                entropy = -(log_probs.exp() * log_probs).sum(-1)
        return token_lp, entropy

    def micro_batches(self, rows: Sequence[TrainingRow]) -> Iterator[list[TrainingRow]]:
        """Rows grouped by length (less padding): by count, or by token budget with dynamic bsz."""
        ordered = sorted(rows, key=lambda r: len(r.prompt_ids) + len(r.response_ids))
        cfg = self.config
        if not cfg.use_dynamic_bsz:
            step = cfg.ppo_micro_batch_size_per_gpu
            for i in range(0, len(ordered), step):
                yield ordered[i : i + step]
            return
        current: list[TrainingRow] = []
        longest = 0
        for row in ordered:
            n = len(row.prompt_ids) + len(row.response_ids)
            if current and max(longest, n) * (len(current) + 1) > cfg.ppo_max_token_len_per_gpu:
                yield current
                current, longest = [], 0
            current.append(row)
            longest = max(longest, n)
        if current:
            yield current

    @torch.no_grad()
    def compute_log_probs(self, rows: Sequence[TrainingRow], model: Any = None) -> list[list[float]]:
        """Per row, the response tokens' log-probs under `model` (default: the policy), fp32."""
        model = model or self.model
        was_training = model.training
        model.eval()
        out: dict[int, list[float]] = {}
        index = {id(r): i for i, r in enumerate(rows)}
        try:
            for mb in self.micro_batches(rows):
                batch = self._collate(mb)
                lp, _ = self._forward_log_probs(model, batch)
                for j, r in enumerate(mb):
                    n = len(r.response_ids)
                    out[index[id(r)]] = lp[j, batch.keep - n :].tolist() if n else []
        finally:
            model.train(was_training)
        return [out[i] for i in range(len(rows))]

    # --- update -------------------------------------------------------------------------------

    def update(self, mini_batches: Sequence[Sequence[TrainingRow]]) -> dict[str, float]:
        """`ppo_epochs` passes over the mini-batches, one optimizer step each; returns metrics."""
        cfg = self.config
        t0 = time.perf_counter()
        all_rows = [r for mb in mini_batches for r in mb]
        if not all_rows:
            return {}
        need_old = cfg.old_log_prob_source == "recompute" or any(
            r.rollout_log_probs is None for r in all_rows
        )
        old: dict[int, torch.Tensor] = {}
        if need_old:
            for r, lp in zip(all_rows, self.compute_log_probs(all_rows), strict=True):
                old[id(r)] = torch.tensor(lp, dtype=torch.float32)
        sums: dict[str, float] = defaultdict(float)
        n_steps, grad_norms, tokens = 0, [], 0
        norm_before = self.param_norm()
        self.model.train()
        for _ in range(cfg.ppo_epochs):
            for mb in mini_batches:
                if not mb:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                for k, v in self.backward(mb, old if need_old else None).items():
                    sums[k] = max(sums.get(k, v), v) if k in _MAX_STATS else sums[k] + v
                tokens += sum(len(r.prompt_ids) + len(r.response_ids) for r in mb)
                grad_norms.append(self.optimizer_step())
                n_steps += 1
        elapsed = time.perf_counter() - t0
        self.model.eval()
        metrics = {f"actor/{k}": v if k in _MAX_STATS else v / max(n_steps, 1) for k, v in sums.items()}
        metrics["actor/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        # Whether the update moved the weights at all (a zero-advantage batch does not): the norm
        # of the trainable weights before and after, two reductions, no copy of the weights.
        metrics["actor/param_norm"] = self.param_norm()
        metrics["actor/param_norm_change"] = abs(metrics["actor/param_norm"] - norm_before)
        metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["actor/optimizer_steps"] = float(n_steps)
        metrics["perf/update_time_s"] = elapsed
        metrics["perf/update_tokens_per_s"] = tokens / elapsed if elapsed > 0 else 0.0
        metrics["actor/old_log_prob_recomputed"] = float(need_old)
        return metrics

    @torch.no_grad()
    def param_norm(self) -> float:
        """The L2 norm of the trainable weights, summed in float64 (a small step must show) a
        slice at a time: a large embedding never gets a float64 copy of its own."""
        total = 0.0
        for p in self.model.parameters():
            if p.requires_grad:
                for part in p.detach().reshape(-1).split(_NORM_SLICE):
                    total += float(part.double().pow(2).sum())
        return math.sqrt(total)

    def backward(
        self, rows: Sequence[TrainingRow], old: dict[int, torch.Tensor] | None = None
    ) -> dict[str, float]:
        """Accumulate the gradient of one mini-batch's loss, micro-batch by micro-batch.

        `old` maps `id(row)` to its old log-probs; None uses the rows' rollout log-probs.
        Returns the mini-batch's loss statistics (weighted sums).
        """
        sums: dict[str, float] = defaultdict(float)
        for micro in self.micro_batches(rows):
            for k, v in self._micro_step(micro, old).items():
                sums[k] = max(sums.get(k, v), v) if k in _MAX_STATS else sums[k] + v
        return dict(sums)

    def _micro_step(self, rows: list[TrainingRow], old: dict[int, torch.Tensor] | None) -> dict[str, float]:
        cfg = self.config
        batch = self._collate(rows)
        grad_entropy = cfg.entropy_coeff != 0
        logp, entropy = self._forward_log_probs(self.model, batch, with_entropy=grad_entropy)
        if old is not None:
            old_lp = torch.zeros_like(logp)
            for i, r in enumerate(rows):
                n = len(r.response_ids)
                if n:
                    old_lp[i, batch.keep - n :] = old[id(r)].to(logp.device)
        else:
            assert batch.rollout_log_probs is not None
            old_lp = batch.rollout_log_probs
        pg, info = token_policy_loss(
            cfg.policy_loss.loss_mode,
            logp,
            old_lp,
            batch.advantage,
            batch.mask,
            cfg.clip_low,
            cfg.clip_high,
            cfg.clip_ratio_c,
        )
        w = batch.weight
        stats: dict[str, float] = {}
        if self.correction.enabled:
            if old is not None and batch.rollout_log_probs is not None:
                factor, rc_stats = rollout_correction_weights(
                    old_lp, batch.rollout_log_probs, batch.mask, self.correction
                )
                pg = pg * factor
                stats.update(rc_stats)
            else:  # a call without log-probs in this micro-batch: counted, never skipped quietly
                stats["rollout_correction_skipped_rows"] = float(len(rows))
        token_loss = pg
        if self.ref_model is not None:
            with torch.no_grad():
                ref_lp, _ = self._forward_log_probs(self.ref_model, batch)
            kl = kl_penalty(logp, ref_lp, cfg.kl_loss_type)
            token_loss = token_loss + cfg.kl_loss_coef * kl
            stats["kl_loss"] = float((kl.detach() * w).sum())
        if entropy is not None:
            if grad_entropy:
                token_loss = token_loss - cfg.entropy_coeff * entropy
            stats["entropy"] = float((entropy.detach() * w).sum())
        loss = (token_loss * w).sum()
        loss.backward()
        with torch.no_grad():
            stats["pg_loss"] = float((pg.detach() * w).sum())
            stats["pg_clipfrac"] = float((info["clipped"] * w).sum())
            stats["pg_clipfrac_lower"] = float((info["clipped_lower"] * w).sum())
            stats["ppo_kl"] = float((info["approx_kl"] * w).sum())
            sums, maxes = health_stats(logp, batch.rollout_log_probs, info["ratio"], w, batch.mask)
            stats.update(sums)
            stats.update(maxes)
        return stats

    # --- supervised ---------------------------------------------------------------------------

    def nll_backward(self, rows: Sequence[TrainingRow]) -> float:
        """Accumulate the gradient of the supervised loss `−Σ loss_weight · mask · log π(token)`
        (SFT: the rows' trainable tokens as targets), micro-batch by micro-batch; returns it."""
        total = 0.0
        self.model.train()
        for micro in self.micro_batches(rows):
            batch = self._collate(micro)
            logp, _ = self._forward_log_probs(self.model, batch)
            loss = -(logp * batch.weight).sum()
            loss.backward()
            total += float(loss.detach())
        return total

    def optimizer_step(self) -> float:
        """Clip the accumulated gradient, take one AdamW step (skipped on a non-finite norm) and
        advance the schedule; returns the gradient norm and clears the gradient."""
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            log.warning("non_finite_grad_norm_step_skipped", grad_norm=grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.steps += 1
        return grad_norm

    # --- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps": self.steps,
        }

    def set_lr(self, lr: float) -> None:
        """The learning rate from now on (the warm-up's factor still applies to it)."""
        self.scheduler.base_lrs = [lr for _ in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["initial_lr"] = lr
            group["lr"] = lr * self._lr_factor(self.scheduler.last_epoch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])
