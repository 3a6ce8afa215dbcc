"""MoE routing replay (R3): the routes vLLM used for a call, recorded for the trainer.

With `default_proxy.include_routed_experts`, a train-mode call asks vLLM for
`return_routed_experts`; each choice's `routed_experts` is taken out of the answer the agent
sees (as v1.0 does) and the first choice's is stored apart from the event (`Store.put_routes`).

Routes are large (one entry per token, per layer, per chosen expert) and only the last call of
a trajectory is trained on with them: its prompt + response covers every earlier call's tokens.
So a call whose prompt equals an earlier call's prompt (a retry), or begins with an earlier
call's prompt + response (the next turn), drops that call's routes, as v1.0 does
(`_drop_superseded_routed_experts`). The index below remembers, per attempt, digests of the
calls still holding routes; an attempt it does not know (new, forgotten, or from before a
Gateway restart) is loaded from the store on its first call with routes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from agentlightning.model_call import CallTriplet
from agentlightning.schemas import EVENT_MODEL_REQUEST
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.store import Store
from agentlightning.server.triplet import model_request_triplet, prompt_key

MAX_ATTEMPTS = 16384  # attempts the index keeps (LRU)
MAX_HOLDERS = 64  # calls per attempt still holding routes (interleaved conversations)


def pop_routed_experts(response: dict[str, Any]) -> Any:
    """Take `routed_experts` out of every choice; the first one found (v1.0's `_pop_routed_experts`)."""
    found = None
    choices = response.get("choices")
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict):
            routes = choice.pop("routed_experts", None)
            if found is None:
                found = routes
    return found


@dataclass(frozen=True, slots=True)
class _Holder:
    sequence: int
    prompt_len: int
    prompt_digest: str
    context_len: int  # prompt + response
    context_digest: str

    @classmethod
    def of(cls, sequence: int, prompt_ids: list[int], response_ids: list[int]) -> _Holder:
        context = prompt_ids + response_ids
        return cls(sequence, len(prompt_ids), prompt_key(prompt_ids), len(context), prompt_key(context))


class RouteIndex:
    """Per attempt, the calls whose routes are still stored; says which a new call supersedes."""

    def __init__(self) -> None:
        self._attempts: OrderedDict[tuple[str, str], list[_Holder]] = OrderedDict()

    def supersede(
        self, rollout_id: str, attempt_id: str, sequence: int, prompt_ids: list[int], response_ids: list[int]
    ) -> list[int]:
        """Record call `sequence` as holding routes; return the sequences whose routes it supersedes."""
        if not (prompt_ids and response_ids):  # nothing to extend, nothing a later call can cover
            return []
        key = (rollout_id, attempt_id)
        holders = self._attempts.pop(key, [])
        dropped: list[_Holder] = []
        kept: list[_Holder] = []
        n = len(prompt_ids)
        whole = prompt_key(prompt_ids)
        for h in holders:
            same_prompt = h.prompt_len == n and h.prompt_digest == whole
            extends = (
                0 < h.context_len <= n
                and (whole if h.context_len == n else prompt_key(prompt_ids[: h.context_len]))
                == h.context_digest
            )
            (dropped if same_prompt or extends else kept).append(h)
        kept.append(_Holder.of(sequence, prompt_ids, response_ids))
        self._keep(key, kept)
        return [h.sequence for h in dropped]

    def forget(self, rollout_id: str) -> None:
        """Drop a rollout's attempts (another replica changed its routes): reloaded on next use."""
        for key in [k for k in self._attempts if k[0] == rollout_id]:
            del self._attempts[key]

    def clear(self) -> None:
        self._attempts.clear()

    def _keep(self, key: tuple[str, str], holders: list[_Holder]) -> None:
        self._attempts[key] = holders[-MAX_HOLDERS:]
        while len(self._attempts) > MAX_ATTEMPTS:
            self._attempts.popitem(last=False)

    async def load(self, store: Store, rollout_id: str, attempt_id: str) -> None:
        """Know the attempt: when new to the index, the calls of it the store holds routes of."""
        key = (rollout_id, attempt_id)
        if key in self._attempts:
            return
        holders: list[_Holder] = []
        held = await store.get_routes(rollout_id)
        if held:
            events = await store.list_events(rollout_id, attempt_id, EVENT_MODEL_REQUEST, view="triplet")
            for e in events:
                if e.sequence in held and e.record.triplet:
                    t: CallTriplet[list[int]] = orjson.loads(e.record.triplet)
                    if t.get("prompt_token_ids") and t.get("response_token_ids"):
                        holders.append(_Holder.of(e.sequence, t["prompt_token_ids"], t["response_token_ids"]))
        if key not in self._attempts:  # another call of the attempt may have loaded it meanwhile
            self._keep(key, holders)

    async def save(self, store: Store, record: CallRecord, routes: object) -> None:
        """Record the call, then its routes apart, dropping those it supersedes."""
        encoded = orjson.dumps(routes)  # parsed from JSON just before: it encodes
        del record.data["routed_experts"]  # reads splice the stored routes in (events.render_events)
        sequence = await record.save(store)
        if record.data.get("status") == "error":
            return
        triplet = model_request_triplet(record.data)
        await self.load(store, record.rollout_id, record.attempt_id)
        drop = self.supersede(
            record.rollout_id,
            record.attempt_id,
            sequence,
            triplet["prompt_token_ids"],
            triplet["response_token_ids"],
        )
        await store.put_routes(record.rollout_id, sequence, encoded, drop)
