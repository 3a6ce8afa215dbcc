"""Train the GSM8K agent (plain `openai` client + calculator) with GRPO.

    python examples/gsm8k/train_gsm8k_agent.py --train-file gsm8k/train.parquet --val-file gsm8k/test.parquet \\
        --model PATH [--async] [--backend torch|verl] [key=value ...]

Inputs are GSM8K rows (`question`, `answer` ending in `#### <number>`), from parquet or jsonl
(`data/sample.jsonl` has a few). The Gateway and a Controller must be running, the Controller
with `local_runner.python=.venv-examples/bin/python local_runner.cwd=examples/gsm8k`.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the examples' shared launcher

from launcher import main  # noqa: E402

GSM8K: dict = {
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 32, "max_prompt_length": 2048, "max_response_length": 2048},
    "actor_rollout_ref": {
        "rollout": {
            "n": 4,
            "engine_kwargs": {"vllm": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}},
        },
        "actor": {"ppo_mini_batch_size": 32, "use_kl_loss": False, "optim": {"lr": 1.0e-6}},
    },
    "trainer": {"experiment_name": "gsm8k"},
    "agentlightning": {
        "rollout_timeout_seconds": 300,
        "local": {
            "agent_class": "gsm8k_agent:Gsm8kAgent",
            "env_map": {"QUESTION": "input.question", "ANSWER": "input.answer"},
        },
    },
}

if __name__ == "__main__":
    main(GSM8K)
