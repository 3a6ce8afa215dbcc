"""Train the Calc-X agent (AutoGen + MCP calculator) with GRPO.

    python examples/calc_x/train_calc_agent.py --train-file data/train.parquet --val-file data/test.parquet \\
        --model /models/Qwen2.5-1.5B-Instruct [--async] [--backend torch|verl] [key=value ...]

The Gateway and a Controller must be running: `run_local.sh` (agents as local processes)
or `run_minikube.sh` (agents as Kubernetes Jobs) start them and then this script.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the examples' shared launcher

from launcher import main  # noqa: E402

# v1.0's Calc-X settings, on top of agentlightning/config/train.yaml.
CALC_X: dict = {
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "data": {"train_batch_size": 32, "max_prompt_length": 4096, "max_response_length": 2048},
    "actor_rollout_ref": {
        "rollout": {
            "n": 4,
            "name": "vllm",  # verl's engine; keys the torch backend does not use are ignored
            "multi_turn": {"format": "hermes"},
            "engine_kwargs": {"vllm": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}},
        },
        "actor": {
            "ppo_mini_batch_size": 32,
            "use_kl_loss": False,
            "kl_loss_coef": 0.0,
            "entropy_coeff": 0.0,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.3,
            "optim": {"lr": 1.0e-6},
        },
    },
    "trainer": {"experiment_name": "calc_x", "total_epochs": 2, "test_freq": 64, "save_freq": 64},
    "agentlightning": {
        "rollout_timeout_seconds": 300,
        "local": {
            "agent_class": "calc_agent:CalcAgent",
            "env_map": {"QUESTION": "input.question", "RESULT": "input.result"},
        },
        "k8s": {"job_template_path": str(HERE / "job-template.yaml")},
    },
}

if __name__ == "__main__":
    main(CALC_X)
