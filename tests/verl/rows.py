"""Training rows for the verl tests: multi-row rollouts with context tokens, weights set by the core."""

from __future__ import annotations

import random

from agentlightning.rows import TrainingRow
from agentlightning.trainer.shaping import split_minibatches


def make_rows(
    seed: int, n_groups: int = 2, group_size: int = 3, vocab: int = 50, max_rows_per_rollout: int = 2
) -> list[TrainingRow]:
    """Groups of rollouts; each rollout makes 1..max rows; responses mix trainable and context tokens."""
    rng = random.Random(seed)
    rows: list[TrainingRow] = []
    for g in range(n_groups):
        for k in range(group_size):
            rid = f"g{g}-r{k}"
            advantage = rng.uniform(-1.5, 1.5)
            for turn in range(rng.randint(1, max_rows_per_rollout)):
                n_prompt = rng.randint(1, 7)
                n_resp = rng.randint(1, 9)
                mask = [1 if rng.random() < 0.7 else 0 for _ in range(n_resp)]
                mask[0] = 1  # every row has a trainable token (the core drops rows without one)
                rows.append(
                    TrainingRow(
                        rollout_id=rid,
                        group_id=f"g{g}",
                        prompt_ids=[rng.randrange(1, vocab) for _ in range(n_prompt)],
                        response_ids=[rng.randrange(1, vocab) for _ in range(n_resp)],
                        response_mask=mask,
                        rollout_log_probs=[rng.uniform(-3.0, -0.05) if m else 0.0 for m in mask],
                        model_versions=[0 if m else -1 for m in mask],
                        reward=0.0,
                        advantage=advantage,
                        turn_index=turn,
                    )
                )
    return rows


def one_minibatch(rows: list[TrainingRow]) -> list[TrainingRow]:
    """All groups in one mini-batch, loss weights set by the core."""
    n_groups = len({r.group_id for r in rows})
    (mb,) = split_minibatches(rows, n_groups)
    return mb
