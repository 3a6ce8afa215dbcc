"""The few Hugging Face calls whose spelling changed between transformers 4.4x and 5.x.

The engine keeps its KV cache as plain tensors (one `(key, value)` pair per layer, shape
`[batch, kv_heads, seq, head_dim]`) so that it can merge, select and trim batches itself; these
helpers convert between that form and whatever cache object the installed transformers wants.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]


@cache
def _forward_params(cls: Any) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def forward(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    kv: KV | None = None,
    last_only: bool = False,
    use_cache: bool = True,
) -> tuple[torch.Tensor, KV | None]:
    """Run the model; return logits (all positions, or the last one) and the new KV tensors."""
    params = _forward_params(model.__class__)
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": use_cache,
    }
    cache_obj = to_cache(kv) if kv is not None else None
    cache_arg = "cache" if "cache" in params else "past_key_values"
    if cache_obj is not None:
        kwargs[cache_arg] = cache_obj
    if last_only:
        if "logits_to_keep" in params:
            kwargs["logits_to_keep"] = 1
        elif "num_logits_to_keep" in params:
            kwargs["num_logits_to_keep"] = 1
    out = model(**kwargs)
    logits = out.logits[:, -1] if last_only else out.logits
    if not use_cache:
        return logits, None
    new_cache = getattr(out, "cache", None)
    if new_cache is None:
        new_cache = out.past_key_values
    return logits, from_cache(new_cache)


def to_cache(kv: KV) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(ddp_cache_data=kv)
    except TypeError:  # transformers < 4.52
        return DynamicCache.from_legacy_cache(tuple(kv))  # type: ignore[attr-defined]  # removed in 4.52


def from_cache(cache_obj: Any) -> KV:
    layers = getattr(cache_obj, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    if isinstance(cache_obj, tuple):
        return [(k, v) for k, v in cache_obj]
    return list(zip(cache_obj.key_cache, cache_obj.value_cache, strict=True))


def logits_for_last(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    keep: int,
) -> torch.Tensor:
    """Logits of the last `keep` positions only (training: the response part of left-padded rows)."""
    params = _forward_params(model.__class__)
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": False,
    }
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = keep
    elif "num_logits_to_keep" in params:
        kwargs["num_logits_to_keep"] = keep
    logits = model(**kwargs).logits
    return logits[:, -keep:]
