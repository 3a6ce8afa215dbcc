"""Model loading for the torch backend: a Hugging Face directory, or a built-in model by name.

Built-in models are named in `BUILTIN_MODELS`, each with its builder (a function
`(seed=...) -> (model, tokenizer)`): `demo`, the shipped default `model.path`, is
`agentlightning.tiny_model`'s tiny Qwen2 (a light import: its builders import transformers when
called). `model.path` may also be the import path of a builder (`package.module:function`), for a
model built in code elsewhere.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from agentlightning.tiny_model import build_tiny

ModelBuilder = Callable[..., tuple[Any, Any]]
"""`builder(seed=...)` → (model, tokenizer), both built in code (nothing downloaded)."""

BUILTIN_MODELS: dict[str, ModelBuilder] = {
    "demo": build_tiny,  # the tiny Qwen2 of the demo and the tests, random init
}


def is_builtin(name: str) -> bool:
    """Whether `name` is built in code (a built-in name or a `module:function` path), not a directory."""
    return name in BUILTIN_MODELS or _is_import_path(name)


def _is_import_path(name: str) -> bool:
    module, sep, function = name.partition(":")
    return bool(sep) and function.isidentifier() and all(p.isidentifier() for p in module.split("."))


def model_builder(name: str) -> ModelBuilder:
    """The builder a built-in name or a `module:function` path refers to."""
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]
    module_name, _, function = name.partition(":")
    builder = getattr(importlib.import_module(module_name), function, None)
    if not callable(builder):
        raise ValueError(f"model {name!r}: {module_name} has no function {function!r}")
    return builder  # a callable found by name: its type is the contract


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype must be one of auto, {', '.join(table)}; got {dtype!r}")
    return table[dtype]


def load_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) from a Hugging Face directory, or built in code for a built-in name."""
    if is_builtin(name):
        model, tokenizer = model_builder(name)(seed=seed)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def load_tokenizer(name: str, seed: int = 0) -> Any:
    """The tokenizer of a Hugging Face directory (or hub name), or of a built-in model."""
    if is_builtin(name):
        return model_builder(name)(seed=seed)[1]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
