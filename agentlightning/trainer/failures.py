"""Failed rollouts and missing rewards, said on the console where the user looks — not only in
the Controller's and the agents' logs, and not as a validation reward of 0.000 that looks like a
policy that learned nothing.

After each collection (a training step, a validation) the loop asks `check_rollouts`:

* some rollouts failed: one line with how many, and the first distinct error messages the
  attempts recorded (a wrong agent module, an agent that raised, a timeout);
* every rollout failed: with `agentlightning.stop_when_all_rollouts_fail` (the default) the run
  stops with `AllRolloutsFailed` (a non-zero exit) instead of training on nothing;
* rollouts succeeded but none reported a reward: one line saying how rewards are reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from agentlightning.rewards import last_reward
from agentlightning.trainer.collected import CollectedRollout

MESSAGES_SHOWN = 2  # distinct error messages on the line
MESSAGE_CHARS = 240
NO_REWARD_HINT = (
    "an agent reports it with a `reward` event posted to $AGL_EVENT_URL with the header "
    "`Authorization: Bearer $AGL_KEY` (docs/controller.md); the agents' logs say why not"
)


class AllRolloutsFailed(RuntimeError):
    """Every rollout of a collection failed: nothing to train on or to validate."""


def _summary(message: str | None) -> str:
    """The message's first line and, when output follows it, its last line — for an agent that
    raised, the exception (`agent exited with code 1; last output: … ModuleNotFoundError: …`)."""
    own = (message or "").split("\nearlier attempts:")[0]  # the Controller appends the retries'
    lines = [line.strip() for line in own.strip().splitlines() if line.strip()]
    if not lines:
        return "failed, no message recorded"
    line = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 1] + "…"


def failure_line(rollouts: Sequence[CollectedRollout], what: str) -> str | None:
    """`what: N of M rollouts failed: "message" (×k); …`, or None when none failed."""
    failed = [r for r in rollouts if r.failed]
    if not failed:
        return None
    counts = Counter(_summary(r.error_message) for r in failed)
    shown = "; ".join(
        f"{message!r}" + (f" (×{n})" if n > 1 else "") for message, n in counts.most_common(MESSAGES_SHOWN)
    )
    more = len(counts) - MESSAGES_SHOWN
    return f"{what}: {len(failed)} of {len(rollouts)} rollouts failed: {shown}" + (
        f"; and {more} other message(s)" if more > 0 else ""
    )


def no_reward_line(rollouts: Sequence[CollectedRollout], what: str) -> str | None:
    """A line when rollouts succeeded and not one of them reported a reward."""
    succeeded = [r for r in rollouts if not r.failed]
    if not succeeded or any(last_reward(r.events) is not None for r in succeeded):
        return None
    return f"{what}: none of the {len(succeeded)} finished rollouts reported a reward: {NO_REWARD_HINT}"


def check_rollouts(rollouts: Sequence[CollectedRollout], what: str, stop_when_all_fail: bool) -> list[str]:
    """The lines to say about a collection; raises `AllRolloutsFailed` when every rollout failed
    and `stop_when_all_fail`."""
    lines = [line for line in (failure_line(rollouts, what), no_reward_line(rollouts, what)) if line]
    if rollouts and stop_when_all_fail and all(r.failed for r in rollouts):
        raise AllRolloutsFailed(
            f"{lines[0]}\nevery rollout failed: the run stops here (agentlightning.stop_when_all_rollouts_fail; "
            "the Controller's and the agents' logs have the details)"
        )
    return lines
