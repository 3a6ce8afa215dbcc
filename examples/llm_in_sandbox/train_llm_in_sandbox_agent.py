"""Train the LLM-in-Sandbox agent (plain `openai` client, tools run in bubblewrap) with GRPO.

    python examples/llm_in_sandbox/train_llm_in_sandbox_agent.py --train-file data/train.jsonl \\
        --val-file data/test.jsonl --model PATH [--async] [--backend torch|verl] [key=value ...]

Inputs are task rows (`family`, `seed`, `question`, `answer`, `documents`) from `tasks.py` or
`convert.py` (public data, README). The Gateway and a Controller must be running, the Controller with
`local_runner.python=.venv-examples/bin/python local_runner.cwd=examples/llm_in_sandbox`
(`run_local.sh` starts both); the machine needs `bwrap` (Debian's bubblewrap).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the examples' shared launcher

from launcher import main  # noqa: E402

# Long multi-turn tool conversations: large prompts and responses, a generous timeout; the hermes
# tool parser for vLLM (Qwen models). Sizes are ours (a 4B model on one node), not v1.0's.
LLM_IN_SANDBOX: dict = {
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 32, "max_prompt_length": 8192, "max_response_length": 8192},
    "actor_rollout_ref": {
        "rollout": {
            "n": 8,
            "engine_kwargs": {"vllm": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}},
        },
        "actor": {"ppo_mini_batch_size": 32, "use_kl_loss": False, "optim": {"lr": 1.0e-6}},
    },
    "trainer": {"experiment_name": "llm_in_sandbox"},
    "agentlightning": {
        "rollout_timeout_seconds": 900,
        "local": {
            "agent_class": "sandbox_agent:SandboxAgent",
            "env_map": {
                "TASK_FAMILY": "input.family",
                "TASK_SEED": "input.seed",
                "QUESTION": "input.question",
                "ANSWER": "input.answer",
                "TASK_DOCUMENTS": "input.documents",
            },
        },
        "k8s": {"job_template_path": str(HERE / "job-template.yaml")},  # with runner_type=k8s
    },
}

if __name__ == "__main__":
    main(LLM_IN_SANDBOX)
