"""Our SFT rows in verl's SFT dataset format: a parquet file of token ids, and the dataset class
verl's SFT trainer loads it with (its `data.custom_cls` hook).

verl's own `MultiTurnSFTDataset` tokenises chats itself. Our rows are tokens already — the exact ids
the Gateway recorded, or chats rendered by `trainer.sft_data.chat_rows` — so they are written as
ids and read back as they are. An item is what verl's `SFTTensorCollator` and `sft_loss` take in
`pad_mode: no_padding`: `input_ids` = the row's prompt then its response, `loss_mask` 1 on the
row's trainable tokens (its `response_mask`: the model's own tokens) and 0 on the prompt,
`position_ids` 0..n-1.

    verl data config:  custom_cls.path=<this file>  custom_cls.name=RowsSFTDataset
                       train_files=<write_rows' file>  pad_mode=no_padding
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.utils.data import Dataset

from agentlightning.rows import TrainingRow
from agentlightning.trainer.sft_data import SFTDataError

DATASET_CLASS = "RowsSFTDataset"
COLUMNS = ("input_ids", "loss_mask")


def row_item(row: TrainingRow) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one row."""
    ids = list(row.prompt_ids) + list(row.response_ids)
    mask = [0] * len(row.prompt_ids) + [int(m) for m in row.response_mask]
    return ids, mask


def write_rows(rows: Sequence[TrainingRow], path: str | Path) -> Path:
    """The rows as a parquet file of `input_ids` and `loss_mask` lists, in order."""
    items = [row_item(r) for r in rows]
    for n, (_, mask) in enumerate(items):
        if mask and mask[0]:  # verl's sft_loss scores token t from the tokens before it
            raise SFTDataError(f"row {n} trains its first token, which has no context to predict it from")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame({"input_ids": [ids for ids, _ in items], "loss_mask": [mask for _, mask in items]})
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


class RowsSFTDataset(Dataset[dict[str, torch.Tensor]]):
    """verl's SFT dataset interface (the constructor `create_sft_dataset` calls) over `write_rows`
    files. The tokenizer and processor are not used: the ids are the rows'."""

    def __init__(
        self,
        parquet_files: str | Sequence[str],
        tokenizer: Any = None,
        config: Any = None,
        processor: Any = None,
        max_samples: int = -1,
    ) -> None:
        pad_mode = str(config.get("pad_mode", "no_padding")) if config is not None else "no_padding"
        if pad_mode != "no_padding":
            raise ValueError(
                f"{DATASET_CLASS} gives unpadded rows: set data.pad_mode=no_padding, not {pad_mode}"
            )
        files = [parquet_files] if isinstance(parquet_files, str | Path) else list(parquet_files)
        self.input_ids: list[list[int]] = []
        self.loss_mask: list[list[int]] = []
        for file in files:
            frame = pd.read_parquet(file, columns=list(COLUMNS))
            self.input_ids += [[int(t) for t in ids] for ids in frame["input_ids"]]
            self.loss_mask += [[int(m) for m in mask] for mask in frame["loss_mask"]]
        if max_samples is not None and max_samples > 0:
            self.input_ids, self.loss_mask = self.input_ids[:max_samples], self.loss_mask[:max_samples]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.tensor(self.input_ids[index], dtype=torch.long)
        return {
            "input_ids": ids,
            "position_ids": torch.arange(len(ids), dtype=torch.long),
            "loss_mask": torch.tensor(self.loss_mask[index], dtype=torch.long),
        }
