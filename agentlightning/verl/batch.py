"""The trainer core's rows as one verl batch (`DataProto`), laid out for verl's data-parallel ranks.

verl's standard layout: `prompts` left-padded to the longest prompt, `responses` right-padded to
the longest response, `input_ids = prompts ‖ responses`, `attention_mask` 1 on real tokens,
`position_ids` counting real tokens from 0. Per response token: `response_mask` (1 trainable,
0 context — tool output and user turns between calls — and padding), `old_log_probs` (the
rollout's, 0 on context), `advantages` (the row's `token_advantages` where it has them — on-policy
distillation's per-token signal — else the rollout's scalar, on trainable tokens; verl's loss
takes them per token as they are), and
`rollout_is_weights = loss_weight · response_mask`.

The loss weights ride in `rollout_is_weights` because verl 0.9.1's `ppo_loss` hands the policy
loss only `response_mask`, `old_log_probs`, `advantages`, `rollout_is_weights` (and reads
`ref_log_prob`): any other key is dropped before the loss. The registered `per_rollout_mean`
loss (`loss.py`) sums `weight · token_loss`, which is exactly the core's per-rollout mean.
`loss_weights` holds the same weights once more, for the KL term (`loss.per_rollout_ppo_loss`
reads it off the whole micro-batch): `rollout_is_weights` may also carry the truncated importance
ratio, which weighs the policy term only.

verl hands each data-parallel rank a contiguous, equal slice of the batch. `rank_layout`
spreads the rows over the ranks by tokens (longest first onto the least-loaded rank) and fills
every rank to the same count with padding rows: a copy of a real row's tokens with mask,
weights and advantages 0, so it adds nothing to the loss or its gradient.

MoE routing replay (R3): with the rows' recorded routes (`TrainingRow.routed_experts`), the
batch carries `routed_experts` [batch, prompt + response length, layers, top-k] int16, aligned
with `input_ids` token by token (zeros on padding): the key, dtype and layout verl 0.9.1's own
agent loop builds for its router replay (verl/experimental/agent_loop/agent_loop.py,
`_agent_loop_postprocess`: int16, the routes from the prompt's first real token on).
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from verl import DataProto

from agentlightning.rows import TrainingRow

LOSS_WEIGHTS = "loss_weights"  # the per-token loss weights, untouched by the importance ratio

PADDING_ROLLOUT_ID = ""  # rollout_id of a padding row in the batch's non-tensor `rollout_id`
ROUTES_DTYPE = torch.int16  # as verl's agent loop (expert indices beyond uint8's 255 exist)
R3_HINT = (
    "record them: set the Gateway's default_proxy.include_routed_experts=true (and serve the "
    "policy with vLLM's enable_return_routed_experts), and keep trace_aggregator.level=trajectory "
    "(a call's routes are kept only for the last call of its trajectory)"
)


class MissingRoutes(ValueError):
    """A row has no MoE routes, or routes that cannot be used, while verl's router replay needs them."""


def decode_routes(value: Any, rollout_id: str) -> np.ndarray:
    """A recorded `routed_experts` as an array [tokens, layers, top-k]: vLLM's base64 of a .npy
    array (what v1.0 decodes), or nested lists."""
    try:
        if isinstance(value, str):
            routes = np.load(io.BytesIO(base64.b64decode(value, validate=True)), allow_pickle=False)
        else:
            routes = np.asarray(value)
    except (ValueError, binascii.Error, OSError) as exc:
        raise MissingRoutes(f"routed_experts of rollout {rollout_id!r} cannot be read: {exc}") from None
    if routes.ndim != 3 or not np.issubdtype(routes.dtype, np.integer):
        raise MissingRoutes(
            f"routed_experts of rollout {rollout_id!r} must be integers [tokens, layers, top-k], "
            f"got {routes.dtype} of shape {routes.shape}"
        )
    return routes


def _routes_tensor(
    rows: Sequence[TrainingRow], source: list[int | None], filler: int, p_len: int, r_len: int, required: bool
) -> torch.Tensor | None:
    """`routed_experts` aligned with `input_ids`, or None when not every row has routes and
    replay is not required (then verl gets no routes at all, as v1.0 does)."""
    missing = [r.rollout_id for r in rows if r.routed_experts is None]
    if missing:
        if required:
            raise MissingRoutes(
                f"verl's router replay is R3 but the row of rollout {missing[0]!r} has no MoE routes "
                f"({len(missing)} of {len(rows)} rows lack them): {R3_HINT}"
            )
        return None
    decoded = [decode_routes(r.routed_experts, r.rollout_id) for r in rows]
    shape = decoded[0].shape[1:]
    out = torch.zeros((len(source), p_len + r_len, *shape), dtype=ROUTES_DTYPE)
    for i, (row, routes) in enumerate(zip(rows, decoded, strict=True)):
        if routes.shape[1:] != shape:
            raise MissingRoutes(
                f"routed_experts of rollout {row.rollout_id!r} has [layers, top-k] {routes.shape[1:]}, "
                f"rollout {rows[0].rollout_id!r} has {shape}: one batch, one model"
            )
        pl, rl = len(row.prompt_ids), len(row.response_ids)
        # The last token may lack routes: it was sampled, never fed through the model (as v1.0).
        if len(routes) < pl + rl - 1:
            raise MissingRoutes(
                f"routed_experts of rollout {row.rollout_id!r} cover {len(routes)} tokens, shorter "
                f"than its row's {pl + rl} (prompt {pl} + response {rl}): routes of another call?"
            )
        decoded[i] = routes[: pl + rl]
    for k, picked in enumerate(source):
        j = filler if picked is None else picked  # a padding row repeats the filler's tokens: its routes too
        routes = decoded[j]
        start = p_len - len(rows[j].prompt_ids)  # prompt left-padded, response right after it
        out[k, start : start + len(routes)] = torch.from_numpy(routes.astype(np.int16))
    return out


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
    rows: Sequence[TrainingRow],
    pad_token_id: int,
    dp_size: int = 1,
    multiple_of: int = 1,
    require_routed_experts: bool = False,
) -> tuple[DataProto, BatchLayout]:
    """One mini-batch of rows (loss weights set) as a verl `DataProto`, in rank order.

    `old_log_probs` holds the rows' rollout log-probs when every row has them, else zeros
    (`meta_info["has_rollout_log_probs"]` says which: the backend then recomputes them).
    `routed_experts` is there when every row has routes; `require_routed_experts` (verl's
    router replay in R3 mode) makes a row without them an error (`MissingRoutes`).
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
        per_token = row.token_advantages  # distillation: one advantage per token, else the rollout's
        advantages[k, :rl] = maskf * (row.advantage if per_token is None else torch.tensor(per_token))
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
        LOSS_WEIGHTS: weights.clone(),
    }
    if have_lp:
        tensors["rollout_log_probs"] = old_log_probs.clone()
    routes = _routes_tensor(rows, source, filler, p_len, r_len, require_routed_experts)
    if routes is not None:
        tensors["routed_experts"] = routes
    batch = DataProto.from_dict(
        tensors=tensors,
        non_tensors={
            "rollout_id": np.array(rollout_ids, dtype=object),
            "uid": np.array(group_ids, dtype=object),
        },
        meta_info={"has_rollout_log_probs": have_lp, "dp_size": dp_size, "n_rows": len(rows)},
    )
    return batch, BatchLayout(source, dp_size)
