"""The trainer core's rows as one verl batch (`DataProto`), laid out for verl's data-parallel ranks.

verl's standard layout: `prompts` left-padded to the longest prompt, `responses` right-padded to
the longest response, `input_ids = prompts ‖ responses`, `attention_mask` 1 on real tokens,
`position_ids` counting real tokens from 0. Per response token: `response_mask` (1 trainable,
0 context — tool output and user turns between calls — and padding), `old_log_probs` (the
rollout's, 0 on context), `advantages` (the rollout's scalar on trainable tokens), and
`rollout_is_weights = loss_weight · response_mask`.

The loss weights ride in `rollout_is_weights` because verl 0.9.1's `ppo_loss` hands the policy
loss only `response_mask`, `old_log_probs`, `advantages`, `rollout_is_weights` (and reads
`ref_log_prob`): any other key is dropped before the loss. The registered `per_rollout_mean`
loss (`loss.py`) sums `weight · token_loss`, which is exactly the core's per-rollout mean.

verl hands each data-parallel rank a contiguous, equal slice of the batch. `rank_layout`
spreads the rows over the ranks by tokens (longest first onto the least-loaded rank) and fills
every rank to the same count with padding rows: a copy of a real row's tokens with mask,
weights and advantages 0, so it adds nothing to the loss or its gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from verl import DataProto

from agentlightning.trainer.rows import TrainingRow

PADDING_ROLLOUT_ID = ""  # rollout_id of a padding row in the batch's non-tensor `rollout_id`


def _length(row: TrainingRow) -> int:
    return len(row.prompt_ids) + len(row.response_ids)


def rank_layout(rows: Sequence[TrainingRow], dp_size: int, multiple_of: int = 1) -> list[list[int | None]]:
    """Row indices per data-parallel rank: equal counts, balanced tokens; None marks a padding row.

    Every rank gets the same number of rows, a multiple of `multiple_of` (verl's micro-batch size
    per GPU: without dynamic batch sizes its engine needs whole micro-batches). Within a rank, rows
    keep their batch order (a group's rows stay in order).
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if multiple_of < 1:
        raise ValueError(f"multiple_of must be >= 1, got {multiple_of}")
    per_rank = max(1, -(-len(rows) // dp_size))
    per_rank = -(-per_rank // multiple_of) * multiple_of
    # Fill ranks in turn up to the rows' own share, so that padding spreads over the ranks.
    share = -(-len(rows) // dp_size)
    slots: list[list[int]] = [[] for _ in range(dp_size)]
    loads = [0] * dp_size
    for i in sorted(range(len(rows)), key=lambda i: (-_length(rows[i]), i)):
        rank = min((r for r in range(dp_size) if len(slots[r]) < share), key=lambda r: (loads[r], r))
        slots[rank].append(i)
        loads[rank] += _length(rows[i])
    return [[*sorted(s), *([None] * (per_rank - len(s)))] for s in slots]


@dataclass(frozen=True)
class BatchLayout:
    """Where each batch position came from: `source[k]` is the row index, or None for padding."""

    source: list[int | None]
    dp_size: int

    @property
    def per_rank(self) -> int:
        return len(self.source) // self.dp_size


def rows_to_batch(
    rows: Sequence[TrainingRow], pad_token_id: int, dp_size: int = 1, multiple_of: int = 1
) -> tuple[DataProto, BatchLayout]:
    """One mini-batch of rows (loss weights set) as a verl `DataProto`, in rank order.

    `old_log_probs` holds the rows' rollout log-probs when every row has them, else zeros
    (`meta_info["has_rollout_log_probs"]` says which: the backend then recomputes them).
    """
    if not rows:
        raise ValueError("rows_to_batch needs at least one row")
    for row in rows:
        row.check()
        if not row.prompt_ids:
            raise ValueError(f"row of rollout {row.rollout_id!r} has an empty prompt: verl needs one")
        if not row.response_ids:
            raise ValueError(f"row of rollout {row.rollout_id!r} has no response tokens")
    layout = rank_layout(rows, dp_size, multiple_of)
    source = [i for rank in layout for i in rank]
    filler = min(range(len(rows)), key=lambda i: (_length(rows[i]), i))  # cheapest tokens to repeat
    have_lp = all(r.rollout_log_probs is not None for r in rows)

    n = len(source)
    p_len = max(len(r.prompt_ids) for r in rows)
    r_len = max(len(r.response_ids) for r in rows)
    prompts = torch.full((n, p_len), pad_token_id, dtype=torch.long)
    responses = torch.full((n, r_len), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, p_len + r_len), dtype=torch.long)
    response_mask = torch.zeros((n, r_len), dtype=torch.long)
    old_log_probs = torch.zeros((n, r_len), dtype=torch.float32)
    advantages = torch.zeros((n, r_len), dtype=torch.float32)
    weights = torch.zeros((n, r_len), dtype=torch.float32)
    rollout_ids: list[str] = []
    group_ids: list[str] = []
    for k, i in enumerate(source):
        row = rows[filler if i is None else i]
        pl, rl = len(row.prompt_ids), len(row.response_ids)
        prompts[k, p_len - pl :] = torch.tensor(row.prompt_ids, dtype=torch.long)
        responses[k, :rl] = torch.tensor(row.response_ids, dtype=torch.long)
        attention[k, p_len - pl : p_len + rl] = 1
        rollout_ids.append(PADDING_ROLLOUT_ID if i is None else row.rollout_id)
        group_ids.append(PADDING_ROLLOUT_ID if i is None else row.group_id)
        if i is None:
            continue
        mask = torch.tensor(row.response_mask, dtype=torch.long)
        response_mask[k, :rl] = mask
        maskf = mask.float()
        advantages[k, :rl] = maskf * row.advantage
        weights[k, :rl] = maskf * row.loss_weight
        if have_lp:
            assert row.rollout_log_probs is not None
            old_log_probs[k, :rl] = torch.tensor(row.rollout_log_probs, dtype=torch.float32) * maskf
    position_ids = (attention.cumsum(-1) - 1).clamp_min(0)  # verl's compute_position_id_with_mask
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "old_log_probs": old_log_probs,
        "advantages": advantages,
        "rollout_is_weights": weights,
    }
    if have_lp:
        tensors["rollout_log_probs"] = old_log_probs.clone()
    batch = DataProto.from_dict(
        tensors=tensors,
        non_tensors={
            "rollout_id": np.array(rollout_ids, dtype=object),
            "uid": np.array(group_ids, dtype=object),
        },
        meta_info={"has_rollout_log_probs": have_lp, "dp_size": dp_size, "n_rows": len(rows)},
    )
    return batch, BatchLayout(source, dp_size)
