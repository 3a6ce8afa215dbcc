"""Train the Search-R1 agent (plain `openai` client + a retrieval service) with GRPO.

    python examples/search_r1/train_search_r1_agent.py --train-file data/train.jsonl --val-file data/test.jsonl \\
        --model PATH [--async] [--backend torch|verl] [key=value ...]

Inputs are Search-R1 rows (`question`, `golden_answers`), from parquet or jsonl (`make_data.py`
writes a synthetic set to `data/`). The Gateway, a Controller (with
`local_runner.python=.venv-examples/bin/python local_runner.cwd=examples/search_r1`) and the
retrieval service must be running: `run_local.sh` starts all three.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the examples' shared launcher

from launcher import main  # noqa: E402

# v1.0's Search-R1 settings where they mean the same here (GRPO, KL loss 0.001 low-var, clip 0.2/0.3,
# n=4, batch 512 / mini-batch 256, lr 1e-6, prompts up to 6000 and responses up to 4096 tokens).
SEARCH_R1: dict = {
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 512, "max_prompt_length": 6000, "max_response_length": 4096},
    "actor_rollout_ref": {
        "rollout": {"n": 4},
        "actor": {
            "ppo_mini_batch_size": 256,
            "optim": {"lr": 1.0e-6},
            "use_kl_loss": True,
            "kl_loss_type": "low_var_kl",
            "kl_loss_coef": 0.001,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.3,
        },
    },
    "trainer": {"experiment_name": "search_r1"},
    "agentlightning": {
        "rollout_timeout_seconds": 1800,
        "local": {
            "agent_class": "search_r1_agent:SearchR1Agent",
            "env_map": {"QUESTION": "input.question", "GOLDEN_ANSWERS": "input.golden_answers"},
        },
    },
}

if __name__ == "__main__":
    main(SEARCH_R1)
