"""A real Ray local cluster (2 CPUs, its temp dir in the test's tmp folder, auth off): the loss
hook reaches every worker process, verl's worker group starts on CPU, and the verl workers'
set-up runs as far as a machine without a GPU allows — to verl's GPU check."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.torch_backend.tiny import TINY

from .conftest import REPO, SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

import ray
from omegaconf import DictConfig, OmegaConf

from agentlightning.tiny_model import build_tiny, save_tiny
from agentlightning.verl.config import compose_config, validate
from agentlightning.verl.engine import LOSS_HOOK, VerlWorkers, ray_runtime_env, start_ray

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DictConfig]:
    tmp = tmp_path_factory.mktemp("ray")
    short = Path("/tmp") / f"agl-ray-{os.getpid()}"  # Ray's socket paths must stay short
    short.symlink_to(tmp)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    model_dir = save_tiny(tmp / "tiny-qwen", *build_tiny(TINY))  # the workers load it from disk
    cfg = compose_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "trainer.n_gpus_per_node=2",
            "data.train_batch_size=2",
        ]
    )
    _, _, v = validate(cfg)
    # workers import this test folder's helper module
    OmegaConf.update(
        v, "ray_kwargs.ray_init.runtime_env", {"env_vars": {"PYTHONPATH": str(REPO)}}, merge=True
    )
    started = start_ray(
        v, num_cpus=2, _temp_dir=str(short), include_dashboard=False, log_to_driver=False, num_gpus=0
    )
    assert started
    try:
        yield v
    finally:
        ray.shutdown()
        short.unlink()


def test_the_runtime_env_carries_the_loss_hook(view: DictConfig) -> None:
    env = ray_runtime_env(view)
    assert env["worker_process_setup_hook"] == LOSS_HOOK
    assert env["env_vars"]["PYTHONPATH"] == str(REPO)
    bad = OmegaConf.create(OmegaConf.to_container(view))
    assert isinstance(bad, DictConfig)
    OmegaConf.update(bad, "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook", "x.y", merge=True)
    with pytest.raises(ValueError, match="worker_process_setup_hook"):
        ray_runtime_env(bad)


def test_every_verl_worker_process_has_the_loss(view: DictConfig) -> None:
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    from .ray_worker import LossProbe

    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
    group = RayWorkerGroup(
        resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(LossProbe))
    )
    try:
        answers = group.registered_losses()
    finally:
        for w in group.workers:
            ray.kill(w)
    assert len(answers) == 2
    assert {a["rank"] for a in answers} == {0, 1} and all(a["world_size"] == 2 for a in answers)
    assert len({a["pid"] for a in answers}) == 2 and os.getpid() not in {a["pid"] for a in answers}
    assert all(a["loss"] == "agentlightning.verl.loss.per_rollout_mean_loss" for a in answers)


def test_the_verl_workers_set_up_runs_to_the_gpu_check(view: DictConfig) -> None:
    workers = VerlWorkers(view, total_optimizer_steps=4)
    # verl's own role mapping, resource pools and trainer (as a builder) run; on CPU the placement
    # of the FSDP + vLLM workers is where it stops: no GPU to place them on.
    with pytest.raises(ValueError, match=r"available GPUs 0 is less than total desired GPUs 2"):
        workers.start()
    assert workers.view.actor_rollout_ref.rollout.agent.agent_loop_manager_class.endswith("NoAgentLoops")
