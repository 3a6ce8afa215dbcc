"""Training/inference mismatch: an engine's reported log-probs vs the policy's own forward pass.

PPO's ratio divides the policy's probability of a token by the one the rollout engine
reported; when the two differ for the same weights, the update is off-policy by that much.
`policy_log_probs` is the trainer's side (one plain forward pass, no cache, no batching);
`mismatch` summarises |engine − policy| over a set of recorded tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def policy_log_probs(
    model: Any, prompt_ids: Sequence[int], response_ids: Sequence[int], temperature: float = 1.0
) -> list[float]:
    """Log-probs of `response_ids` after `prompt_ids` under `model` (logits divided by temperature)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, -1)[len(prompt_ids) - 1 : -1]
    return lp.gather(1, torch.tensor(list(response_ids), device=device)[:, None])[:, 0].tolist()


def mismatch(engine: Sequence[Sequence[float]], policy: Sequence[Sequence[float]]) -> dict[str, float]:
    """Mean and max |engine − policy| over every token of every sequence, and the token count."""
    diffs = [abs(a - b) for e, p in zip(engine, policy, strict=True) for a, b in zip(e, p, strict=True)]
    if not diffs:
        return {"mean_abs": float("nan"), "max_abs": float("nan"), "tokens": 0.0}
    return {"mean_abs": sum(diffs) / len(diffs), "max_abs": max(diffs), "tokens": float(len(diffs))}
