"""ScienceWorld: a multi-turn agent on the plain `openai` client in AllenAI's text simulator.

One rollout is one episode: a JVM with the simulator starts (sw_env.py), loads the task and
variation of the rollout's input, and the model plays it one action per turn (`ACTION: <action>`
as the reply's last line) until the task is completed or failed, the simulator's step limit is
reached, `SCIENCE_WORLD_MAX_TURNS` model turns have been taken, or the conversation has reached
`SCIENCE_WORLD_MAX_TOTAL_TOKENS`. The reward is the simulator's final score divided by 100,
clipped to 0..1 (a failed task scores -100: reward 0). The JVM is ended before the reward is
posted, also when the episode fails.

The conversation only grows (system, task, then alternating model turns and observations), so
every call's prompt starts with the previous prompt and response: the rollout trains as one row.

Environment (set by the Controller): `AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL`, `AGL_KEY`; the task
as `TASK_NAME`, `VARIATION_IDX`, `SIMPLIFICATION` (env_map `input.task_name`,
`input.variation_idx`, `input.simplification`, as v1.0); and the options below.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from sw_env import DEFAULT_JAVA_OPTIONS, ScienceWorldSession, Step

from agentlightning.agent_events import post_event, post_reward

# option: (environment variable, default, minimum)
OPTIONS = {
    "max_turns": ("SCIENCE_WORLD_MAX_TURNS", 30, 1),  # model calls per episode (v1.0: 30)
    "env_step_limit": ("SCIENCE_WORLD_ENV_STEP_LIMIT", 100, 1),  # the simulator's own limit (v1.0: 100)
    "max_tokens": ("SCIENCE_WORLD_MAX_TOKENS", 256, 1),  # per model reply (v1.0: 256)
    "max_total_tokens": ("SCIENCE_WORLD_MAX_TOTAL_TOKENS", 12288, 64),  # prompt + reply of one call
}
ACTION = re.compile(r"^\s*ACTION:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
MAX_ACTION_CHARS = 200
FORMAT_HINT = "No action found. End your reply with one line: ACTION: <action>"

SYSTEM = """You are doing an elementary-school science task in ScienceWorld, a text simulation \
of a house with rooms such as a kitchen, a workshop and a greenhouse, and the outside.
Each turn you read what happened and answer with one action. Put it on the last line of your \
reply as:
ACTION: <action>

Actions (replace OBJ with an object you have seen):
{templates}

When the game asks you to choose among numbered options, answer with the number: ACTION: 0"""

FIRST_TURN = """Task: {task}

{observation}

{inventory}"""


@dataclass(frozen=True)
class Options:
    max_turns: int = 30
    env_step_limit: int = 100
    max_tokens: int = 256
    max_total_tokens: int = 12288
    java_options: str = DEFAULT_JAVA_OPTIONS

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str]) -> Options:
        values: dict[str, Any] = {}
        for name, (variable, default, minimum) in OPTIONS.items():
            raw = env.get(variable, "")
            try:
                value = int(raw) if raw.strip() else default
            except ValueError:
                raise ValueError(f"{variable}={raw!r}: expected an integer") from None
            if value < minimum:
                raise ValueError(f"{variable}={value}: must be at least {minimum}")
            values[name] = value
        values["java_options"] = env.get("SCIENCE_WORLD_JAVA_OPTIONS", DEFAULT_JAVA_OPTIONS)
        return cls(**values)


@dataclass
class Episode:
    score: int = 0
    turns: int = 0  # model calls
    env_steps: int = 0
    ended_by: str = "max_turns"  # completed | failed | env_step_limit | max_turns | token_limit
    last_total_tokens: int = 0
    actions: list[str] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return min(1.0, max(0.0, self.score / 100.0))


def parse_action(reply: str | None) -> str | None:
    """The text after the last `ACTION:` line, or None."""
    found = ACTION.findall(reply or "")
    if not found:
        return None
    return found[-1].strip().strip("`").strip()[:MAX_ACTION_CHARS] or None


def ended_by(step: Step, env_step_limit: int) -> str:
    if step.score >= 100:
        return "completed"
    if step.score < 0:
        return "failed"
    if step.moves > env_step_limit:
        return "env_step_limit"
    return "completed"  # the simulator's own completion below a full score


def play(client: OpenAI, env: ScienceWorldSession, options: Options) -> Episode:
    episode = Episode()
    start = env.reset()
    episode.score = start.score
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM.format(templates="\n".join(env.action_templates()))},
        {
            "role": "user",
            "content": FIRST_TURN.format(
                task=env.task_description(), observation=start.observation, inventory=env.inventory()
            ),
        },
    ]
    for _ in range(options.max_turns):
        response = client.chat.completions.create(
            model="policy", messages=messages, max_tokens=options.max_tokens
        )
        episode.turns += 1
        reply = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        if response.usage is not None:
            episode.last_total_tokens = int(response.usage.total_tokens)
        action = parse_action(reply)
        if action is None:
            observation = FORMAT_HINT
        else:
            step = env.step(action)
            episode.actions.append(action)
            episode.env_steps += 1
            episode.score = step.score
            observation = step.observation
            if step.done:
                episode.ended_by = ended_by(step, options.env_step_limit)
                return episode
        if episode.last_total_tokens >= options.max_total_tokens:
            episode.ended_by = "token_limit"
            return episode
        messages.append({"role": "user", "content": observation})
    return episode


class ScienceWorldAgent:
    """The rollout entry point (`agent_class: sw_agent:ScienceWorldAgent`)."""

    def run(self) -> float:
        options = Options.from_env(os.environ)
        session = ScienceWorldSession(
            os.environ["TASK_NAME"],
            int(os.environ["VARIATION_IDX"]),
            os.environ.get("SIMPLIFICATION") or "easy",
            env_step_limit=options.env_step_limit,
            java_options=options.java_options,
        )
        client = OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"],
            api_key=os.environ.get("AGL_KEY") or "unused",
            max_retries=6,
            timeout=300.0,
        )
        started = time.monotonic()
        try:
            with session:
                # First, so that the JVM can be found by its pid even if the rollout is killed.
                post_event(
                    "environment",
                    {
                        "jvm_pid": session.jvm_pid,
                        "jvm_start_ticks": session.jvm_ticks,
                        "jvm_start_seconds": round(session.start_seconds, 3),
                        "task_name": session.task_name,
                        "variation_idx": session.variation_idx,
                        "simplification": session.simplification,
                    },
                )
                episode = play(client, session, options)
        finally:
            client.close()
        summary = {
            "score": episode.score,
            "turns": episode.turns,
            "env_steps": episode.env_steps,
            "ended_by": episode.ended_by,
            "last_total_tokens": episode.last_total_tokens,
            "seconds": round(time.monotonic() - started, 3),
            "actions": episode.actions,
        }
        post_event("episode", summary)
        reason = f"score {episode.score} after {episode.turns} turns ({episode.ended_by})"
        post_reward(episode.reward, source="science_world", reason=reason)
        return episode.reward


if __name__ == "__main__":
    ScienceWorldAgent().run()
