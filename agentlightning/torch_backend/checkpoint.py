"""The torch backend's part of a checkpoint (the loop's part and the layout: `trainer.checkpoint`).

global_step_{N}/policy_state.pt     the policy's weights, AdamW and learning-rate scheduler
                                    state, and torch's RNG states
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentlightning.trainer.checkpoint import POLICY_STATE_FILE


def torch_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_torch_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_policy_state(folder: Path, state: dict[str, Any]) -> None:
    torch.save(state, folder / POLICY_STATE_FILE)


def load_policy_state(folder: str | Path) -> dict[str, Any]:
    file = Path(folder) / POLICY_STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"no torch backend state in the checkpoint {folder} (expected {file})")
    return torch.load(file, map_location="cpu", weights_only=False)
