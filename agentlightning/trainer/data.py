"""Training data: rollout inputs read from files, and a resumable position in them.

Every sample is one rollout input (a JSON object, as v1.0 passes a row of its parquet file).
The order is fixed by a seed: epoch `e` visits the samples in the permutation drawn from
`(seed, e)`, so a run resumed from a checkpoint's position sees exactly the samples an
uninterrupted run would have seen next.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentlightning.config.schema import ConfigError


def load_samples(path: str | Path, key: str = "data.train_files") -> list[dict[str, Any]]:
    """Samples of a `.jsonl` file (one object per line), a `.json` file (a list of objects) or
    a `.parquet` file (needs pandas). `key` names the setting in error messages."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{key}: {path} is not a file")
    suffix = p.suffix.lower()
    samples: list[Any]
    if suffix == ".parquet":
        try:
            import pandas as pd
        except ImportError:
            raise ConfigError(f"{key}: reading {path} needs pandas (pip install pandas pyarrow)") from None
        samples = pd.read_parquet(p).to_dict(orient="records")
    elif suffix == ".json":
        try:
            samples = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{key}: {path} is not valid JSON: {exc}") from None
        if not isinstance(samples, list):
            raise ConfigError(f"{key}: {path} must hold a JSON list of samples")
    elif suffix == ".jsonl":
        samples = []  # filled line by line below
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{key}: {path} line {n} is not valid JSON: {exc}") from None
    else:
        raise ConfigError(f"{key}: {path} must end in .jsonl, .json or .parquet")
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise ConfigError(f"{key}: sample {i} of {path} is a {type(sample).__name__}, not an object")
    if not samples:
        raise ConfigError(f"{key}: {path} holds no samples")
    return samples


def load_files(paths: str | Sequence[str] | None, key: str) -> list[dict[str, Any]]:
    """The samples of one path or a list of paths (verl accepts both), in order."""
    if paths is None:
        return []
    if isinstance(paths, str):
        paths = [paths]
    return [s for p in paths for s in load_samples(p, key)]


class DataCursor:
    """Hands out samples in a seeded per-epoch order; its position is what a checkpoint saves."""

    def __init__(
        self, samples: Sequence[Any], total_epochs: int, shuffle: bool = True, seed: int = 0
    ) -> None:
        if not samples:
            raise ValueError("the training data holds no samples")
        if total_epochs < 1:
            raise ValueError(f"total_epochs must be >= 1, got {total_epochs}")
        self.samples = list(samples)
        self.total_epochs = total_epochs
        self.shuffle = shuffle
        self.seed = seed
        self.position = 0  # samples handed out so far, over all epochs
        self._epoch = -1
        self._order: list[int] = []

    @property
    def total(self) -> int:
        return len(self.samples) * self.total_epochs

    @property
    def epoch(self) -> int:
        return min(self.position // len(self.samples), self.total_epochs - 1)

    @property
    def exhausted(self) -> bool:
        return self.position >= self.total

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.samples)))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def next(self, k: int) -> list[Any]:
        """The next `k` samples (fewer only at the end of the last epoch)."""
        out: list[Any] = []
        n = len(self.samples)
        while len(out) < k and self.position < self.total:
            epoch, index = divmod(self.position, n)
            out.append(self.samples[self._order_of(epoch)[index]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "n_samples": len(self.samples), "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("n_samples") != len(self.samples):
            raise ValueError(
                f"the checkpoint was taken with {state.get('n_samples')} training samples, "
                f"this run has {len(self.samples)}: resume with the same data.train_files"
            )
        self.position = int(state["position"])
