"""agl-sft: the rows (chats rendered with the chat template, the Gateway's records selected and
aggregated as RL does), the mask (only the model's own tokens), the refusals before anything
trains, and a fine-tuning run whose checkpoint agl-eval reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentlightning.client import GatewayClient
from agentlightning.config.schema import ConfigError
from agentlightning.evaluation.policies import export_checkpoint, parse_policy
from agentlightning.tiny_model import byte_tokenizer
from agentlightning.torch_backend.models import load_model
from agentlightning.torch_backend.sft import (
    MODEL_DIR,
    PROG,
    SFTConfig,
    batches,
    load_sft_config,
    main,
    run_sft,
)
from agentlightning.trainer.checkpoint import LOOP_STATE_FILE, LORA_KEY
from agentlightning.trainer.sft_data import (
    Selection,
    SelectionCounts,
    SFTDataError,
    chat_rows,
    render_chat,
    store_rows,
)

from ..trainer.driver import finish, two_turn_calls

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def quiet_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() in this process: its logging set-up would bind structlog to the captured stderr."""
    monkeypatch.setattr("agentlightning.config.loader.configure_logging", lambda level: None)


CALC_TOOL = {
    "type": "function",
    "function": {"name": "calculator", "parameters": {"properties": {"expression": {"type": "string"}}}},
}
TOOL_CHAT: dict[str, list[dict[str, Any]]] = {
    "messages": [
        {"role": "user", "content": "2 plus 3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "5"},
        {"role": "assistant", "content": "The answer is 5."},
    ],
    "tools": [CALC_TOOL],
}


def runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The maximal runs of masked (trainable) tokens."""
    out: list[list[int]] = []
    for i, (t, m) in enumerate(zip(ids, mask, strict=True)):
        if m:
            if i == 0 or not mask[i - 1]:
                out.append([])
            out[-1].append(t)
    return out


# --- the mask -------------------------------------------------------------------------------


def test_the_mask_covers_the_assistant_turn_and_its_end_token_only() -> None:
    tok = byte_tokenizer()  # one token a byte, one a marker: the counts are the text's
    ids, mask = render_chat(
        tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], None
    )
    # "<|im_start|>" "user\n" "hi" "<|im_end|>" "\n" "<|im_start|>" "assistant\n": 1+5+2+1+1+1+10 = 21 context
    # tokens, then "o" "k" "<|im_end|>" (3, trainable), then the template's closing "\n" (context).
    assert mask == [0] * 21 + [1, 1, 1] + [0]
    assert tok.decode(ids[21:24]) == "ok<|im_end|>"
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n"


def test_a_tool_chat_trains_the_tool_call_and_the_answer_never_the_tool_output() -> None:
    tok = byte_tokenizer()
    ids, mask = render_chat(tok, TOOL_CHAT["messages"], TOOL_CHAT["tools"])
    turns = [tok.decode(r) for r in runs(ids, mask)]
    assert turns == [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>',
        "The answer is 5.<|im_end|>",
    ]
    context = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "<tool_response>\n5\n</tool_response>" in context and "Tools: calculator(expression)" in context
    # The whole sequence is the template's rendering of the chat, token for token.
    whole = tok.apply_chat_template(TOOL_CHAT["messages"], tools=TOOL_CHAT["tools"], tokenize=False)
    assert tok.decode(ids) == whole


def test_chat_rows_put_the_first_assistant_turn_at_the_response_start(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(TOOL_CHAT) + "\n\n" + json.dumps(TOOL_CHAT) + "\n")
    rows = chat_rows(path, byte_tokenizer())
    assert len(rows) == 2 and rows[0].response_mask[0] == 1 and rows[0].prompt_ids
    assert all(len(r.response_ids) == len(r.response_mask) == len(r.model_versions) for r in rows)


def test_a_step_weighs_every_trainable_token_the_same(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    short = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    path.write_text(json.dumps(short) + "\n" + json.dumps(TOOL_CHAT) + "\n")
    rows = chat_rows(path, byte_tokenizer())
    (step,) = batches(rows, 2, __import__("random").Random(0))
    total = sum(r.n_trainable for r in step)  # 2 ("b<|im_end|>") + the tool chat's
    assert sum(r.n_trainable for r in rows if len(r.response_ids) < 5) == 2
    assert all(r.loss_weight == pytest.approx(1 / total) for r in step)
    assert sum(r.loss_weight * r.n_trainable for r in step) == pytest.approx(1.0)


# --- refused before anything trains ------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('{"prompt": "2+3", "completion": "5"}', "line 2: not a chat"),
        ("[1, 2]", "line 2: not a chat"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "line 2: the chat has no assistant turn"),
        ('{"messages": [{"role": "robot", "content": "hi"}]}', "line 2: messages[0] is not a chat message"),
        ('{"messages": [{"role": "user"', "line 2: not valid JSON"),
        ('{"messages": [{"role": "assistant", "content": "x"}]}', "line 2: the chat opens with an assistant"),
    ],
)
def test_a_line_that_is_not_a_chat_is_refused_naming_it(tmp_path: Path, line: str, said: str) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(TOOL_CHAT) + "\n" + line + "\n")
    with pytest.raises(SFTDataError) as exc:
        chat_rows(path, byte_tokenizer())
    assert str(exc.value).startswith(f"{path} {said}")


def test_the_command_refuses_a_bad_chat_file_and_writes_no_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quiet_logging: None
) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text('{"text": "not a chat"}\n')
    out = tmp_path / "ckpt"
    with pytest.raises(SystemExit) as exc:
        main(["model.path=demo", "data.source=chats", f"data.chats_file={path}", f"output_dir={out}"])
    assert exc.value.code == 2
    assert f"{PROG}: {path} line 1: not a chat" in capsys.readouterr().err
    assert not out.exists()


def test_a_misspelt_key_fails_with_the_closest_one() -> None:
    base = {"model": {"path": "demo"}, "data": {"gateway": {"url": "http://x"}}}
    with pytest.raises(ConfigError, match=r"train.lrr: not a key of train \(did you mean train.lr\?\)"):
        load_sft_config({**base, "train": {"lrr": 0.1}})
    with pytest.raises(ConfigError, match=r"data.select.min_rewrd.*did you mean data.select.min_reward"):
        load_sft_config({**base, "data": {"gateway": {"url": "http://x"}, "select": {"min_rewrd": 1}}})
    with pytest.raises(ConfigError, match=r"outptu_dir: not a key of agl-sft \(did you mean output_dir\?\)"):
        load_sft_config({**base, "outptu_dir": "x"})
    with pytest.raises(ConfigError, match=r"data\.source=chats needs data\.chats_file"):
        load_sft_config({"model": {"path": "demo"}, "data": {"source": "chats"}})
    with pytest.raises(ConfigError, match=r"model\.lora_rank must be an integer >= 0"):
        load_sft_config({**base, "model": {"path": "demo", "lora_rank": -1}})
    with pytest.raises(ConfigError, match=r"data\.select\.best_of_n must be >= 1"):
        load_sft_config({**base, "data": {"gateway": {"url": "http://x"}, "select": {"best_of_n": 0}}})


# --- fine-tuning, and the checkpoint agl-eval reads -----------------------------------------------


def nll(model: Any, rows: list[Any]) -> float:
    """Mean negative log-likelihood of the rows' trainable tokens."""
    total, n = 0.0, 0
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r.prompt_ids + r.response_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            targets = ids[0, 1:]
            token_lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[len(r.prompt_ids) - 1 :]
            mask = torch.tensor(r.response_mask, dtype=torch.float32)
            total += float(-(token_lp * mask).sum())
            n += int(mask.sum())
    return total / n


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_fine_tuning_on_chats_lowers_their_loss_and_agl_eval_reads_the_checkpoint(
    tmp_path: Path, lora_rank: int
) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(TOOL_CHAT) + "\n")
    config = load_sft_config(
        {
            "model": {"path": "demo", "lora_rank": lora_rank, "lora_alpha": 8},
            "data": {"source": "chats", "chats_file": str(path)},
            "train": {"epochs": 12, "batch_size": 1, "lr": 1e-2 if lora_rank else 3e-3},
            "output_dir": str(tmp_path / "sft"),
            "device": "cpu",
        }
    )
    assert isinstance(config, SFTConfig)
    base, tokenizer = load_model("demo", torch.device("cpu"), torch.float32, 0)
    rows = chat_rows(path, tokenizer)
    before = nll(base, rows)
    folder = run_sft(config)
    assert folder == tmp_path / "sft" / "global_step_12"
    state = json.loads((folder / LOOP_STATE_FILE).read_text())
    assert state["config"]["actor_rollout_ref"]["model"]["path"] == "demo"
    assert state["config"]["actor_rollout_ref"]["model"]["lora_rank"] == lora_rank
    trained, _ = load_model(str(folder / MODEL_DIR), torch.device("cpu"), torch.float32)
    after = nll(trained, rows)
    assert after < before - (0.3 if lora_rank else 1.5), (
        before,
        after,
    )  # an adapter on random weights learns slower
    saved = torch.load(folder / "policy_state.pt", weights_only=False)["policy"]["model"]
    assert all(LORA_KEY in k for k in saved) == bool(lora_rank)
    # agl-eval: the run's folder names its latest checkpoint, which exports to the same weights.
    policy = parse_policy(f"sft={tmp_path / 'sft'}")
    assert policy.kind == "checkpoint" and policy.source == str(folder)
    exported, _ = load_model(
        str(export_checkpoint(policy.source, tmp_path / "exported")), torch.device("cpu"), torch.float32
    )
    assert nll(exported, rows) == pytest.approx(after, rel=1e-5)


# --- from the Gateway's records --------------------------------------------------------------


def record(client: GatewayClient, rollout_id: str, group: str, seed: int, reward: float | None) -> None:
    client.create_rollouts([{"rollout_id": rollout_id, "metadata": {"data_id": group}}])
    finish(client, rollout_id, two_turn_calls(seed), reward)


@pytest.mark.process
def test_recorded_rollouts_are_selected_and_built_into_rl_rows(gateway: Any) -> None:
    with GatewayClient(gateway.url, gateway.key) as client:
        record(client, "runA-g1-0", "g1", 1, 1.0)
        record(client, "runA-g1-1", "g1", 2, 0.0)
        record(client, "runA-g1-2", "g1", 3, 1.0)
        record(client, "runA-g2-0", "g2", 4, 1.0)
        record(client, "runB-g3-0", "g3", 5, 1.0)
        record(client, "runA-g4-0", "g4", 6, None)  # no reward posted

        rows = store_rows(client, Selection(min_reward=1.0, id_prefix="runA-"))
        assert sorted(r.rollout_id for r in rows) == ["runA-g1-0", "runA-g1-2", "runA-g2-0"]
        # The RL rows: prompt [1, 2, seed]; the first response, the tool output (context), the second.
        row = next(r for r in rows if r.rollout_id == "runA-g1-0")
        assert row.prompt_ids == [1, 2, 1]
        assert row.response_ids == [11, 11, 90, 91, 13]
        assert row.response_mask == [1, 1, 0, 0, 1]
        assert row.group_id == "g1" and row.reward == 1.0

        best = store_rows(client, Selection(min_reward=None, best_of_n=1, id_prefix="runA-"))
        assert sorted(r.rollout_id for r in best) == ["runA-g1-0", "runA-g2-0", "runA-g4-0"]

        counts = SelectionCounts()
        with pytest.raises(SFTDataError, match="the selection holds nothing to train on") as exc:
            store_rows(client, Selection(min_reward=2.0), counts=counts)
        assert "6 terminal rollouts on the Gateway" in str(exc.value)
        assert "0 at or above the reward threshold (1 with no reward)" in str(exc.value)
        with pytest.raises(SFTDataError, match="0 in the time range"):
            store_rows(client, Selection(recorded_after=4e9))


@pytest.mark.process
def test_the_command_refuses_an_empty_selection_before_training(
    gateway: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], quiet_logging: None
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "model.path=demo",
                f"data.gateway.url={gateway.url}",
                f"data.gateway.key={gateway.key}",
                f"output_dir={tmp_path / 'ckpt'}",
            ]
        )
    assert exc.value.code == 2
    assert "the selection holds nothing to train on: 0 terminal rollouts" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()
