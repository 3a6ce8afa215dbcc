"""What the reconcile loop needs from a runner (local processes or Kubernetes Jobs)."""

from __future__ import annotations

import abc
import re
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from agentlightning.schemas import AttemptOutcome, Rollout

_ATTEMPT = re.compile(r"^attempt-(\d+)-")


def new_attempt_id(number: int) -> str:
    """Attempt ids carry their number, so that attempts are counted across controller restarts."""
    return f"attempt-{number}-{uuid.uuid4().hex[:10]}"


def attempt_number(attempt_id: str | None) -> int:
    """1 for ids this controller did not make (e.g. a v1.0 controller's)."""
    match = _ATTEMPT.match(attempt_id or "")
    return int(match.group(1)) if match else 1


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended. `retryable` marks an infrastructure failure (retried as a new attempt
    while attempts are left); an agent's own failure is never retried. `never_started`: the agent
    was never started (the controller stopped between claiming the rollout and starting it), a
    loss of the controller's own: retried as a new attempt even when no attempts are left.
    `kind`: the failure's type as the Gateway records it (docs/reliability.md); None leaves it
    to the reconciler: the runner's own loss when retryable, else the agent's error."""

    succeeded: bool
    message: str | None = None
    retryable: bool = False
    never_started: bool = False
    kind: AttemptOutcome | None = None

    @staticmethod
    def success() -> Outcome:
        return Outcome(True)

    @staticmethod
    def failure(message: str, retryable: bool = False, kind: AttemptOutcome | None = None) -> Outcome:
        return Outcome(False, message, retryable, kind=kind)

    @staticmethod
    def not_started(message: str) -> Outcome:
        return Outcome(False, message, retryable=True, never_started=True)


class StartupError(Exception):
    """The runner cannot start (a bad runner set-up); the message says why."""


class LaunchError(Exception):
    """The attempt could not be started. `retryable`: an infrastructure failure."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class Handle(abc.ABC):
    """One running attempt. `deadline` (wall-clock seconds) is when the controller stops it."""

    deadline: float

    @abc.abstractmethod
    async def wait(self) -> Outcome:
        """Until the attempt ends by itself."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """Stop the attempt and everything it started; returns once it is gone (or given up on)."""


class AgentKeySource(Protocol):
    async def key_for(self, rollout_id: str, attempt_id: str) -> str: ...


class Runner(abc.ABC):
    """Starts attempts and finds them again after a controller restart."""

    #: How many attempts may run at once; None = no limit.
    capacity: int | None = None
    #: Whether the controller stops (and fails) running attempts when it shuts down.
    kill_on_shutdown: bool = True
    #: The controller's Gateway key; agents get a token for their attempt from `agent_keys` instead.
    key: str = ""
    agent_keys: AgentKeySource | None = None
    #: The outcome of an attempt this runner lost (a retryable failure that names no other).
    lost_as: AttemptOutcome = AttemptOutcome.SANDBOX_LOST

    async def agent_key(self, rollout_id: str, attempt_id: str) -> str:
        """AGL_KEY for an agent: its attempt's token (the controller's key without a source)."""
        if self.agent_keys is None:
            return self.key
        return await self.agent_keys.key_for(rollout_id, attempt_id)

    async def start(self) -> None:
        """Connect, warm up. Called once before anything else."""
        return None

    async def close(self) -> None:
        """Release what start() took. Running attempts are not touched."""
        return None

    def claim_fields(self, rollout: Rollout, attempt_id: str) -> dict[str, Any]:
        """Status fields recorded with the move to running (e.g. log_path, k8s_job_name)."""
        return {}

    @abc.abstractmethod
    async def launch(self, rollout: Rollout, attempt_id: str) -> Handle:
        """Start an attempt. Raises LaunchError."""

    @abc.abstractmethod
    async def recover(self, rollout: Rollout, attempt_id: str) -> Handle | Outcome | None:
        """After a restart: the live attempt (adopt it), how it ended while nobody watched
        (`Outcome.not_started` where its agent provably never started), or None when nothing of
        it is left."""

    def forget(self, rollout_id: str, attempt_id: str) -> None:
        """The attempt has been reported; drop what is kept about it (files, bookkeeping)."""
        return None
