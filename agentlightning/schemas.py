"""Wire types shared by every component: the one definition of Rollout, Event, Model, ….

The field names and meanings match Agent Lightning v1.0. Additions are optional fields or
new types, never a change of meaning of an existing field.
"""

from __future__ import annotations

import math
import time
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

# Ids travel in URL path segments and file names: no slashes, no whitespace.
ID_PATTERN = r"^[^/\s]{1,256}$"
RolloutId = Annotated[str, Field(pattern=ID_PATTERN, description="1-256 characters, no '/' or whitespace")]
AttemptId = RolloutId


class RolloutState(StrEnum):
    QUEUING = "queuing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES: frozenset[RolloutState] = frozenset({RolloutState.SUCCEEDED, RolloutState.FAILED})

# Legal state changes. Terminal states are final. A non-terminal state may be "patched to
# itself" so that a controller can attach a job name or start a new attempt without a change.
TRANSITIONS: dict[RolloutState, frozenset[RolloutState]] = {
    RolloutState.QUEUING: frozenset({RolloutState.QUEUING, RolloutState.RUNNING, RolloutState.FAILED}),
    RolloutState.RUNNING: frozenset({RolloutState.RUNNING, RolloutState.SUCCEEDED, RolloutState.FAILED}),
    RolloutState.SUCCEEDED: frozenset(),
    RolloutState.FAILED: frozenset(),
}


class IllegalTransition(ValueError):
    """A patch asked for a state change the transition table does not allow."""


def check_transition(current: RolloutState, target: RolloutState) -> None:
    if target not in TRANSITIONS[current]:
        allowed = sorted(s.value for s in TRANSITIONS[current] if s != current)
        hint = f"allowed from {current.value}: {', '.join(allowed)}" if allowed else "it is terminal (final)"
        raise IllegalTransition(f"cannot move a rollout from {current.value} to {target.value}: {hint}")


def now() -> float:
    return time.time()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalRolloutConfig(BaseModel):
    """How the local runner starts the agent: a Python class (`module.Class` or `module:Class` with
    a run() method), or a command in any language (an addition over v1.0). Exactly one."""

    agent_class: str | None = Field(
        default=None, min_length=1, description="module.Class or module:Class; run() may be async"
    )
    command: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        min_length=1,
        exclude_if=lambda value: value is None,  # a class agent's config on the wire as v1.0 writes it
        description="an agent as a command, in any language: its argv, run in the runner's folder "
        "with the agent contract's environment (an addition over v1.0)",
    )
    env_map: dict[str, str] = Field(
        default_factory=dict,
        description="environment variable -> path into the rollout, e.g. QUESTION: input.question",
    )

    @model_validator(mode="after")
    def _one_agent(self) -> LocalRolloutConfig:
        if (self.agent_class is None) == (self.command is None):
            raise ValueError("set exactly one of agent_class (a Python class) and command (an agent's argv)")
        return self


class K8sRolloutConfig(BaseModel):
    job_template: str = Field(min_length=1, description="Jinja template rendering exactly one batch/v1 Job")


class RolloutConfig(BaseModel):
    timeout_seconds: float = Field(
        default=3600, gt=0, description="wall-clock limit for one attempt (as v1.0)"
    )
    local: LocalRolloutConfig | None = None
    k8s: K8sRolloutConfig | None = None


class RolloutMetadata(BaseModel):
    """Free-form; the trainer fills the well-known keys below."""

    model_config = ConfigDict(extra="allow")

    batch_idx: int | None = None
    sample_idx_in_batch: int | None = None
    data_id: str | None = Field(
        default=None, description="id of the prompt; rollouts sharing it form a group"
    )


class RolloutStatus(BaseModel):
    state: RolloutState = RolloutState.QUEUING
    k8s_job_name: str | None = None
    last_attempt_id: str | None = None
    error_message: str | None = None
    version: int = Field(default=1, description="1 at creation; each accepted PATCH adds 1 (as v1.0)")
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)
    # Additions over v1.0 (optional, ignored by v1.0 clients):
    log_path: str | None = Field(default=None, description="where the runner writes the agent's output")


class Rollout(BaseModel):
    rollout_id: RolloutId
    input: Any = None
    is_train: bool = True
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: RolloutMetadata = Field(default_factory=RolloutMetadata)
    status: RolloutStatus = Field(default_factory=RolloutStatus)


class RolloutCreate(BaseModel):
    input: Any = None
    is_train: bool = True
    config: RolloutConfig | None = None
    metadata: RolloutMetadata | None = None
    rollout_id: RolloutId | None = Field(
        default=None, description="pre-assigned id; creating it twice is a no-op"
    )


class RolloutStatusPatch(_Strict):
    state: RolloutState | None = None
    k8s_job_name: str | None = None
    last_attempt_id: AttemptId | None = None
    error_message: str | None = None
    log_path: str | None = None


class RolloutPatch(_Strict):
    status: RolloutStatusPatch | None = None  # none, or no field set: the rollout unchanged (as v1.0)


class AttemptOutcome(StrEnum):
    """How a finished attempt ended, decided from the Gateway's and the Controller's own records
    (the proxy's failed calls, the agent process's or pod's end), not from the agent's say
    (docs/reliability.md). Declared from the weakest evidence to the strongest: when several
    are recorded for one attempt, the strongest stands."""

    OK = "ok"  # finished and reported a reward
    NO_REWARD = "no_reward"  # finished without a reward
    AGENT_ERROR = "agent_error"  # the agent failed on its own (a non-zero exit, a crash)
    CONTEXT_OVERFLOW = "context_overflow"  # the engine refused a prompt over its context
    TIMEOUT = "timeout"  # stopped at config.timeout_seconds (or the Job's deadline)
    LOST = "lost"  # the trainer gave up waiting for it
    MODEL_UNAVAILABLE = "model_unavailable"  # a model call failed (5xx, timeout) after the retries
    SANDBOX_LOST = "sandbox_lost"  # the agent's process was killed (memory limit, an operator)
    POD_LOST = "pod_lost"  # its pod was OOMKilled, evicted, or its node went away

    @property
    def rank(self) -> int:
        """Its strength as evidence: a stronger outcome replaces a weaker one, never the reverse."""
        return _OUTCOME_ORDER.index(self)

    @property
    def is_infrastructure(self) -> bool:
        """Caused by the system, not by the policy: never trained as a reward."""
        return self in INFRASTRUCTURE_OUTCOMES


_OUTCOME_ORDER: tuple[AttemptOutcome, ...] = tuple(AttemptOutcome)
INFRASTRUCTURE_OUTCOMES: frozenset[AttemptOutcome] = frozenset(
    {
        AttemptOutcome.TIMEOUT,
        AttemptOutcome.LOST,
        AttemptOutcome.MODEL_UNAVAILABLE,
        AttemptOutcome.SANDBOX_LOST,
        AttemptOutcome.POD_LOST,
    }
)
MAX_OUTCOME_DETAIL = 2000


class OutcomeReport(_Strict):
    """Evidence of how an attempt ended (the Controller's, the trainer's; an addition over v1.0)."""

    outcome: AttemptOutcome
    detail: str | None = Field(default=None, max_length=MAX_OUTCOME_DETAIL, description="what showed it")


class AttemptOutcomeState(BaseModel):
    """The outcome an attempt holds after a report: the strongest evidence recorded for it."""

    rollout_id: str
    attempt_id: str
    outcome: AttemptOutcome
    detail: str | None = None


class Attempt(BaseModel):
    attempt_id: str
    n_events: int
    first_event_at: float | None = None
    last_event_at: float | None = None
    # Additions over v1.0: how the attempt ended (None while it runs, and on older stores).
    outcome: AttemptOutcome | None = None
    outcome_detail: str | None = None


class RolloutDetail(BaseModel):
    rollout: Rollout
    attempts: list[str] = Field(description="attempt ids sorted by their first event (as v1.0)")
    # Addition over v1.0: the same attempts with their event counts and times.
    attempt_details: list[Attempt] = Field(default_factory=list, description="the attempts, in detail")


class TerminalItem(BaseModel):
    rollout_id: str
    state: RolloutState
    data_id: str = ""
    is_train: bool = True


class TerminalPage(BaseModel):
    items: list[TerminalItem]
    next_after: int = Field(description="pass as `after` to read the next page")
    total_terminal: int = Field(description="terminal rollouts currently stored")


MAX_BATCH_IDS = 1000


class RolloutIdList(_Strict):
    """Several rollouts at once (an addition over v1.0: the batch routes)."""

    rollout_ids: list[RolloutId] = Field(max_length=MAX_BATCH_IDS, description=f"at most {MAX_BATCH_IDS} ids")


class BatchDeleted(BaseModel):
    deleted: int = Field(description="how many of the rollouts existed (and are gone now)")


# --- events -------------------------------------------------------------------------------

EVENT_MODEL_REQUEST = "model_request"
EVENT_REWARD = "reward"


class EventCreate(BaseModel):
    event_type: str = Field(min_length=1, max_length=128)
    data: dict[str, Any] = Field(default_factory=dict)


class Event(BaseModel):
    event_type: str
    rollout_id: str
    attempt_id: str
    timestamp: float
    data: dict[str, Any] = Field(default_factory=dict)
    # Addition over v1.0: position in the Gateway's global append order.
    sequence: int | None = None


class BatchEventsQuery(RolloutIdList):
    """The events of many rollouts' last attempts in one request."""

    format: Literal["raw", "triplet", "triplet_delta"] = Field(
        "triplet",
        description="triplet_delta: the triplet view with each call's prompt given as "
        "`prompt_ref: [i, n]` (the first n prompt ids of event i of the same answer, or null) "
        "plus `prompt_suffix`, id lists and log-probs as base64 of uint32 / float64 "
        "little-endian (docs/long_horizon.md)",
    )
    event_type: str | None = None
    include_routed_experts: StrictBool = Field(
        True, description="as the events route's query parameter: MoE routes of model calls (R3)"
    )


class RolloutEvents(BaseModel):
    """One rollout's answer in a batch events read, in the order the ids were asked."""

    rollout_id: str
    found: bool = Field(description="false: no such rollout (then no events)")
    state: RolloutState | None = None
    error_message: str | None = None
    events: list[Event] = Field(default_factory=list)
    outcome: AttemptOutcome | None = Field(default=None, description="how its last attempt ended")


class RewardData(BaseModel):
    """Payload of a `reward` event, as an agent posts it."""

    model_config = ConfigDict(extra="allow")

    value: float
    source: str | None = None
    reason: str | None = None

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("reward value must be a finite number")
        return v


# A `model_request` event's payload and its training view: agentlightning/model_call.py (typed
# dicts, so that neither the proxy nor the trainer pays for validating them).


# --- models and the proxy -----------------------------------------------------------------


class Model(BaseModel):
    model: str = Field(min_length=1, description="model name the proxy routes by")
    endpoint: str = Field(
        min_length=1, description="base URL of an OpenAI-compatible server, e.g. http://h:8000/v1"
    )
    version: int = Field(default=0, ge=0, description="policy version the endpoint serves")
    # Additions over v1.0 (absent from answers when unset): a leased endpoint is removed unless
    # registered again within `lease_seconds` — a trainer renews its own, so a killed trainer's
    # endpoints go by themselves. `expires_at` (Unix time) is set by the Gateway at registration.
    lease_seconds: float | None = Field(
        default=None,
        ge=0,
        description="remove the endpoint unless registered again within this many seconds; 0: remove it now",
    )
    expires_at: float | None = Field(
        default=None, description="set by the Gateway: when a leased endpoint expires"
    )

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, v: str) -> str:
        # The proxy sends agents' prompts there: nothing but a plain http(s) server.
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint must be an http:// or https:// URL with a host, got {v!r}")
        return v


class PauseRequest(BaseModel):
    retry_after_seconds: float = Field(default=5.0, ge=0)
    reason: str | None = None


class ProxyState(BaseModel):
    paused: bool
    retry_after_seconds: float
    reason: str | None = None
    inflight: int


class AgentTokenRequest(_Strict):
    """Ask for the token of one rollout attempt (an addition over v1.0; controller or admin key)."""

    rollout_id: RolloutId
    attempt_id: AttemptId


class AgentToken(BaseModel):
    token: str = Field(description="the agent's AGL_KEY: valid for this attempt while the rollout is live")
    rollout_id: str
    attempt_id: str


class Health(BaseModel):
    status: Literal["ok"] = "ok"


# --- training runs' metrics (an addition over v1.0: the dashboard's training page) ----------


class MetricPoint(_Strict):
    """One step of a training run: its metrics, as the trainer logs them to its sinks."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    step: int = Field(ge=0)
    metrics: dict[str, float]
    time: float | None = Field(default=None, description="when the step ended (unix seconds); default: now")


class RunSummary(BaseModel):
    run_id: str
    n_points: int
    last_step: int | None
    updated_at: float
    keys: list[str]


class RunMetrics(BaseModel):
    run_id: str
    points: list[MetricPoint]
