"""The torch backend's training loop against a real Gateway and a real Controller (processes on
loopback), with the demo's tiny model: steps, validation, publish, metrics, checkpoints, and a
resume after the trainer is SIGKILLed that continues the step count and the data order."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from omegaconf import DictConfig, OmegaConf

from agentlightning.client import GatewayClient
from agentlightning.config.loader import load_cli_config
from agentlightning.config.schema import ConfigError
from agentlightning.demo.task import make_dataset
from agentlightning.procs import ManagedProcess
from agentlightning.torch_backend.checkpoint import load_policy_state
from agentlightning.torch_backend.trainer import TorchTrainer, run_ppo
from agentlightning.trainer.checkpoint import (
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_loop_state,
    step_dir,
)
from agentlightning.trainer.data import DataCursor
from agentlightning.trainer.failures import AllRolloutsFailed
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from tests.conftest import RunningGateway, trainer_key
from tests.controller.helpers import GATEWAY_OVERRIDES, REPO, start_controller

AGENT = "tests.torch_backend.loop_agent:TwoCallAgent"
BATCH, N = 2, 2


@pytest.fixture
def services(
    gateway_factory: Callable[..., RunningGateway], tmp_path: Path
) -> Iterator[tuple[RunningGateway, GatewayClient]]:
    gateway = gateway_factory(*GATEWAY_OVERRIDES)
    controller = start_controller(
        gateway.url, gateway.key, tmp_path / "agents", "local_runner.maximum_size=8", "log_level=warning"
    )
    client = GatewayClient(gateway.url, gateway.key)
    yield gateway, client
    client.close()
    controller.stop()


def config(tmp_path: Path, gateway: RunningGateway, **trainer: Any) -> DictConfig:
    cfg = load_cli_config("train", [], prog="test", strict=False)
    return OmegaConf.merge(
        cfg,
        {
            "data": {"train_batch_size": BATCH, "seed": 5},
            "actor_rollout_ref": {
                "actor": {"ppo_mini_batch_size": BATCH, "optim": {"lr": 1e-3}},
                "rollout": {"n": N, "device": "cpu"},
            },
            "trainer": {
                "output_dir": str(tmp_path / "run"),
                "logger": ["jsonl"],
                "torch_threads": 1,
                **trainer,
            },
            "agentlightning": {
                "agl_base_url": gateway.url,
                "agl_key": gateway.key,
                "keep_rollouts": True,
                "rollout_timeout_seconds": 60,
                "local": {"agent_class": AGENT, "env_map": {"QUESTION": "input.question"}},
            },
        },
    )  # type: ignore[return-value]


def inputs_by_step(client: GatewayClient, run_id: str | None = None) -> dict[int, list[str]]:
    """Problem ids of each training step's rollouts (one per group, in batch order)."""
    out: dict[int, dict[int, str]] = {}
    for rollout in client.list_rollouts(limit=1000):
        meta = rollout.metadata
        if (
            rollout.is_train
            and trainer_key(rollout, "index_in_group") == 0
            and run_id in (None, trainer_key(rollout, "run_id"))
        ):
            assert meta.batch_idx is not None and meta.sample_idx_in_batch is not None
            out.setdefault(meta.batch_idx, {})[meta.sample_idx_in_batch] = rollout.input["id"]
    return {step: [ids[i] for i in sorted(ids)] for step, ids in out.items()}


def expected_ids(train: list[dict[str, Any]], steps: int) -> dict[int, list[str]]:
    order = [s["id"] for s in DataCursor(train, 1, shuffle=True, seed=5).next(BATCH * steps)]
    return {s: order[(s - 1) * BATCH : s * BATCH] for s in range(1, steps + 1)}


def test_run_ppo_trains_validates_publishes_and_checkpoints(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path
) -> None:
    gateway, client = services
    train, val = make_dataset(8, seed=0, prefix="t"), make_dataset(3, seed=1, prefix="v")
    cfg = config(
        tmp_path,
        gateway,
        total_training_steps=2,
        test_freq=1,
        save_freq=1,
        keep_best=False,
        collapse_guard={"enable": False},
    )  # periodic checkpoints only (the best is test_a_collapse_...'s)
    final = run_ppo(cfg, train, val)

    assert final["val/n_rollouts"] == 3 and final["val/n_rollouts_failed"] == 0
    records = read_metrics(tmp_path / "run" / METRICS_FILE)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all("val/reward" in r for r in records)
    for r in records[1:]:
        assert r["training/n_rollouts"] == BATCH * N
        assert r["training/n_turns"] == 2 * BATCH * N  # two calls per rollout, all recorded
        assert r["actor/optimizer_steps"] == 1
    # Each update was published: the last checkpoint holds version 2, and every call of step 2
    # was answered by version 1, the policy being trained (sync mode: nothing stale). The clean
    # stop ended the trainer's endpoint lease: nothing is left in the Gateway's table.
    assert load_loop_state(tmp_path / "run" / "checkpoints" / "global_step_2")["version"] == 2
    assert client.list_models() == []
    assert records[2]["training/policy_version"] == 1
    assert records[2]["training/staleness/max"] == 0
    assert records[2]["training/staleness/unknown_version_tokens"] == 0
    assert inputs_by_step(client) == expected_ids(train, 2)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert list_checkpoints(checkpoints) == [1, 2]
    latest = latest_checkpoint(checkpoints)
    assert latest is not None
    state = load_loop_state(latest)
    assert (state["step"], state["version"], state["data"]["position"]) == (2, 2, 2 * BATCH)
    assert load_policy_state(latest)["policy"]["steps"] == 2
    # Every step's metrics also went to the Gateway, for the dashboard: the same as the JSONL.
    posted = httpx.get(f"{gateway.url}/api/runs/run/metrics", headers={"x-api-key": gateway.key})
    points = posted.json()["points"]
    assert [p["step"] for p in points] == [0, 1, 2]
    for point, record in zip(points, records, strict=True):
        assert point["metrics"] == {k: v for k, v in record.items() if k not in ("step", "time")}


def test_resume_after_a_crash_continues_step_count_and_data_order(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path
) -> None:
    gateway, client = services
    train = make_dataset(12, seed=0, prefix="t")
    cfg = config(tmp_path, gateway, total_training_steps=4, save_freq=1, test_freq=0, val_before_train=False)
    cfg.data.train_files = str(tmp_path / "train.jsonl")
    Path(cfg.data.train_files).write_text("".join(json.dumps(s) + "\n" for s in train))
    path = tmp_path / "train.yaml"
    OmegaConf.save(cfg, path)
    argv = [sys.executable, "-m", "agentlightning.commands.backends", "--config", str(path)]
    checkpoints = tmp_path / "run" / "checkpoints"

    first = ManagedProcess("trainer", argv, tmp_path / "trainer-1.log", cwd=REPO).start()
    deadline = time.monotonic() + 120
    while not list_checkpoints(checkpoints) or max(list_checkpoints(checkpoints)) < 2:
        assert first.alive(), first.log_tail()
        assert time.monotonic() < deadline, "no checkpoint of step 2 in time"
        time.sleep(0.05)
    first.kill()  # SIGKILL: no clean-up of any kind

    second = ManagedProcess("trainer", argv, tmp_path / "trainer-2.log", cwd=REPO).start()
    assert second.proc is not None
    assert second.proc.wait(180) == 0, second.log_tail()
    assert "resumed" in second.log_path.read_text()  # type: ignore[union-attr]

    records = read_metrics(tmp_path / "run" / METRICS_FILE)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    latest = latest_checkpoint(checkpoints)
    assert latest is not None
    state = load_loop_state(latest)
    assert (state["step"], state["data"]["position"]) == (4, 4 * BATCH)
    assert load_policy_state(latest)["policy"]["steps"] == 4
    # The resumed run's steps 3 and 4 used the samples an uninterrupted run would have used.
    runs = {trainer_key(r, "run_id") for r in client.list_rollouts(limit=1000) if r.metadata.batch_idx == 4}
    assert len(runs) == 1
    expected = expected_ids(train, 4)
    assert inputs_by_step(client, runs.pop()) == {3: expected[3], 4: expected[4]}


class ScriptedValidation(TorchTrainer):
    """The torch trainer with its validation's `val/reward` read from a script (step -> value):
    the collapse guard's paths run on real weights, checkpoints and publishes, deterministically."""

    script: dict[int, float]  # set by scripted()

    def _validate(self, manager: Any, tracker: Any, log_now: bool = True) -> dict[str, float]:
        metrics = {"val/reward": self.script[self.step]}
        self.history.append({"step": float(self.step), **metrics})
        if log_now:
            tracker.log(metrics, self.step)
        return metrics


def scripted(cfg: DictConfig, train: list[dict[str, Any]], script: dict[int, float]) -> ScriptedValidation:
    trainer = ScriptedValidation(cfg, train, [{"id": "v", "question": "1+1"}])
    trainer.script = script
    return trainer


def test_a_collapse_rolls_back_to_the_best_checkpoint_at_a_lower_lr(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path
) -> None:
    gateway, client = services
    cfg = config(tmp_path, gateway, total_training_steps=5, test_freq=1, save_freq=1)
    # best at step 1; steps 2 and 3 more than 0.15 below it: a collapse, rolled back after step 3;
    # step 4 is a new best, which moves the mark.
    trainer = scripted(
        cfg, make_dataset(12, seed=0, prefix="t"), {0: 0.2, 1: 0.8, 2: 0.6, 3: 0.5, 4: 0.9, 5: 0.7}
    )
    restored: list[dict[str, Any]] = []
    restore = trainer.backend.restore

    def spy(folder: Path, lr_scale: float) -> None:
        before = {k: v.clone() for k, v in trainer.backend.updater.model.state_dict().items()}  # type: ignore[attr-defined]
        saved = load_policy_state(folder)["policy"]["model"]  # read now: a later best rotates it out
        restore(folder, lr_scale)
        after = {k: v.clone() for k, v in trainer.backend.updater.model.state_dict().items()}  # type: ignore[attr-defined]
        restored.append(
            {"folder": folder, "lr_scale": lr_scale, "saved": saved, "before": before, "after": after}
        )

    trainer.backend.restore = spy  # type: ignore[method-assign]
    trainer.fit()

    (rollback,) = restored
    checkpoints = tmp_path / "run" / "checkpoints"
    assert rollback["folder"] == step_dir(checkpoints, 1) and rollback["lr_scale"] == 0.5
    best_weights = rollback["saved"]
    assert all(rollback["after"][k].equal(best_weights[k]) for k in best_weights)  # the best's weights
    assert not all(rollback["before"][k].equal(best_weights[k]) for k in best_weights)  # not step 3's
    records = {int(r["step"]): r for r in read_metrics(tmp_path / "run" / METRICS_FILE)}
    assert records[3]["training/rollbacks"] == 1 and records[3]["training/lr_scale"] == 0.5
    assert records[4]["actor/lr"] == pytest.approx(0.5e-3)  # the configured 1e-3, halved
    assert records[2]["actor/lr"] == pytest.approx(1e-3)
    assert records[5]["training/best_val"] == 0.9 and records[5]["training/best_step"] == 4
    # Five updates and the rollback's publish: version 6 was served last (the lease ended at the stop).
    assert load_loop_state(step_dir(checkpoints, 5))["version"] == 6
    assert client.list_models() == []
    # The new best is marked and kept; the newest two besides it.
    assert best_checkpoint(checkpoints) == step_dir(checkpoints, 4)
    assert list_checkpoints(checkpoints) == [4, 5]


def test_a_collapse_stops_the_run_and_the_best_is_kept(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path
) -> None:
    gateway, _ = services
    cfg = config(
        tmp_path,
        gateway,
        total_training_steps=6,
        test_freq=1,
        save_freq=1,
        collapse_guard={"action": "stop", "patience": 2, "margin": 0.15},
    )
    trainer = scripted(cfg, make_dataset(12, seed=0, prefix="t"), dict.fromkeys(range(7), 0.1) | {1: 0.8})
    final = trainer.fit()

    assert final["val/reward"] == 0.1
    assert [int(r["step"]) for r in read_metrics(tmp_path / "run" / METRICS_FILE)] == [0, 1, 2, 3]
    checkpoints = tmp_path / "run" / "checkpoints"
    assert best_checkpoint(checkpoints) == step_dir(checkpoints, 1)
    assert list_checkpoints(checkpoints) == [1, 2, 3]  # step 0 rotated out; the best outlives rotation


def test_an_agent_that_cannot_start_stops_the_run_naming_the_cause(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path
) -> None:
    gateway, _ = services
    cfg = config(tmp_path, gateway, total_training_steps=2)
    cfg.agentlightning.local.agent_class = "tests.torch_backend.no_such_agent:Agent"  # a typo'd module
    with pytest.raises(AllRolloutsFailed) as stopped:
        run_ppo(cfg, make_dataset(4, seed=0, prefix="t"), make_dataset(2, seed=1, prefix="v"))
    message = str(stopped.value)
    assert message.startswith("step 0 validation: 2 of 2 rollouts failed")  # before any training
    assert "No module named 'tests.torch_backend.no_such_agent'" in message


def test_rollouts_without_a_reward_are_said_on_the_console(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    gateway, _ = services
    cfg = config(tmp_path, gateway, total_training_steps=1, val_before_train=False)
    cfg.agentlightning.local.agent_class = "tests.torch_backend.loop_agent:NoRewardAgent"
    run_ppo(cfg, make_dataset(4, seed=0, prefix="t"), None)
    out, err = capfd.readouterr()
    assert f"step 1: none of the {BATCH * N} finished rollouts reported a reward" in err
    assert "Authorization: Bearer $AGL_KEY" in err
    logged = [line for line in (out + err).splitlines() if "rollouts_not_usable" in line]
    assert logged and all("warning" in line for line in logged)  # logged at warning level too


def test_bad_settings_fail_before_anything_starts(tmp_path: Path) -> None:
    gateway = RunningGateway("http://127.0.0.1:9", "k", None, tmp_path / "x.db")  # type: ignore[arg-type]
    cfg = config(tmp_path, gateway)
    with pytest.raises(ConfigError, match="no training data"):
        TorchTrainer(cfg, None, None)
    with pytest.raises(ConfigError, match=r"data.train_batch_size \(2\) is larger than the training data"):
        TorchTrainer(cfg, [{"id": "a"}], None)
    cfg.trainer.keep_best = False
    with pytest.raises(ConfigError, match=r"collapse_guard\.action=rollback reloads the best checkpoint"):
        TorchTrainer(cfg, make_dataset(4, seed=0), None)
    cfg.trainer.keep_best = True
    cfg.trainer.resume_mode = "sometimes"
    with pytest.raises(ValueError, match=r"trainer.resume_mode must be auto, disable or resume_path"):
        TorchTrainer(cfg, make_dataset(4, seed=0), None)


def test_async_mode_publishes_while_agents_call_and_no_call_fails(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path
) -> None:
    gateway, client = services
    train = make_dataset(12, seed=0, prefix="t")
    cfg = config(tmp_path, gateway, total_training_steps=3, test_freq=0, save_freq=0, val_before_train=False)
    cfg.agentlightning.async_rollout = {"enabled": True, "async_train_batch_size": 2 * BATCH}
    run_ppo(cfg, train, None)

    records = read_metrics(tmp_path / "run" / METRICS_FILE)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["training/n_rollouts"] == BATCH * N
        assert r["training/n_rollouts_failed"] == 0  # the Gateway answered 429 during publishes;
        assert r["training/n_calls_error"] == 0  # agents retried, and every call was recorded
        assert r["training/async/proxy_drain_timed_out"] == 0
    # Groups carried over a weight update hold tokens of an older policy: measured, not hidden.
    assert sum(r["training/async/n_prev_carry_over_groups"] for r in records) > 0
    assert [r["training/policy_version"] for r in records] == sorted(
        r["training/policy_version"] for r in records
    )
    assert client.list_models() == []  # the clean stop ended the trainer's endpoint lease


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["data.train_files=/nonexistent/train.jsonl"],
            "data.train_files: /nonexistent/train.jsonl is not a file",
        ),
        (["agentlightning.rollout_timout_seconds=5"], "agentlightning.rollout_timout_seconds"),
        (["trainer.log_level=loud"], "trainer.log_level must be one of"),
        (
            ["agentlightning.outcomes.pod_lost=keep"],
            "agentlightning.outcomes.pod_lost: pod_lost is an infrastructure",
        ),
        (
            ["agentlightning.outcomes.no_reward=retry"],
            "agentlightning.outcomes.no_reward.action: unknown action",
        ),
    ],
)
def test_agl_train_exits_2_naming_the_bad_key(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agentlightning.commands.backends", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def test_distillation_trains_on_the_rows_of_a_messages_api_agent(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path
) -> None:
    """On-policy distillation (algorithm.distill) of an agent on the Anthropic Messages API: the
    teacher (agl-torch-server: the student's init, sharpened; the same tokenizer) scores the
    token-exact rows the Gateway recorded for that API, and every step updates the student on its
    per-token signal, with no task reward (reward_coef 0). Learning with OPD is shown by
    bench/opd.py (docs/sft.md)."""
    from agentlightning.launch import start_torch_server
    from agentlightning.tiny_model import build_tiny, save_tiny

    gateway, client = services
    train, val = make_dataset(8, seed=0, prefix="t"), make_dataset(2, seed=1, prefix="v")
    teacher_model, tokenizer = build_tiny(seed=0)  # the student's own init (agentlightning.seed 0)...
    teacher_model.lm_head.weight.data *= 4  # ... sure of the tokens the near-uniform student barely prefers
    folder = save_tiny(tmp_path / "teacher", teacher_model, tokenizer)
    with start_torch_server(str(folder), torch_threads=1, log_path=tmp_path / "teacher.log") as teacher:
        cfg = config(tmp_path, gateway, total_training_steps=3, test_freq=0, save_freq=0)
        cfg.agentlightning.local.agent_class = "tests.torch_backend.loop_agent:MessagesAgent"
        cfg.algorithm.distill = {
            "enable": True, "teacher_url": teacher.url, "teacher_tokenizer": str(folder), "reward_coef": 0.0
        }  # fmt: skip
        run_ppo(cfg, train, val)
    records = [r for r in read_metrics(tmp_path / "run" / METRICS_FILE) if "training/reward" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["distill/rows"] >= BATCH * N  # every rollout's rows scored by the teacher
        assert r["distill/reverse_kl"] != 0.0  # a signal on the sampled tokens
        assert r["actor/param_norm_change"] > 0.0  # and an update with it
    (rollout, *_) = [r for r in client.list_rollouts(limit=1000) if r.is_train]
    events = client.get_events_json(rollout.rollout_id, format="raw")
    calls = [e["data"] for e in events if e["event_type"] == "model_request"]
    assert [c["api"] for c in calls] == ["anthropic.messages"] * 2
    assert all(c["response"]["prompt_token_ids"] and c["response"]["choices"][0]["token_ids"] for c in calls)
