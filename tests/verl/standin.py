"""Stand-ins for verl's side of the backend: vLLM replicas as real OpenAI servers on loopback
(`tests.fakes.model_server`), and a worker set with `engine.VerlWorkers`' interface that records
the order of what the backend asks of it, with the Gateway's state at that moment."""

from __future__ import annotations

import threading
from typing import Any

import torch

from agentlightning.client import GatewayClient
from tests.fakes.model_server import FakeModelServer, Reply

ASLEEP = Reply(status=400, error_body={"error": {"message": "replica asleep"}}, times=10**9)


class StandInReplica:
    """A vLLM-shaped server that refuses every call (400, not retried by the proxy) while asleep."""

    def __init__(self) -> None:
        self.server = FakeModelServer(served_model_name="policy").start()
        self.asleep = False
        self.version = 0

    @property
    def address(self) -> str:
        return f"{self.server.host}:{self.server.port}"  # as verl's get_addresses() gives it

    def sleep(self) -> None:
        self.asleep = True
        self.server.script(ASLEEP)

    def wake(self, version: int) -> None:
        self.server.state.reset()
        self.asleep = False
        self.version = version


class StandInWorkers:
    """`VerlWorkers`' interface over stand-in replicas; `log` is the order of the calls."""

    def __init__(self, client: GatewayClient, n_replicas: int = 2, dp_size: int = 2) -> None:
        self.client = client
        self.replicas = [StandInReplica() for _ in range(n_replicas)]
        self.dp_size = dp_size
        self.pad_token_id = 0
        self.log: list[tuple[str, dict[str, Any]]] = []
        self.batches: list[Any] = []
        self.lock = threading.Lock()
        self.total_optimizer_steps: int | None = None
        self.saved: list[tuple[str, int]] = []
        self.loaded: list[str] = []

    def factory(self, view: Any, total_optimizer_steps: int) -> StandInWorkers:
        self.total_optimizer_steps = total_optimizer_steps
        return self

    def _record(self, what: str, **extra: Any) -> None:
        state = self.client.proxy_state()
        with self.lock:
            self.log.append((what, {"paused": state.paused, "inflight": state.inflight, **extra}))

    def start(self) -> list[str]:
        self._record("start")
        return self.addresses()

    def addresses(self) -> list[str]:
        return [r.address for r in self.replicas]

    def sleep_replicas(self) -> None:
        self._record("sleep", replica_requests=sum(len(r.server.requests) for r in self.replicas))
        for r in self.replicas:
            r.sleep()

    def sync_weights(self, step: int) -> None:
        self._record("sync", step=step)
        for r in self.replicas:
            r.wake(step)

    def compute_log_probs(self, batch: Any) -> torch.Tensor:
        return torch.zeros_like(batch.batch["old_log_probs"])

    def compute_ref_log_probs(self, batch: Any) -> torch.Tensor:
        self._record("ref_log_probs")
        return torch.zeros_like(batch.batch["old_log_probs"])

    def update(self, batch: Any) -> dict[str, float]:
        self._record("update", rows=len(batch), asleep=all(r.asleep for r in self.replicas))
        self.batches.append(batch)
        return {"actor/pg_loss": 0.5, "actor/grad_norm": 1.0}

    def save_checkpoint(self, path: str, step: int) -> None:
        self.saved.append((path, step))

    def load_checkpoint(self, path: str) -> None:
        self.loaded.append(path)

    def close(self) -> None:
        for r in self.replicas:
            r.server.stop()
