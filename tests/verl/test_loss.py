"""`per_rollout_mean` through verl's real `ppo_loss`: equals the hand computation and the torch
backend's policy loss on the same rows, value and gradient, under any micro-batching and dp split."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import left_right_2_no_padding

from agentlightning.rows import TrainingRow
from agentlightning.torch_backend.policy import ActorConfig as TorchActorConfig
from agentlightning.torch_backend.policy import PolicyUpdater
from agentlightning.verl.batch import rows_to_batch
from agentlightning.verl.config import compose_config, verl_view
from agentlightning.verl.loss import PER_ROLLOUT_MEAN, per_rollout_mean_loss

from .rows import make_rows, one_minibatch

CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 3.0
# per row: [response_len] current log-probs of the response tokens
LogProbs = Callable[[int, TrainingRow], torch.Tensor]


@pytest.fixture(scope="module")
def actor_config() -> Any:
    cfg = compose_config(
        overrides=[
            "actor_rollout_ref.model.path=unused",
            f"actor_rollout_ref.actor.clip_ratio_low={CLIP_LOW}",
            f"actor_rollout_ref.actor.clip_ratio_high={CLIP_HIGH}",
            f"actor_rollout_ref.actor.clip_ratio_c={CLIP_C}",
        ]
    )
    return omega_conf_to_dataclass(verl_view(cfg).actor_rollout_ref.actor)


def verl_loss(
    rows: list[TrainingRow], config: Any, current: LogProbs, dp_size: int = 1, micro: int = 10**9
) -> torch.Tensor:
    """The mini-batch loss as verl's FSDP engine makes its gradient: every rank's micro-batch
    losses from the real `ppo_loss` summed (backward per micro-batch), averaged over ranks."""
    batch, layout = rows_to_batch(rows, 0, dp_size)
    n_tokens = int(batch.batch["response_mask"].sum())
    total = torch.zeros(())
    for rank, chunk in enumerate(batch.chunk(dp_size)):
        sources = layout.source[rank * layout.per_rank : (rank + 1) * layout.per_rank]
        for start in range(0, len(chunk), micro):
            mb: DataProto = chunk[start : start + micro]
            td = left_right_2_no_padding(mb.to_tensordict())
            tu.assign_non_tensor(td, dp_size=dp_size, batch_num_tokens=n_tokens, global_batch_size=len(batch))
            pieces = []
            for k, i in enumerate(sources[start : start + micro]):
                seq_len = int(td["input_ids"][k].shape[0])
                # log_probs[t] is the log-prob of token t+1 (verl's left shift)
                if i is None:
                    pieces.append(torch.zeros(seq_len))
                    continue
                row = rows[i]
                p = len(row.prompt_ids)
                pieces.append(torch.cat([torch.zeros(p - 1), current(i, row), torch.zeros(1)]))
            values = torch.cat(pieces)
            offsets = td["input_ids"].offsets()
            log_probs = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
            loss, _ = ppo_loss(config, {"log_probs": log_probs}, td)
            total = total + loss
    return total / dp_size  # FSDP averages the ranks' gradients


def hand_loss(rows: list[TrainingRow], current: LogProbs) -> torch.Tensor:
    """Σ_rows Σ_tokens loss_weight · mask · PPO token loss, written out."""
    total = torch.zeros(())
    for i, row in enumerate(rows):
        lp = current(i, row)
        assert row.rollout_log_probs is not None
        for t, m in enumerate(row.response_mask):
            if not m:
                continue
            a = row.advantage
            ratio = torch.exp(torch.clamp(lp[t] - row.rollout_log_probs[t], -20, 20))
            clipped = torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
            token = torch.maximum(-a * ratio, -a * clipped)
            if a < 0:
                token = torch.minimum(token, torch.tensor(-a * CLIP_C))
            total = total + row.loss_weight * token
    return total


def leaf_log_probs(rows: list[TrainingRow], seed: int) -> tuple[list[torch.Tensor], LogProbs]:
    """Current log-probs near the rollout's (some ratios clip, some do not), as leaves."""
    g = torch.Generator().manual_seed(seed)
    leaves = []
    for row in rows:
        assert row.rollout_log_probs is not None
        base = torch.tensor(row.rollout_log_probs, dtype=torch.float32)
        leaves.append((base + 0.4 * torch.randn(len(base), generator=g)).requires_grad_(True))
    return leaves, lambda i, row: leaves[i]


def test_the_loss_is_registered_with_verl() -> None:
    assert core_algos.get_policy_loss_fn(PER_ROLLOUT_MEAN) is per_rollout_mean_loss


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("dp_size", "micro"), [(1, 10**9), (1, 1), (1, 3), (2, 2), (3, 1), (4, 5)])
def test_verl_loss_equals_hand_computation(actor_config: Any, seed: int, dp_size: int, micro: int) -> None:
    rows = one_minibatch(make_rows(seed, n_groups=3, group_size=3, max_rows_per_rollout=3))
    leaves, current = leaf_log_probs(rows, seed)
    ours = verl_loss(rows, actor_config, current, dp_size, micro)
    grads = torch.autograd.grad(ours, leaves)
    expected = hand_loss(rows, current)
    expected_grads = torch.autograd.grad(expected, leaves)
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # the clipping really happens on some tokens and not on others
    ratios = torch.cat(
        [(lp - torch.tensor(r.rollout_log_probs)).exp() for lp, r in zip(leaves, rows, strict=True)]
    )
    assert ((ratios > 1 + CLIP_HIGH) | (ratios < 1 - CLIP_LOW)).any()
    assert ((ratios < 1 + CLIP_HIGH) & (ratios > 1 - CLIP_LOW)).any()


def test_each_rollout_counts_once_whatever_its_rows_and_tokens(actor_config: Any) -> None:
    rows = one_minibatch(make_rows(7, n_groups=2, group_size=2, max_rows_per_rollout=3))
    # all current log-probs equal to the rollout's: ratio 1, token loss = -advantage
    loss = verl_loss(rows, actor_config, lambda i, row: torch.tensor(row.rollout_log_probs))
    by_rollout = {r.rollout_id: r.advantage for r in rows}
    assert loss.item() == pytest.approx(-sum(by_rollout.values()) / len(by_rollout), abs=1e-6)


def test_the_loss_refuses_missing_weights_and_other_aggregations(actor_config: Any) -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="rollout_is_weights"):
        per_rollout_mean_loss(x, x, x, x.bool(), config=actor_config)
    with pytest.raises(ValueError, match="token-sum"):
        per_rollout_mean_loss(
            x, x, x, x.bool(), loss_agg_mode="token-mean", config=actor_config, rollout_is_weights=x
        )


def model_log_probs(model: Any, row: TrainingRow) -> torch.Tensor:
    """The response tokens' log-probs by one unpadded forward pass (as verl's engine computes them)."""
    ids = torch.tensor([row.prompt_ids + row.response_ids])
    logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    p = len(row.prompt_ids)
    targets = torch.tensor(row.response_ids)
    return lp[p - 1 : p - 1 + len(targets)].gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize(("dp_size", "micro"), [(1, 2), (2, 1)])
def test_verl_loss_equals_the_torch_backends_policy_loss(actor_config: Any, dp_size: int, micro: int) -> None:
    torch.manual_seed(3)
    # A tiny random Qwen2 (vocabulary of the test rows), built here. transformers 5 types the
    # config's __init__ without the attn_implementation it accepts.
    hf = Qwen2Config(  # type: ignore[call-arg]
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(hf).float().eval()
    rows = one_minibatch(make_rows(11, n_groups=3, group_size=3, max_rows_per_rollout=2))
    rng = random.Random(0)
    with torch.no_grad():  # rollout log-probs near the model's own, so some ratios clip
        for row in rows:
            lp = model_log_probs(model, row)
            row.rollout_log_probs = [
                float(v) + rng.gauss(0, 0.3) if m else 0.0 for v, m in zip(lp, row.response_mask, strict=True)
            ]

    torch_model = copy.deepcopy(model)
    updater = PolicyUpdater(
        torch_model,
        TorchActorConfig(
            clip_ratio_low=CLIP_LOW,
            clip_ratio_high=CLIP_HIGH,
            clip_ratio_c=CLIP_C,
            ppo_micro_batch_size_per_gpu=2,
        ),
        device="cpu",
    )
    stats = updater.backward(rows)
    torch_grads = {n: p.grad for n, p in torch_model.named_parameters()}

    verl_model = copy.deepcopy(model)
    loss = verl_loss(rows, actor_config, lambda i, row: model_log_probs(verl_model, row), dp_size, micro)
    loss.backward()
    assert loss.item() == pytest.approx(stats["pg_loss"], abs=1e-6)
    assert loss.item() == pytest.approx(
        hand_loss(rows, lambda i, row: model_log_probs(model, row)).item(), abs=1e-6
    )
    for name, param in verl_model.named_parameters():
        torch.testing.assert_close(param.grad, torch_grads[name], rtol=1e-4, atol=1e-6, msg=name)
