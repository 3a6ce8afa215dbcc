"""`agl-sft backend=verl`: verl's own SFT trainer (FSDP2 on CPU with the test-only platform, in a
subprocess: `cpu_sft.py`) on the torch path's rows from chats — its first loss is the torch NLL
of those rows (same ids, same mask), a few steps lower it, and the checkpoint is the torch
layout that agl-eval and RL read; LoRA too. And what verl cannot do, refused naming the key."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.torch_backend.test_sft import TOOL_CHAT, nll
from tests.torch_backend.tiny import TINY

from .conftest import REPO, SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

import torch

from agentlightning.commands.backends import sft_main as agl_sft
from agentlightning.evaluation.policies import export_checkpoint, parse_policy
from agentlightning.rows import TrainingRow
from agentlightning.tiny_model import build_tiny, save_tiny
from agentlightning.torch_backend.models import load_model
from agentlightning.trainer.checkpoint import LOOP_STATE_FILE, LORA_KEY
from agentlightning.trainer.sft import MODEL_DIR, load_sft_config
from agentlightning.trainer.sft_data import SFTDataError, chat_rows
from agentlightning.verl.sft import ROWS_FILE, prepare_rows, verl_config
from agentlightning.verl.sft_rows import row_item, write_rows

pytestmark = pytest.mark.timeout(600)

SHORT_CHAT = {
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
}
EPOCHS = 4


def tiny_and_chats(tmp_path: Path) -> tuple[Path, Path]:
    model, tokenizer = build_tiny(TINY, seed=4)
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps(TOOL_CHAT) + "\n" + json.dumps(SHORT_CHAT) + "\n")
    return save_tiny(tmp_path / "tiny", model, tokenizer), chats


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_verl_sft_trains_the_torch_rows_into_a_checkpoint_agl_eval_reads(
    tmp_path: Path, lora_rank: int
) -> None:
    model_dir, chats = tiny_and_chats(tmp_path)
    out = tmp_path / "sft"
    base, tokenizer = load_model(str(model_dir), torch.device("cpu"), torch.float32)
    rows = chat_rows(chats, tokenizer)  # the torch backend's rows (trainer.sft.load_rows)
    before = nll(base, rows)

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.verl.cpu_sft",
            f"model.path={model_dir}",
            f"model.lora_rank={lora_rank}",
            "model.lora_alpha=8",
            "data.source=chats",
            f"data.chats_file={chats}",
            f"output_dir={out}",
            f"train.epochs={EPOCHS}",
            "train.batch_size=2",  # both rows in each step
            "train.micro_batch_size=1",  # two forward passes a step: the gradient accumulates
            f"train.lr={1e-2 if lora_rank else 3e-3}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    said = re.search(r"^agl-sft backend=verl: checkpoint (.+)$", done.stdout, re.M)
    assert said, done.stdout[-3000:]
    folder = Path(said[1])
    assert folder == out / f"global_step_{EPOCHS}"

    # The rows verl trained on are the torch path's: its dataset (loaded as verl's trainer loads it,
    # through data.custom_cls) yields each row's ids with the loss on its trainable tokens only...
    from verl.utils.import_utils import load_extern_object

    config = load_sft_config(
        {"model": {"path": str(model_dir)}, "data": {"source": "chats", "chats_file": str(chats)}}
    )
    data_cfg = verl_config(config, out / ROWS_FILE).data
    dataset = load_extern_object(data_cfg.custom_cls.path, data_cfg.custom_cls.name)(
        parquet_files=data_cfg.train_files, tokenizer=tokenizer, config=data_cfg, processor=None
    )
    assert len(dataset) == len(rows)
    for n, row in enumerate(rows):
        ids, mask = row_item(row)
        assert dataset[n]["input_ids"].tolist() == ids and dataset[n]["loss_mask"].tolist() == mask
        assert sum(mask) == row.n_trainable > 0
    # ...and verl's first loss (before any update, over both rows) is the torch NLL of those rows.
    losses = [float(v) for v in re.findall(r"train/loss:([0-9.eE+-]+)", done.stdout)]
    assert len(losses) == EPOCHS
    assert losses[0] == pytest.approx(before, rel=1e-5)
    assert losses[-1] < losses[0]

    state = json.loads((folder / LOOP_STATE_FILE).read_text())
    assert state["backend"] == "verl" and state["kind"] == "sft"
    assert state["config"]["actor_rollout_ref"]["model"]["path"] == str(model_dir)
    assert state["config"]["actor_rollout_ref"]["model"]["lora_rank"] == lora_rank
    assert state["metrics"]["sft/rows"] == len(rows)
    trained, _ = load_model(str(folder / MODEL_DIR), torch.device("cpu"), torch.float32)
    after = nll(trained, rows)
    assert after < before - (0.1 if lora_rank else 0.5), (before, after)
    saved = torch.load(folder / "policy_state.pt", weights_only=False)["policy"]["model"]
    assert all(LORA_KEY in k for k in saved) == bool(lora_rank)
    assert (folder / "adapter").is_dir() == bool(lora_rank)
    # agl-eval: the run's folder names this checkpoint, which exports to the same weights.
    policy = parse_policy(f"sft={out}")
    assert policy.kind == "checkpoint" and policy.source == str(folder)
    exported, _ = load_model(
        str(export_checkpoint(policy.source, tmp_path / "exported")), torch.device("cpu"), torch.float32
    )
    assert nll(exported, rows) == pytest.approx(after, rel=1e-5)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["device=cpu"], "device=cpu: verl's SFT trainer runs one process per GPU"),
        (["model.path=demo"], "model.path=demo: neither a folder nor a hub id"),
        (
            ["model.lora_rank=4", "model.lora_alpha=1.5"],
            "model.lora_alpha=1.5: verl's LoRA takes a whole number",
        ),
        (["verl_overrides=[engine.strategyy=fsdp2]"], "verl_overrides: verl's SFT config refuses them"),
        (["verl_overrides=[engine.strategy]"], "verl_overrides: 'engine.strategy' is not key=value"),
        (["verl_overrides=[optim.lr=0.1]"], "verl_overrides: optim.lr is set by agl-sft from train.lr"),
    ],
)
def test_agl_sft_backend_verl_refuses_what_verl_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps(SHORT_CHAT) + "\n")
    common = [
        f"model.path={tmp_path}",
        "data.source=chats",
        f"data.chats_file={chats}",
        f"output_dir={tmp_path / 'o'}",
    ]
    with pytest.raises(SystemExit) as exited:
        agl_sft(["backend=verl", *common, *args])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("train", "said"),
    [
        ({"batch_size": 3}, "train.batch_size=3 is more than the 2 rows"),
        ({"batch_size": 2, "micro_batch_size": 3}, None),  # one forward pass of the step's 2 rows
        ({"batch_size": 4, "micro_batch_size": 3}, "train.micro_batch_size=3 must divide the 4 rows"),
    ],
)
def test_the_batch_sizes_verl_cannot_split_are_refused_before_training(
    tmp_path: Path, train: dict[str, int], said: str | None
) -> None:
    model_dir, chats = tiny_and_chats(tmp_path)
    if train["batch_size"] == 4:
        chats.write_text((json.dumps(SHORT_CHAT) + "\n") * 4)
    config = load_sft_config(
        {
            "model": {"path": str(model_dir)},
            "data": {"source": "chats", "chats_file": str(chats)},
            "train": train,
            "output_dir": str(tmp_path / "o"),
        }
    )
    if said is None:
        path, seen = prepare_rows(config, world_size=1)
        assert path == tmp_path / "o" / ROWS_FILE and seen["sft/rows"] == 2
        return
    with pytest.raises(Exception, match=re.escape(said)):
        prepare_rows(config, world_size=1)
    assert not (tmp_path / "o" / ROWS_FILE).exists()


def test_a_row_that_trains_its_first_token_is_refused(tmp_path: Path) -> None:
    row = TrainingRow(
        rollout_id="r",
        group_id="g",
        prompt_ids=[],
        response_ids=[5, 6],
        response_mask=[1, 1],
        rollout_log_probs=None,
        model_versions=[0, 0],
        reward=1.0,
    )
    with pytest.raises(SFTDataError, match="row 0 trains its first token"):
        write_rows([row], tmp_path / "rows.parquet")


def test_the_torch_backend_refuses_verl_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps(SHORT_CHAT) + "\n")
    with pytest.raises(SystemExit) as exited:
        agl_sft(
            [
                "model.path=demo",
                "data.source=chats",
                f"data.chats_file={chats}",
                f"output_dir={tmp_path / 'o'}",
                "verl_overrides=[engine.strategy=fsdp2]",
            ]
        )
    assert exited.value.code == 2
    assert "verl_overrides is read by backend=verl only" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
