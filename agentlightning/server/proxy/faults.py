"""Injected model-call failures (`proxy.fault_rate`): chaos testing of what an agent and the trainer
make of a model server that is down.

A call of a mode in `proxy.fault_modes` is struck when a keyed hash of its rollout, attempt and
request body falls under the rate, so the same request sent again by the agent's client fails
again: for that call the model server looks down through every retry. A struck call never
reaches the model; it is answered and recorded exactly as a call whose retries were used up on
503 (502 to the agent), so the Gateway's own evidence (`model_unavailable`, server/outcomes.py)
follows from it as from a real outage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection

from agentlightning.server.config import ProxyConfig
from agentlightning.server.proxy.upstream import Forwarded

STATUS = 502  # what the proxy answers once its retries are used up on 5xx (upstream.py)
_SCALE = float(2**64)


class FaultInjector:
    def __init__(self, rate: float, seed: int, tries: int, modes: Collection[str]) -> None:
        self.rate = rate
        self.modes = frozenset(modes)
        self.key = str(seed).encode()
        self.tries = tries

    def strikes(self, mode: str, rollout_id: str, attempt_id: str, body: bytes) -> bool:
        if mode not in self.modes:
            return False
        digest = hashlib.blake2b(body, digest_size=8, key=self.key)
        digest.update(f"\0{rollout_id}\0{attempt_id}".encode())
        return int.from_bytes(digest.digest(), "big") / _SCALE < self.rate

    def failure(self) -> Forwarded:
        return Forwarded(
            STATUS,
            None,
            self.tries,
            error=f"after {self.tries} tries: answered 503 (fault injected, proxy.fault_rate={self.rate:g}): "
            "the model server is down for this call",
        )


def fault_injector(config: ProxyConfig) -> FaultInjector | None:
    """The injector of `proxy.fault_rate`, or None when it is 0 (the hot path checks only that)."""
    if config.fault_rate <= 0:
        return None
    return FaultInjector(config.fault_rate, config.fault_seed, config.max_tries, config.fault_modes)
