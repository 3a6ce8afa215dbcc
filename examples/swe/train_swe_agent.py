"""Train a coding agent in mini-swe-agent (unchanged; its commands in bubblewrap) on the generated
task bank with GRPO; the hidden tests give the reward.

    python examples/swe/train_swe_agent.py --train-file examples/swe/data/train.jsonl --model PATH \\
        [--async] [--backend torch|verl] [key=value ...]

Inputs are rows `{"task_id": ID}` of `python -m examples.swe.tasks list` (data/train.jsonl: 32
off-by-one tasks of seed 0). The Gateway and a Controller must be running, the Controller with
`local_runner.python=.venv-swe/bin/python` and the repository on PYTHONPATH (`run_local.sh` starts
both); the machine needs `bwrap` (Debian's bubblewrap).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the examples' shared launcher

from launcher import main  # noqa: E402

# Long multi-turn tool conversations (mini-swe-agent's own prompts): large prompts and responses, a
# generous timeout; the hermes tool parser for vLLM (Qwen models). Sizes are ours, not v1.0's.
SWE: dict = {
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 16, "max_prompt_length": 16384, "max_response_length": 16384},
    "actor_rollout_ref": {
        "rollout": {
            "n": 8,
            "engine_kwargs": {"vllm": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}},
        },
        "actor": {"ppo_mini_batch_size": 16, "use_kl_loss": False, "optim": {"lr": 1.0e-6}},
    },
    "trainer": {"experiment_name": "swe"},
    "agentlightning": {
        "rollout_timeout_seconds": 1200,
        "local": {
            "agent_class": "examples.swe.mini_agent:MiniSweAgent",
            "env_map": {"TASK_ID": "input.task_id"},
        },
        "k8s": {"job_template_path": str(HERE / "job-template.yaml")},  # run_minikube.sh
    },
}

if __name__ == "__main__":
    main(SWE)
