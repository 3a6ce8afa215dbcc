"""The core's input: a rollout that reached a terminal state, with what the Gateway recorded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentlightning.schemas import AttemptOutcome, RolloutState


@dataclass(slots=True)
class CollectedRollout:
    rollout_id: str
    group_id: str  # the prompt's data_id
    state: RolloutState  # succeeded or failed
    # Triplet-format events of the last attempt; a model call's data is a wire.CollectedTriplet,
    # its prompt_token_ids perhaps a wire.PromptIds (collected in the triplet_delta format): it
    # reads like the list, `whole()` builds it.
    events: list[dict[str, Any]] = field(default_factory=list)
    is_train: bool = True
    step: int = 0  # the step whose batch created it (its age is current step - step)
    sample_idx: int = 0  # the prompt's index in that batch
    index_in_group: int = 0
    error_message: str | None = None
    lost: bool = False  # the trainer stopped waiting for it and failed it itself
    outcome: AttemptOutcome | None = None  # how its last attempt ended, as the Gateway recorded it
    input: Any = None

    @property
    def failed(self) -> bool:
        return self.state != RolloutState.SUCCEEDED
