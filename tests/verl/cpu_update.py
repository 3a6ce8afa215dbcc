"""Run as a script: one real verl update — verl's FSDP2 `TrainingWorker.train_mini_batch` with our
`rows_to_batch` layout and the `per_rollout_mean` loss through verl's `ppo_loss` — on CPU, in
this process, with the test-only CPU platform (`cpu_platform.py`). Prints verl's metrics as JSON.

    python -m tests.verl.cpu_update MODEL_DIR ROWS.json MICRO_BATCH [REF_MODEL_DIR KL_TYPE KL_COEF]

With a reference model: the KL term on (`use_kl_loss`), the reference log-probs from a second
verl worker's `infer_batch` (what `ActorRolloutRefWorker.compute_ref_log_prob` runs), and the
backend's loss (`loss.actor_loss`) set on the actor as the backend sets it.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from typing import Any

import torch
from omegaconf import open_dict

from tests.verl.cpu_platform import CPU_ACTOR_OVERRIDES, init_single_process


def main(model_dir: str, rows_path: str, micro: int, kl: tuple[str, str, float] | None = None) -> None:
    torch.set_num_threads(1)
    init_single_process()

    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from agentlightning.rows import TrainingRow
    from agentlightning.verl.batch import rows_to_batch
    from agentlightning.verl.config import compose_config, verl_view
    from agentlightning.verl.loss import actor_loss

    cfg = compose_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            *CPU_ACTOR_OVERRIDES,
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "actor_rollout_ref.actor.optim.lr=0.0",
            *(
                [
                    "actor_rollout_ref.actor.use_kl_loss=true",
                    f"actor_rollout_ref.actor.kl_loss_type={kl[1]}",
                    f"actor_rollout_ref.actor.kl_loss_coef={kl[2]}",
                ]
                if kl
                else []
            ),
        ]
    )
    view = verl_view(cfg)

    def training_worker(path: str) -> tuple[TrainingWorker, Any]:
        with open_dict(view):
            view.actor_rollout_ref.model.path = path
        actor = omega_conf_to_dataclass(view.actor_rollout_ref.actor)
        worker_cfg = TrainingWorkerConfig(
            model_type="language_model",
            model_config=omega_conf_to_dataclass(view.actor_rollout_ref.model),
            engine_config=actor.engine,
            optimizer_config=actor.optim,
            checkpoint_config=actor.checkpoint,
        )
        engine = worker_cfg.engine_config  # as ActorRolloutRefWorker.init_model sets them
        engine.use_dynamic_bsz = False
        engine.max_token_len_per_gpu = engine.infer_max_token_len_per_gpu = 16384
        engine.micro_batch_size_per_gpu = engine.infer_micro_batch_size_per_gpu = micro
        engine.use_remove_padding = False
        worker = TrainingWorker(worker_cfg)
        worker.reset()
        return worker, actor

    with open(rows_path) as f:
        rows = [TrainingRow(**r) for r in json.load(f)]
    proto, _ = rows_to_batch(rows, 0, 1, micro)
    proto.meta_info["temperature"] = 1.0
    if kl:
        ref, _ = training_worker(kl[0])
        td_ref = left_right_2_no_padding(proto.to_tensordict())
        tu.assign_non_tensor(
            td_ref, calculate_entropy=False, calculate_sum_pi_squared=False, compute_loss=False
        )
        ref_log_probs = tu.get(ref.infer_batch(td_ref), "log_probs")
        proto.batch["ref_log_prob"] = no_padding_2_padding(ref_log_probs, td_ref).float()
    worker, actor = training_worker(model_dir)
    worker.set_loss_fn(actor_loss(actor) if kl else partial(ppo_loss, config=actor))
    td = left_right_2_no_padding(proto.to_tensordict())
    tu.assign_non_tensor(
        td,
        temperature=1.0,
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=len(proto),
        mini_batch_size=len(proto),
        epochs=1,
        seed=0,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
    metrics = tu.get(worker.train_mini_batch(td), "metrics")
    print("VERL_METRICS " + json.dumps({k: [float(x) for x in v] for k, v in metrics.items()}))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], int(args[2]), (args[3], args[4], float(args[5])) if len(args) > 3 else None)
