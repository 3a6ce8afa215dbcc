"""Fixtures: the demo tokenizer, tiny models, and inference servers over them (module-scoped)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from agentlightning.tiny_model import build_model, build_tokenizer
from agentlightning.torch_backend.engine import TorchEngine
from agentlightning.torch_backend.openai_backend import InferenceServer

from .tiny import TINY, fresh_copy, train_tool_model


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tokenizer: Any) -> Any:
    torch.set_num_threads(2)
    return build_model(TINY, seed=1, tokenizer=tokenizer)


@pytest.fixture(scope="session")
def tool_model(tokenizer: Any) -> Any:
    return train_tool_model(tokenizer)


@pytest.fixture(scope="module")
def server(tiny_model: Any, tokenizer: Any) -> Iterator[InferenceServer]:
    engine = TorchEngine(fresh_copy(tiny_model, tokenizer), tokenizer, seed=0)
    srv = InferenceServer(engine, "policy").start()
    yield srv
    srv.stop()
    engine.close()


@pytest.fixture(scope="module")
def tool_server(tool_model: Any, tokenizer: Any) -> Iterator[InferenceServer]:
    engine = TorchEngine(tool_model, tokenizer, seed=0)
    srv = InferenceServer(engine, "policy").start()
    yield srv
    srv.stop()
    engine.close()
