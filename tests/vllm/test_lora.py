"""LoRA in real vLLM: the base served with --enable-lora, the adapter swapped in at each publish
under the Gateway's model name; the served log-probs equal the policy's (base + adapter)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentlightning.torch_backend.lora import adapter_state, apply_lora, lora_settings
from agentlightning.torch_backend.vllm_engine import VLLMEngine
from agentlightning.torch_backend.vllm_server import VLLMServerConfig

from .conftest import SERVED_NAME
from .scripted import save_scripted_model
from .test_weights import measure, sample

pytestmark = pytest.mark.timeout(2400)  # a hang guard, not a speed test: machines may be busy


def perturb_adapter(peft_model: Any, seed: int, scale: float = 0.5) -> None:
    """Random adapter values (a fresh adapter's B is zero: it would change nothing)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in adapter_state(peft_model.get_base_model()).values():
            t.copy_(torch.randn(t.shape, generator=gen) * scale / t.shape[-1] ** 0.5)


@pytest.fixture(scope="module")
def lora_engine(
    vllm_ready: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VLLMEngine, Any]]:
    model_dir = save_scripted_model(tmp_path_factory.mktemp("scripted") / "model")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    peft_model = apply_lora(model, lora_settings(8, 16, "all-linear"))
    perturb_adapter(peft_model, seed=1)
    config = VLLMServerConfig(
        python=vllm_ready, dtype="float32", max_model_len=1024, start_timeout_seconds=1800
    )
    engine = VLLMEngine(
        AutoTokenizer.from_pretrained(model_dir),
        SERVED_NAME,
        config,
        tmp_path_factory.mktemp("vllm"),
        lora_rank=8,
    )
    engine.start(peft_model)
    try:
        yield engine, peft_model
    finally:
        engine.close()


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_the_served_adapter_has_the_policys_log_probs_and_a_publish_swaps_it(
    lora_engine: tuple[VLLMEngine, Any],
) -> None:
    engine, peft_model = lora_engine
    policy = peft_model.get_base_model()
    base_url = engine.endpoints[0].removesuffix("/v1")
    names = {m["id"] for m in httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"]}
    assert names == {SERVED_NAME, f"{SERVED_NAME}-base"}

    first = measure(policy, sample(base_url, seed=1))
    assert first["tokens"] >= 40 and first["mean_abs"] < 1e-4 and first["max_abs"] < 1e-3, first

    old = {k: v.clone() for k, v in adapter_state(policy).items()}
    perturb_adapter(peft_model, seed=2)
    engine.publish(peft_model, 1)
    assert engine.version == 1
    after = sample(base_url, seed=1)
    on_new = measure(policy, after)
    assert on_new["mean_abs"] < 1e-4 and on_new["max_abs"] < 1e-3, on_new
    with torch.no_grad():  # the same answers scored with the previous adapter differ
        current = {k: v.clone() for k, v in adapter_state(policy).items()}
        for k, v in adapter_state(policy).items():
            v.copy_(old[k])
        on_old = measure(policy, after)
        for k, v in adapter_state(policy).items():
            v.copy_(current[k])
    assert on_old["mean_abs"] > 100 * max(on_new["mean_abs"], 1e-6), (on_old, on_new)

    # What a publish moved: the adapter's folder (only the latest is kept), not the base's.
    adapters = list(engine.adapters_dir.iterdir())
    assert [a.name for a in adapters] == ["v1"]
    assert folder_bytes(adapters[0]) * 5 < folder_bytes(engine.weights_dir / "base")
