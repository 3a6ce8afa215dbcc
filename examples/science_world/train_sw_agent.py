"""Train the ScienceWorld agent with GRPO, asynchronous collection by default (as v1.0).

    python examples/science_world/train_sw_agent.py --train-file examples/science_world/data/train.jsonl \\
        --val-file examples/science_world/data/val.jsonl --model PATH [--sync] [--backend torch|verl] \\
        [key=value ...]

Inputs are rows of `sw_data.py` (`task_name`, `variation_idx`, `simplification`). The Gateway
and a Controller must be running, the Controller with
`local_runner.python=.venv-examples/bin/python local_runner.cwd=examples/science_world`
(`run_local.sh` starts both). The agent's limits are its environment variables
(`SCIENCE_WORLD_MAX_TURNS`, ... in sw_agent.py), which the Controller passes on.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the examples' shared launcher

from launcher import main  # noqa: E402

# v1.0's settings for Qwen2.5-7B-Instruct: GRPO without KL, n=4, batch 32, clip 0.2/0.3, every
# turn of a rollout merged into one trajectory row (first prompt up to 4096 tokens, the rest up to
# 8192), a 30-minute rollout timeout.
SCIENCE_WORLD: dict = {
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 32, "max_prompt_length": 4096, "max_response_length": 8192},
    "actor_rollout_ref": {
        "rollout": {"n": 4},
        "actor": {
            "ppo_mini_batch_size": 16,
            "use_kl_loss": False,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.3,
            "optim": {"lr": 1.0e-6},
        },
    },
    "trainer": {"experiment_name": "science_world", "val_before_train": False},
    "agentlightning": {
        "rollout_timeout_seconds": 1800,
        "local": {
            "agent_class": "sw_agent:ScienceWorldAgent",
            "env_map": {
                "TASK_NAME": "input.task_name",
                "VARIATION_IDX": "input.variation_idx",
                "SIMPLIFICATION": "input.simplification",
            },
        },
    },
}

if __name__ == "__main__":
    # v1.0 trains ScienceWorld asynchronously only; --sync is ours, for comparison.
    argv = sys.argv[1:]
    argv = [a for a in argv if a != "--sync"] if "--sync" in argv else ["--async", *argv]
    main(SCIENCE_WORLD, argv=argv)
