"""`agl-demo`: the whole system on a laptop CPU — Gateway, Controller, trainer — with the tiny model.

    agl-demo [--config FILE.yaml] [key=value ...]      (keys: agentlightning/config/demo.yaml)

1. Warm-up, in this process and said openly: the tiny model is trained with supervision on
   generated demonstrations of a naive agent, so that RL has something to improve.
2. The Gateway (`agl-server`) and the Controller (`agl-controller`, local runner) start as
   separate processes with a fresh random key; the trainer (`agl-train`) starts as a third and
   trains with GRPO: each step the Controller runs a group of demo agents per problem (`demo/agent.py`, the official
   `openai` client) against the Gateway's proxy, the Gateway records every call, the trainer
   turns the records into rows, updates the policy and publishes the new weights.
3. At the end: the reward curve as a PNG, and the last line `validation reward: BEFORE -> AFTER`.

Every process it starts is stopped by its id when it ends, fails, or is interrupted (Ctrl-C).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from agentlightning.config.loader import (
    catch_interrupts,
    exit_on_interrupt,
    interrupted,
    load_cli_config,
    merge,
)
from agentlightning.launch import start_controller, start_gateway
from agentlightning.procs import ManagedProcess, ProcessFailed, free_port
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics

AGENT_CLASS = "agentlightning.demo.agent:CalcAgent"
ROLES_AGENT_CLASS = "agentlightning.demo.roles:TwoRoleAgent"
PLANNER, WRITER = "planner", "writer"  # demo/roles.py's (not imported: it imports the openai client)
ENV_MAP = {"QUESTION": "input.question", "ANSWER": "input.answer"}
MARKER = ".agl-demo"  # marks a directory this demo made, and may replace
P = TypeVar("P", bound=ManagedProcess)


def say(line: str = "") -> None:
    print(line, flush=True)


class Demo:
    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.seed = int(cfg.seed)
        self.run_dir = Path(str(cfg.output_dir)).resolve() / f"seed{self.seed}"
        self.key = secrets.token_urlsafe(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = self.run_dir / "train.yaml"
        self.procs: list[ManagedProcess] = []
        self.env = dict(os.environ)
        threads = str(int(cfg.torch_threads))
        self.env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false")

    # --- steps ----------------------------------------------------------------------------

    def prepare_dir(self) -> None:
        if self.run_dir.exists():
            if not (self.run_dir / MARKER).exists():
                raise SystemExit(
                    f"agl-demo: {self.run_dir} exists and was not made by agl-demo; choose another output_dir"
                )
            shutil.rmtree(self.run_dir)
        self.run_dir.mkdir(parents=True)
        (self.run_dir / MARKER).touch()

    def warm_up(self) -> Path:
        reuse = self.cfg.warmup.reuse
        if reuse:  # the warm-up is fixed by the seed and settings: comparisons need not redo it
            source = Path(str(reuse))
            if not (source / "config.json").is_file():
                raise SystemExit(f"agl-demo: warmup.reuse={reuse}: not a saved warm model (no config.json)")
            say(f"[1/4] Supervised warm-up: reusing {source} (warmup.reuse)")
            return Path(shutil.copytree(source, self.run_dir / "warm_model"))
        import torch
        from transformers.utils import logging as hf_logging

        from agentlightning.demo.warmup import WarmupConfig, warmup
        from agentlightning.tiny_model import TinyModelConfig, build_tiny, save_tiny

        hf_logging.disable_progress_bar()
        torch.set_num_threads(int(self.cfg.torch_threads))
        w = self.cfg.warmup
        say(
            f"[1/4] Supervised warm-up (not RL): {w.steps} steps on generated demonstrations of a naive "
            f"agent that calls the calculator\n      but adds too often (right operation on - and * only "
            f"{float(w.correct_op_prob):.0%} of the time). RL must learn the rest from the reward."
        )
        recipe = OmegaConf.to_container(self.cfg.model)
        if self.cfg.engine == "vllm":
            recipe = {**recipe, **OmegaConf.to_container(self.cfg.vllm_model)}  # type: ignore[dict-item]  # both mappings
        model_cfg = TinyModelConfig(**recipe)  # type: ignore[arg-type]  # keys checked by demo.yaml's schema
        model, tokenizer = build_tiny(model_cfg, seed=self.seed)
        n_params = sum(p.numel() for p in model.parameters())
        started = time.perf_counter()
        stats = warmup(
            model,
            tokenizer,
            WarmupConfig(
                steps=int(w.steps),
                batch_size=int(w.batch_size),
                lr=float(w.lr),
                seed=self.seed,
                correct_op_prob=float(w.correct_op_prob),
                wrong_answer_prob=float(w.wrong_answer_prob),
            ),
        )
        say(
            f"      Qwen2 with {n_params / 1e3:.0f}k parameters, built in code; warm-up done in "
            f"{time.perf_counter() - started:.0f} s (loss {stats['warmup/loss']:.3f})"
        )
        return save_tiny(self.run_dir / "warm_model", model, tokenizer)

    def write_data(self) -> tuple[Path, Path]:
        from agentlightning.demo.task import make_dataset

        train = make_dataset(int(self.cfg.train_problems), seed=self.seed, prefix="t")
        val = make_dataset(int(self.cfg.val_problems), seed=10_000 + self.seed, prefix="v")
        if self.cfg.step_reward:  # the agent gives partial credit to the call with the right tool call
            train = [{**sample, "step_reward": "1"} for sample in train]
            val = [{**sample, "step_reward": ""} for sample in val]  # validation: the outcome only
        paths = []
        for name, samples in (("train", train), ("val", val)):
            path = self.run_dir / f"{name}.jsonl"
            path.write_text("".join(json.dumps(s) + "\n" for s in samples))
            paths.append(path)
        return paths[0], paths[1]

    def train_config(self, model_dir: Path, train: Path, val: Path, overrides: Sequence[str]) -> DictConfig:
        """The trainer's config: `train.yaml`'s defaults, the demo's `train` block, this run's
        addresses and files, then the command line's `train.*` overrides (checked here, early)."""
        runtime: dict[str, Any] = {
            "data": {"train_files": str(train), "val_files": str(val), "seed": self.seed},
            "actor_rollout_ref": {
                "model": {"path": str(model_dir)},
                "rollout": {"seed": self.seed, "engine": str(self.cfg.engine)},
            },
            "trainer": {
                "experiment_name": f"demo-seed{self.seed}",
                "output_dir": str(self.run_dir),
                "torch_threads": int(self.cfg.torch_threads),
            },
            "agentlightning": {
                "agl_base_url": self.url,
                "agl_key": self.key,
                "model_name": "policy",
                "seed": self.seed,
                "local": {
                    "agent_class": AGENT_CLASS,
                    "env_map": {**ENV_MAP, "STEP_REWARD": "input.step_reward"}
                    if self.cfg.step_reward
                    else ENV_MAP,
                },
            },
        }
        if self.cfg.trainer_backend != "torch":  # keys only the torch backend reads: verl refuses them set
            del runtime["actor_rollout_ref"]["rollout"]["engine"]
            del runtime["trainer"]["torch_threads"]
        if self.cfg.roles:  # two policies, each its own copy of the warm model (docs/policies.md)
            runtime["agentlightning"]["local"]["agent_class"] = ROLES_AGENT_CLASS
            runtime["agentlightning"]["policies"] = {PLANNER: {}, WRITER: {}}
        demo_block = OmegaConf.to_container(self.cfg.train)
        OmegaConf.save(OmegaConf.merge(demo_block, runtime), self.config_path)
        cfg = load_cli_config(
            "train", ["--config", str(self.config_path), *overrides], prog="agl-demo", strict=False
        )
        if self.lora_lr(cfg, overrides) is not None:
            cfg.actor_rollout_ref.actor.optim.lr = float(self.cfg.lora_lr)
        OmegaConf.save(cfg, self.config_path)
        return cfg

    def lora_lr(self, train_cfg: DictConfig, overrides: Sequence[str]) -> float | None:
        """The adapter's learning rate where the demo sets it: LoRA on, `lora_lr` set, and no
        `train.actor_rollout_ref.actor.optim.lr` on the command line."""
        lora = int(OmegaConf.select(train_cfg, "actor_rollout_ref.model.lora_rank", default=0) or 0)
        given = any(o.startswith("actor_rollout_ref.actor.optim.lr=") for o in overrides)
        if lora > 0 and self.cfg.lora_lr is not None and not given:
            return float(self.cfg.lora_lr)
        return None

    def check_train_config(self, overrides: Sequence[str]) -> None:
        """Before anything starts: the trainer's backend reads every key of `train` and the
        `train.*` overrides (a misspelt key fails here, naming it, not after the warm-up)."""
        if self.cfg.trainer_backend != "torch":
            return  # the verl backend checks its keys at its own start-up (it needs verl installed)
        from agentlightning.config.schema import ConfigError
        from agentlightning.torch_backend.config import load_torch_backend_config
        from agentlightning.trainer.config import load_core_config

        base = load_cli_config("train", [], prog="agl-demo", strict=False)
        cfg = merge(base, OmegaConf.to_container(self.cfg.train), OmegaConf.from_dotlist(list(overrides)))
        try:
            load_core_config(cfg)
            load_torch_backend_config(cfg)
        except (ConfigError, ValueError) as exc:
            raise SystemExit(f"agl-demo: bad train.* config: {exc}") from None

    def gateway_overrides(self, train_cfg: DictConfig) -> list[str]:
        """The Gateway's settings: the trainer's model name and sampling, greedy validation."""
        return [
            f"default_proxy.model_name={train_cfg.agentlightning.model_name}",
            f"default_proxy.train.temperature={float(train_cfg.actor_rollout_ref.rollout.temperature)}",
            "default_proxy.val.temperature=0.0",
        ]

    def start_services(self, train_cfg: DictConfig) -> None:
        gateway = self._track(
            start_gateway(
                *self.gateway_overrides(train_cfg),
                port=self.port,
                key=self.key,
                store_url=f"sqlite:///{self.run_dir / 'gateway.db'}",
                log_level="warning",
                log_path=self.run_dir / "gateway.log",
                env=self.env,
                name="gateway",
                ready_timeout=180,  # a busy machine imports slowly
            )
        )
        controller = self._track(
            start_controller(
                self.url,
                runner_type="local",
                key=self.key,
                max_agents=int(self.cfg.agents_at_once),
                log_dir=self.run_dir / "agents",
                log_level="warning",
                log_path=self.run_dir / "controller.log",
                env=self.env,
                name="controller",
                ready_timeout=180,
            )
        )
        say(
            f"[2/4] Gateway     {self.url} (pid {gateway.pid}, SQLite store, key-protected)\n"
            f"      Dashboard   {self.url}/ui/#key={self.key}  (open it to watch training live)\n"
            f"      Controller  pid {controller.pid}, local runner, {int(self.cfg.agents_at_once)} "
            "agents at once"
        )

    def trainer_args(self) -> list[str]:
        """The trainer process's arguments (after the interpreter): `agl-train` on `train.yaml`."""
        return [
            "-m",
            "agentlightning.commands.backends",  # agl-train
            f"backend={self.cfg.trainer_backend}",
            "--config",
            str(self.config_path),
        ]

    def train(self, train_cfg: DictConfig) -> int:
        trainer = self._start("trainer", self.trainer_args(), None)
        t = train_cfg.trainer
        steps = t.total_training_steps or f"{t.total_epochs} epoch(s) of"
        rollouts = f"{train_cfg.data.train_batch_size}×{train_cfg.actor_rollout_ref.rollout.n}"
        model = train_cfg.actor_rollout_ref.model
        lr = float(train_cfg.actor_rollout_ref.actor.optim.lr)
        update = f"LoRA rank {model.lora_rank}" if int(model.get("lora_rank", 0) or 0) > 0 else "full"
        say(
            f"[3/4] Trainer     pid {trainer.pid}: GRPO ({update}, lr {lr:g}), {steps} steps of {rollouts} rollouts, "
            f"validation every {t.test_freq} steps\n      config {self.config_path}"
            + (
                "\n      rollouts served by real vLLM servers the trainer starts (.venv-vllm; ready in 20-60 s)"
                if self.cfg.engine == "vllm"
                else ""
            )
        )
        assert trainer.proc is not None
        while True:
            code = trainer.proc.poll()
            if code is not None:
                return code
            for proc in self.procs:
                if proc is not trainer and not proc.alive():
                    raise ProcessFailed(f"the {proc.name} exited during training:\n{proc.log_tail()}")
            time.sleep(0.5)

    def report(self) -> tuple[float, float]:
        records = read_metrics(self.run_dir / METRICS_FILE)
        val = [(int(r["step"]), r["val/reward"]) for r in records if "val/reward" in r]
        train = [(int(r["step"]), r["training/reward"]) for r in records if "training/reward" in r]
        if len(val) < 2:
            raise ProcessFailed(f"the trainer recorded {len(val)} validation(s); see {self.run_dir}")
        png = self.run_dir / "reward_curve.png"
        plot_rewards(train, val, png, f"agl-demo, seed {self.seed}")
        say(f"[4/4] Reward curve: {png}\n      Metrics: {self.run_dir / METRICS_FILE} (and TensorBoard)")
        if self.cfg.roles:
            for role in (PLANNER, WRITER):
                key = f"policy/{role}/val/reward"
                curve = [(int(r["step"]), r[key]) for r in records if key in r]
                if curve:
                    say(f"      {role}: validation reward {curve[0][1]:.3f} -> {curve[-1][1]:.3f}")
        return val[0][1], val[-1][1]

    # --- processes ------------------------------------------------------------------------

    def _start(self, name: str, args: Sequence[str], log: Path | None) -> ManagedProcess:
        return self._track(ManagedProcess(name, [sys.executable, *args], log, env=self.env).start())

    def _track(self, proc: P) -> P:
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):  # trainer, controller, then the Gateway
            proc.stop(timeout=20)


def plot_rewards(
    train: Sequence[tuple[int, float]], val: Sequence[tuple[int, float]], path: Path, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        ax.plot(*zip(*train, strict=True), label="training reward (T=1, per step)", alpha=0.7)
    ax.plot(*zip(*val, strict=True), "o-", label="validation reward (greedy)", linewidth=2)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None, demo_class: type[Demo] = Demo) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # `train.KEY=VALUE` goes to the trainer's config (checked against agl-train's keys).
    train_overrides = [a.removeprefix("train.") for a in args if a.startswith("train.")]
    cfg = load_cli_config("demo", [a for a in args if not a.startswith("train.")], prog="agl-demo")
    demo = demo_class(cfg)
    demo.check_train_config(train_overrides)
    catch_interrupts()
    stopped = "interrupted; every process it started is stopped"
    with exit_on_interrupt("agl-demo", stopped, cleanup=demo.stop_all):
        try:
            demo.prepare_dir()
            say(
                f"Agent Lightning demo (seed {demo.seed}): RL on CPU through the Gateway, the "
                "Controller and the trainer"
            )
            model_dir = demo.warm_up()
            train, val = demo.write_data()
            train_cfg = demo.train_config(model_dir, train, val, train_overrides)
            demo.start_services(train_cfg)
            code = demo.train(train_cfg)
            if code != 0:
                raise ProcessFailed(f"the trainer exited with {code}")
            demo.stop_all()
            before, after = demo.report()
        except ProcessFailed as exc:
            if interrupted():  # e.g. the trainer stopped by the same Ctrl-C
                raise KeyboardInterrupt from None
            demo.stop_all()
            say(f"agl-demo: {exc}\n(logs: {demo.run_dir})")
            raise SystemExit(1) from None
        finally:
            demo.stop_all()
    say(f"validation reward: {before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    main()
