"""The record of one model call: the `model_request` event's payload (`ModelCall`) and its
training view (`CallTriplet`, `format=triplet`), declared once for the Gateway and the trainer.

TypedDicts, not pydantic models: plain dicts at run time, so the proxy builds a record and the
trainer reads thousands of them at no validation cost, while mypy checks every key spelt against
these declarations. They describe what this Gateway writes. A payload read back may have been
written by another writer (a v1.0 Gateway, an older store, an agent posting its own event) and
is not validated: readers use `.get` and check each value's type.

This module is a base layer beside `schemas` and `wire`: it imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Literal, NotRequired, TypedDict, TypeVar


class CallServer(TypedDict):
    """The inference server that answered a call."""

    model: str  # the policy: the model name the proxy routes by
    endpoint: str
    version: int  # the policy version the server served


class ServingPolicy(TypedDict):
    """A triplet's `server`: the policy and policy version that answered, as training needs them."""

    model: str | None  # None where the payload's server names none (another writer's payload)
    version: int


class ModelCall(TypedDict):
    """Payload of a `model_request` event, as the proxy writes it for every model call
    (server/proxy/capture.py; the keys' meanings: docs/gateway.md, "What is recorded")."""

    api: str  # chat.completions, completions, responses or anthropic.messages
    mode: str  # train or val
    request: dict[str, Any] | None  # the body the agent sent; None: it could not be kept as JSON
    params: dict[str, Any]  # the fields the proxy set
    response: dict[str, Any] | None  # the server's answer (a stream's, assembled)
    server: CallServer | None  # None: no server answered (none registered)
    latency_ms: float | None
    http_status: int | None
    status: Literal["ok", "error"]
    error: str | None
    retries: int
    usage: dict[str, Any] | None  # the answer's, as the server gave it
    finish_reason: str | None  # the first choice's, as the server gave it
    stream: bool
    incomplete: bool  # a stream that did not finish
    # v1.0's names, kept for its readers: retries as `retry_count`, copies of server's model and
    # version (set with server), and its MoE routing capture, written as None.
    retry_count: int
    model: NotRequired[str]
    model_version: NotRequired[int]
    # Taken out when the call's routes are stored apart (proxy/experts.py); reads splice them in.
    routed_experts: NotRequired[Any]
    # Only some calls have these:
    segment: NotRequired[dict[str, Any]]  # how the prompt continues the attempt's previous call
    chat_request: NotRequired[dict[str, Any]]  # Responses, Messages: the chat request sent upstream
    api_response: NotRequired[Any]  # Responses, Messages: the answer the agent got


# A prompt's ids: a list on the Gateway; on the trainer, a `wire.PromptIds` where the call was
# collected in the `triplet_delta` format with its prompt given by reference.
PromptT = TypeVar("PromptT", bound=Sequence[int])


class CallTokens(TypedDict, Generic[PromptT]):
    """A call's token lists: what `wire.TokenDelta` packs (the store's deltas, the `triplet_delta` format)."""

    prompt_token_ids: PromptT  # empty when the answer carried none
    response_token_ids: list[int]  # the first choice's; empty when none
    response_log_probs: list[float] | None  # one per response token; None: not (all) reported


class CallTriplet(CallTokens[PromptT]):
    """The training view of one `model_request` event (server/triplet.py builds it)."""

    server: ServingPolicy | None
    # Copied from the payload where it has them (not None):
    http_status: NotRequired[int]
    status: NotRequired[str]
    error: NotRequired[str]
    # MoE routes (R3), spliced in on reads where the Gateway stored them (proxy/experts.py).
    routed_experts: NotRequired[Any]
