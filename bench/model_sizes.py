"""The tiny Qwen2 models the engine benches build (engines, vllm_mismatch, lora_publish): random
init, an untied output head (a reload into vLLM keeps a tied one stale), heads of 32 or more
(vLLM-CPU's smallest). `demo` is agl-demo's vLLM recipe (demo.yaml's `vllm_model`)."""

from __future__ import annotations

from agentlightning.tiny_model import TinyModelConfig

SIZES = {
    "demo": TinyModelConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    ),
    "mid": TinyModelConfig(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
    ),
    "wide": TinyModelConfig(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=8,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "120m": TinyModelConfig(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
    ),
}
for _config in SIZES.values():
    _config.tie_word_embeddings = False


def size(name: str) -> TinyModelConfig:
    """A copy of size `name` (a bench may change it)."""
    from dataclasses import replace

    return replace(SIZES[name])
