"""Rows -> verl batch: padding, masks, weights, rank layout and padding rows, through verl's own code."""

from __future__ import annotations

import pytest

from .conftest import SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

import base64
import io
import random
from collections.abc import Callable

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.workers.utils.padding import left_right_2_no_padding

from agentlightning.rows import TrainingRow
from agentlightning.verl.batch import PADDING_ROLLOUT_ID, MissingRoutes, rank_layout, rows_to_batch

from .rows import make_rows, one_minibatch

PAD = 0


def check_batch(rows: list[TrainingRow], dp_size: int, multiple_of: int = 1) -> None:
    batch, layout = rows_to_batch(rows, PAD, dp_size, multiple_of)
    t = batch.batch
    n = len(batch)
    share = -(-len(rows) // dp_size)
    per_rank = -(-share // multiple_of) * multiple_of  # whole micro-batches
    assert n == per_rank * dp_size == len(layout.source)
    assert sorted(i for i in layout.source if i is not None) == list(range(len(rows)))
    p_len = t["prompts"].shape[1]
    r_len = t["responses"].shape[1]
    assert p_len == max(len(r.prompt_ids) for r in rows)
    assert r_len == max(len(r.response_ids) for r in rows)
    assert torch.equal(t["input_ids"], torch.cat([t["prompts"], t["responses"]], 1))
    for k, i in enumerate(layout.source):
        if i is None:  # a padding row: real tokens, nothing to learn from
            assert batch.non_tensor_batch["rollout_id"][k] == PADDING_ROLLOUT_ID
            assert t["response_mask"][k].sum() == 0
            assert t["rollout_is_weights"][k].abs().sum() == 0
            assert t["advantages"][k].abs().sum() == 0
            assert t["attention_mask"][k].sum() > 0
            continue
        row = rows[i]
        pl, rl = len(row.prompt_ids), len(row.response_ids)
        assert batch.non_tensor_batch["rollout_id"][k] == row.rollout_id
        assert batch.non_tensor_batch["uid"][k] == row.group_id
        # prompts left-padded, responses right-padded
        assert t["prompts"][k, p_len - pl :].tolist() == row.prompt_ids
        assert (t["prompts"][k, : p_len - pl] == PAD).all()
        assert t["responses"][k, :rl].tolist() == row.response_ids
        assert (t["responses"][k, rl:] == PAD).all()
        attn = t["attention_mask"][k].tolist()
        assert attn == [0] * (p_len - pl) + [1] * (pl + rl) + [0] * (r_len - rl)
        assert t["position_ids"][k, p_len - pl : p_len + rl].tolist() == list(range(pl + rl))
        mask = t["response_mask"][k].tolist()
        assert mask == row.response_mask + [0] * (r_len - rl)
        maskf = torch.tensor(mask, dtype=torch.float32)
        if row.token_advantages is None:  # the rollout's scalar on every trainable token
            assert torch.equal(t["advantages"][k], torch.tensor(row.advantage, dtype=torch.float32) * maskf)
        else:  # distillation: the row's own value per token, in place, 0 on context and padding
            own = [a if m else 0.0 for a, m in zip(row.token_advantages, row.response_mask, strict=True)]
            assert torch.equal(
                t["advantages"][k], torch.tensor(own + [0.0] * (r_len - rl), dtype=torch.float32)
            )
        assert torch.equal(
            t["rollout_is_weights"][k], torch.tensor(row.loss_weight, dtype=torch.float32) * maskf
        )
        lp = torch.tensor((row.rollout_log_probs or []) + [0.0] * (r_len - rl), dtype=torch.float32)
        assert torch.equal(t["old_log_probs"][k], lp * maskf)
    # the weights still make one per-rollout mean: they sum to 1 over the batch
    assert t["rollout_is_weights"].sum().item() == pytest.approx(1.0, abs=1e-5)
    # verl's own rank split (contiguous equal chunks) hands each rank the rows of its layout
    for rank, chunk in enumerate(batch.chunk(dp_size)):
        expected = layout.source[rank * per_rank : (rank + 1) * per_rank]
        ids = [r for r in chunk.non_tensor_batch["rollout_id"]]
        assert ids == [PADDING_ROLLOUT_ID if i is None else rows[i].rollout_id for i in expected]
    # verl's conversion to its no-padding format sees exactly prompt ‖ response per row
    td = left_right_2_no_padding(batch.to_tensordict())
    for k, i in enumerate(layout.source):
        seq = td["input_ids"][k].tolist()
        src = rows[i] if i is not None else None
        if src is not None:
            assert seq == src.prompt_ids + src.response_ids


def batch_shapes(test: Callable[..., None]) -> Callable[..., None]:
    """Property test over rows of 1-4 groups x 1-4 rollouts x 1-3 rows each, 1-4 data-parallel
    ranks and micro-batch multiples 1-3."""
    shapes = given(
        seed=st.integers(0, 10_000),
        n_groups=st.integers(1, 4),
        group_size=st.integers(1, 4),
        dp_size=st.integers(1, 4),
        micro=st.integers(1, 3),
    )
    return settings(max_examples=30, deadline=None)(shapes(test))


@batch_shapes
def test_rows_to_batch_properties(
    seed: int, n_groups: int, group_size: int, dp_size: int, micro: int
) -> None:
    rows = one_minibatch(make_rows(seed, n_groups, group_size, max_rows_per_rollout=3))
    check_batch(rows, dp_size, micro)


@batch_shapes
def test_rows_with_token_advantages_carry_them_token_by_token(
    seed: int, n_groups: int, group_size: int, dp_size: int, micro: int
) -> None:
    """On-policy distillation: a row with `token_advantages` gets exactly those at its response
    positions (right after the left-padded prompt); a row without keeps the rollout's scalar."""
    rows = one_minibatch(make_rows(seed, n_groups, group_size, max_rows_per_rollout=3))
    rng = random.Random(seed)
    for row in rows:
        if rng.random() < 0.6:  # distinct values, non-zero on context too: the mask must zero them
            row.token_advantages = [rng.uniform(-2.0, 2.0) for _ in row.response_ids]
    check_batch(rows, dp_size, micro)


def test_rank_layout_balances_tokens_with_equal_counts() -> None:
    rows = make_rows(3, n_groups=1, group_size=1, max_rows_per_rollout=1)
    base = rows[0]
    lengths = [20, 19, 3, 2, 2]
    rows = [
        TrainingRow(
            rollout_id=f"r{i}",
            group_id="g",
            prompt_ids=[1],
            response_ids=[5] * (n - 1),
            response_mask=[1] * (n - 1),
            rollout_log_probs=None,
            model_versions=[0] * (n - 1),
            reward=base.reward,
        )
        for i, n in enumerate(lengths)
    ]
    layout = rank_layout(rows, 2)
    assert [len(r) for r in layout] == [3, 3]
    assert layout[0][0] == 0 and layout[1][0] == 1  # the two long rows on different ranks
    assert sorted(i for r in layout for i in r if i is not None) == [0, 1, 2, 3, 4]
    loads = [sum(lengths[i] for i in r if i is not None) for r in layout]
    assert max(loads) - min(loads) <= 2


def test_rows_without_rollout_log_probs_are_flagged_for_recomputation() -> None:
    rows = one_minibatch(make_rows(5))
    rows[1].rollout_log_probs = None
    batch, _ = rows_to_batch(rows, PAD)
    assert batch.meta_info["has_rollout_log_probs"] is False
    assert "rollout_log_probs" not in batch.batch.keys()
    assert batch.batch["old_log_probs"].abs().sum() == 0


def test_bad_rows_fail_clearly() -> None:
    rows = one_minibatch(make_rows(6))
    with pytest.raises(ValueError, match="at least one row"):
        rows_to_batch([], PAD)
    rows[0].prompt_ids = []
    with pytest.raises(ValueError, match="empty prompt"):
        rows_to_batch(rows, PAD)
    with pytest.raises(ValueError, match="dp_size"):
        rank_layout(rows, 0)


# --- MoE routing replay (R3) ---------------------------------------------------------------------

LAYERS, TOPK = 3, 2


def route_of(token: int, pos: int) -> list[list[int]]:
    """A token's experts: the first is the token id itself, so alignment shows token by token;
    others exceed uint8 (verl's int16 must hold them)."""
    return [
        [token if (layer, k) == (0, 0) else 300 + pos * 5 + layer * 2 + k for k in range(TOPK)]
        for layer in range(LAYERS)
    ]


def add_routes(rows: list[TrainingRow], seed: int) -> list[bool]:
    """Routes as vLLM records them: base64 .npy (some rows) or lists; some lack the last token's.
    Returns, per row, whether its last token's routes are missing."""
    rng = random.Random(seed)
    trimmed = []
    for row in rows:
        ids = row.prompt_ids + row.response_ids
        routes = [route_of(t, pos) for pos, t in enumerate(ids)]
        cut = rng.random() < 0.5
        if cut:
            routes = routes[:-1]
        trimmed.append(cut)
        if rng.random() < 0.5:
            buffer = io.BytesIO()
            np.save(buffer, np.asarray(routes, dtype=np.int32).reshape(len(routes), LAYERS, TOPK))
            row.routed_experts = base64.b64encode(buffer.getvalue()).decode()
        else:
            row.routed_experts = routes
    return trimmed


@batch_shapes
def test_routes_line_up_with_input_ids_token_by_token(
    seed: int, n_groups: int, group_size: int, dp_size: int, micro: int
) -> None:
    rows = one_minibatch(make_rows(seed, n_groups, group_size, max_rows_per_rollout=3))
    trimmed = add_routes(rows, seed)
    batch, layout = rows_to_batch(rows, PAD, dp_size, micro, require_routed_experts=True)
    t = batch.batch
    routes = t["routed_experts"]
    n, seq = t["input_ids"].shape
    assert routes.dtype == torch.int16 and routes.shape == (n, seq, LAYERS, TOPK)
    attn = t["attention_mask"].bool()
    # Off the real tokens (padding on either side): zeros.
    assert (routes[~attn] == 0).all()
    source: list[int] = []  # the row whose routes each batch position carries
    for k, i in enumerate(layout.source):
        tokens = t["input_ids"][k][attn[k]].tolist()
        real = routes[k][attn[k]].tolist()

        def expected(j: int, tokens: list[int] = tokens) -> list[list[list[int]]]:
            out = [route_of(tok, pos) for pos, tok in enumerate(tokens)]
            if trimmed[j]:  # the last token's routes were never recorded: zeros there
                out[-1] = [[0] * TOPK for _ in range(LAYERS)]
            return out

        # A padding row repeats a real row's tokens, and so its routes.
        candidates = (
            [i]
            if i is not None
            else [j for j, r in enumerate(rows) if r.prompt_ids + r.response_ids == tokens]
        )
        matching = [j for j in candidates if real == expected(j)]
        assert matching, f"position {k}: routes do not line up with its tokens"
        source.append(matching[0])
    # verl's own unpadding keeps each row's routes with its tokens.
    td = left_right_2_no_padding(batch.to_tensordict())
    for k in range(n):
        ids = td["input_ids"][k]
        first_expert = td["routed_experts"][k][:, 0, 0]
        if trimmed[source[k]]:
            assert first_expert[-1].item() == 0
            ids, first_expert = ids[:-1], first_expert[:-1]
        assert first_expert.tolist() == ids.tolist()


def test_routes_are_left_out_unless_every_row_has_them_and_required_fails_clearly() -> None:
    rows = one_minibatch(make_rows(11))
    add_routes(rows, 11)
    rows[2].routed_experts = None
    batch, _ = rows_to_batch(rows, PAD)
    assert "routed_experts" not in batch.batch.keys()
    with pytest.raises(MissingRoutes, match=rf"rollout '{rows[2].rollout_id}'.*include_routed_experts=true"):
        rows_to_batch(rows, PAD, require_routed_experts=True)
    for row in rows:
        row.routed_experts = None
    assert "routed_experts" not in rows_to_batch(rows, PAD)[0].batch.keys()


def test_bad_routes_fail_clearly() -> None:
    rows = one_minibatch(make_rows(12))
    add_routes(rows, 12)
    row = rows[0]
    full = [route_of(tok, pos) for pos, tok in enumerate(row.prompt_ids + row.response_ids)]
    row.routed_experts = full[:-2]  # two tokens short: routes of another call
    with pytest.raises(MissingRoutes, match=rf"rollout '{row.rollout_id}'.*shorter than its row"):
        rows_to_batch(rows, PAD)
    row.routed_experts = "not base64 of an array!"
    with pytest.raises(MissingRoutes, match="cannot be read"):
        rows_to_batch(rows, PAD)
    row.routed_experts = [[1, 2]] * len(full)  # no top-k axis
    with pytest.raises(MissingRoutes, match=r"\[tokens, layers, top-k\]"):
        rows_to_batch(rows, PAD)
    row.routed_experts = [[[1]]] * len(full)  # another model's shape
    with pytest.raises(MissingRoutes, match="one batch, one model"):
        rows_to_batch(rows, PAD)
