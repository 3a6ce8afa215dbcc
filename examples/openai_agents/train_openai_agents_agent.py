"""Train the OpenAI Agents SDK agent (calculator tool) with GRPO.

    python examples/openai_agents/train_openai_agents_agent.py --train-file data/sample.jsonl --model PATH \\
        [--async] [--backend torch|verl] [key=value ...]

Inputs have `question` and `result` (see data/sample.jsonl). The Gateway and a Controller must
be running, the Controller with `local_runner.python=.venv-examples/bin/python
local_runner.cwd=examples/openai_agents`.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the examples' shared launcher

from launcher import main  # noqa: E402

CONFIG: dict = {
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 16, "max_prompt_length": 4096, "max_response_length": 1024},
    "actor_rollout_ref": {
        "rollout": {
            "n": 4,
            "engine_kwargs": {"vllm": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}},
        },
        "actor": {"ppo_mini_batch_size": 16, "use_kl_loss": False, "optim": {"lr": 1.0e-6}},
    },
    "trainer": {"experiment_name": "openai_agents"},
    "agentlightning": {
        "rollout_timeout_seconds": 300,
        "local": {
            "agent_class": "agents_sdk_agent:AgentsSdkAgent",
            "env_map": {"QUESTION": "input.question", "RESULT": "input.result"},
        },
    },
}

if __name__ == "__main__":
    main(CONFIG)
