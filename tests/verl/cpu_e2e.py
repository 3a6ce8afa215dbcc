"""Test-only: the verl backend's whole loop on CPU — Gateway, Controller, demo agents, rollouts
served by real vLLM (the CPU build, `.venv-vllm`), updates by verl's own actor worker, and the
actor's weights synced into vLLM after every update.

What differs from a GPU run is `CpuWorkers` alone, in place of `engine.VerlWorkers`: verl's
`ActorRolloutRefWorker` (role `actor`, FSDP2, fp32) runs in the trainer's process on the
test-only CPU platform instead of in a Ray worker group, and our vLLM servers
(`torch_backend.vllm_server`) stand in for verl's replicas, loaded with the weights verl's
engine exports for its own weight sync (`get_per_tensor_param`). The loop, `VerlBackend`, the
batch layout, the `per_rollout_mean` loss through verl's `ppo_loss`, verl's optimizer and LR
scheduler, and verl's checkpoints are the ones a GPU run uses.

    python -m tests.verl.cpu_e2e run [agl-demo key=value ...] [train.KEY=VALUE ...]
    python -m tests.verl.cpu_e2e train CONFIG.yaml         (the trainer process `run` starts)
    python -m tests.verl.cpu_e2e restore CONFIG.yaml CHECKPOINT_DIR OUT_DIR
                                                          (verl's actor restored, its weights saved)

`run` is `agl-demo` (warm-up, data, Gateway, Controller, report) with this trainer; it prints
`validation reward: BEFORE -> AFTER` at the end like the demo.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from tests.verl.cpu_platform import CPU_ACTOR_OVERRIDES, init_single_process

MODULE = "tests.verl.cpu_e2e"


def cpu_workers_class() -> type:
    """`CpuWorkers`, defined once `verl` may be imported (after `init_single_process`)."""
    from agentlightning.torch_backend.vllm_server import VLLMServerConfig, VLLMServers, save_state
    from agentlightning.verl.engine import VerlActor, set_total_optimizer_steps

    class CpuWorkers(VerlActor):
        """The backend's `Workers`: verl's actor worker in this process, real vLLM serving it."""

        def __init__(
            self,
            view: DictConfig,
            total_optimizer_steps: int,
            served_model_name: str,
            server: VLLMServerConfig,
            workdir: Path,
        ) -> None:
            self.view = view
            set_total_optimizer_steps(view, total_optimizer_steps)
            self.served_model_name = served_model_name
            self.server = server
            self.workdir = workdir
            self.servers: VLLMServers | None = None
            self.served: Path | None = None  # the weights folder the servers hold now

        @property
        def dp_size(self) -> int:
            return 1

        def start(self) -> list[str]:
            self.start_actor()
            model_path = str(self.view.actor_rollout_ref.model.path)
            self.servers = VLLMServers(
                model_path, self.served_model_name, self.server, self.workdir / "servers"
            ).start()
            return self.addresses()

        def start_actor(self) -> None:
            from transformers import AutoTokenizer
            from verl.workers.engine_workers import ActorRolloutRefWorker

            self.tokenizer = AutoTokenizer.from_pretrained(str(self.view.actor_rollout_ref.model.path))
            self.actor = ActorRolloutRefWorker(config=self.view.actor_rollout_ref, role="actor")
            self.actor.init_model()
            if self.view.actor_rollout_ref.actor.use_kl_loss:
                # The reference model: verl's forward-only worker (role "ref") pins its CPU-offloaded
                # parameters, which needs an accelerator; on CPU a second actor worker that never
                # trains serves the same forward pass (`compute_log_prob`) from the same weights.
                from verl.utils.config import omega_conf_to_dataclass

                ref = ActorRolloutRefWorker(config=self.view.actor_rollout_ref, role="actor")
                ref.init_model()
                ref.compute_ref_log_prob = ref.compute_log_prob
                self.use_kl_term(ref, omega_conf_to_dataclass(self.view.actor_rollout_ref.model))

        def export_weights(self, folder: Path) -> Path:
            """The actor's weights as verl's engine exports them for its weight sync, as safetensors."""
            named, _ = self.actor.actor.engine.get_per_tensor_param()
            return save_state(named, folder)

        def addresses(self) -> list[str]:
            assert self.servers is not None
            # `host:port`, the form verl's replicas report
            return [e.removeprefix("http://").removesuffix("/v1") for e in self.servers.endpoints]

        def sleep_replicas(self) -> None:
            pass  # vLLM on CPU has no sleep mode; the Gateway keeps agents out during the update

        def sync_weights(self, step: int) -> None:
            assert self.servers is not None
            folder = self.export_weights(self.workdir / "weights" / f"step{step}")
            self.servers.reload(folder)
            previous, self.served = self.served, folder
            if previous is not None and previous != folder:
                shutil.rmtree(previous, ignore_errors=True)

        def close(self) -> None:
            if self.servers is not None:
                self.servers.stop()
                self.servers = None

    return CpuWorkers


def _setup(config_path: str) -> tuple[DictConfig, Callable[[DictConfig, int], Any]]:
    """This process on the CPU platform; the demo's `train.yaml` composed for verl on CPU, and a
    `CpuWorkers` factory for it."""
    torch.set_num_threads(1)
    init_single_process()
    from agentlightning.log import configure_logging
    from agentlightning.torch_backend.config import load_torch_backend_config
    from agentlightning.torch_backend.vllm_engine import server_config
    from agentlightning.verl.config import compose_config

    user = OmegaConf.load(config_path)
    assert isinstance(user, DictConfig)
    # recompute: the actor's own log-probs as old log-probs, and their gap to vLLM's as a metric
    cfg = compose_config(
        user, [*CPU_ACTOR_OVERRIDES, "actor_rollout_ref.actor.old_log_prob_source=recompute"]
    )
    configure_logging(str(cfg.trainer.log_level))
    # vLLM started as the torch backend's engine=vllm would start it from the same file
    server = server_config(load_torch_backend_config(user).rollout, torch.device("cpu"))
    workdir = Path(str(cfg.trainer.output_dir)) / "vllm"
    workers = cpu_workers_class()

    def factory(view: DictConfig, total_optimizer_steps: int) -> Any:
        return workers(view, total_optimizer_steps, str(cfg.agentlightning.model_name), server, workdir)

    return cfg, factory


def train(config_path: str) -> None:
    """The trainer process: `VerlTrainer` with `CpuWorkers`, on the demo's `train.yaml`."""
    from agentlightning.verl.backend import VerlTrainer

    cfg, factory = _setup(config_path)
    VerlTrainer(cfg, workers=factory).fit()


def restore(config_path: str, checkpoint: str, out: str) -> None:
    """verl's actor restored from a checkpoint's `actor/` (as a resumed trainer's backend does),
    its weights exported to `out` as safetensors."""
    from agentlightning.verl.config import verl_view

    cfg, factory = _setup(config_path)
    workers = factory(verl_view(cfg), 1)
    workers.start_actor()
    workers.load_checkpoint(str(Path(checkpoint) / "actor"))
    workers.export_weights(Path(out))


def run(argv: Sequence[str]) -> None:
    """`agl-demo engine=vllm trainer_backend=verl` with this module's trainer."""
    from agentlightning.demo import cli

    class CpuVerlDemo(cli.Demo):
        def trainer_args(self) -> list[str]:
            return ["-m", MODULE, "train", str(self.config_path)]

    cli.main(["engine=vllm", "trainer_backend=verl", *argv], demo_class=CpuVerlDemo)


if __name__ == "__main__":
    command, *rest = sys.argv[1:] or [""]
    if command == "train" and len(rest) == 1:
        train(rest[0])
    elif command == "restore" and len(rest) == 3:
        restore(*rest)
    elif command == "run":
        run(rest)
    else:
        raise SystemExit(__doc__)
