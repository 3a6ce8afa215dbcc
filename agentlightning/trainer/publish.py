"""The trainer's inference endpoints on the Gateway, and weight updates around them.

A weight update runs in this order: pause the Gateway's proxy (agents get 429 with
Retry-After and retry), wait for the calls already in flight to drain (with a deadline), let
the backend publish the new weights, register the endpoints with the new model version,
resume. The endpoint table is never empty while calls can arrive, so no call meets
"no endpoints", and every call after the resume records the new version.

The endpoints are registered with a lease (`agentlightning.endpoint_lease_seconds`) that a
background thread renews (`LeaseKeeper`): a trainer killed with SIGKILL leaves no endpoint behind
once its lease runs out, and a clean stop ends the lease at once (`EndpointPublisher.unregister`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

from agentlightning.client import GatewayClient
from agentlightning.log import get_logger
from agentlightning.schemas import Model

log = get_logger("trainer")


def normalize_endpoint(address: str) -> str:
    """`host:port` -> `http://host:port/v1`; a URL is kept as it is (without a trailing slash)."""
    address = address.strip()
    if not address:
        raise ValueError("an inference endpoint address is empty")
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    return f"http://{address}/v1"


class EndpointPublisher:
    def __init__(
        self,
        client: GatewayClient,
        model_name: str,
        drain_timeout_seconds: float = 120.0,
        retry_after_seconds: float = 5.0,
        lease_seconds: float | None = None,
    ) -> None:
        self.client = client
        self.model_name = model_name
        self.drain_timeout_seconds = drain_timeout_seconds
        self.retry_after_seconds = retry_after_seconds
        self.lease_seconds = lease_seconds  # None: registered for good (v1.0)
        self.endpoints: list[str] = []
        self.version = 0
        # A renewal from the lease thread never writes an older version over a newer one.
        self._lock = threading.Lock()

    def _models(self, urls: Sequence[str], version: int, lease: float | None) -> list[Model]:
        return [Model(model=self.model_name, endpoint=u, version=version, lease_seconds=lease) for u in urls]

    def register(self, endpoints: Sequence[str], version: int, replace: bool = False) -> None:
        """Register `endpoints` as serving `version`. `replace` first clears the Gateway's table
        (call it only while nothing can be routed: at start-up or while paused)."""
        urls = [normalize_endpoint(e) for e in endpoints]
        if not urls:
            raise ValueError("register at least one inference endpoint")
        if version < 0:
            raise ValueError(f"a model version is >= 0, got {version}")
        with self._lock:
            if replace:
                self.client.delete_models()
            self.client.register_models(self._models(urls, version, self.lease_seconds))
            self.endpoints = urls
            self.version = version
        log.info("endpoints_registered", model=self.model_name, version=version, endpoints=urls)

    def refresh(self) -> None:
        """Register the current endpoints and version again (an upsert, never a gap): repairs a
        Gateway that lost its table, e.g. one restarted with the memory store."""
        with self._lock:
            if self.endpoints:
                self.client.register_models(self._models(self.endpoints, self.version, self.lease_seconds))

    def unregister(self) -> None:
        """At a clean stop: end the lease of this publisher's endpoints now (only theirs: other
        models in the table stay). Without a lease (a v1.0 setup) they stay, as in v1.0."""
        with self._lock:
            if self.endpoints and self.lease_seconds is not None:
                self.client.register_models(self._models(self.endpoints, self.version, 0))
                log.info("endpoints_unregistered", model=self.model_name, endpoints=self.endpoints)
            self.endpoints = []

    def drain(self, timeout: float) -> tuple[bool, int]:
        """Wait until no proxied call is in flight; (drained, calls still in flight)."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            inflight = self.client.proxy_state().inflight
            if inflight <= 0:
                return True, 0
            if time.monotonic() >= deadline:
                return False, inflight
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)

    def update(self, publish: Callable[[], Sequence[str] | None], version: int) -> dict[str, float]:
        """Pause, drain, `publish()` (returns the endpoints, or None to keep them), register, resume."""
        return update_together([(self, publish, version)])


def update_together(
    updates: Sequence[tuple[EndpointPublisher, Callable[[], Sequence[str] | None], int]],
) -> dict[str, float]:
    """One weight update of several policies (docs/policies.md) under one pause: pause, drain,
    then for each `(publisher, publish, version)` `publish()` and register `version`, resume.
    The publishers share one Gateway; the first one's client and timeouts are used. When any
    policy's endpoints change, the table is cleared once and every policy registered again."""
    if not updates:
        raise ValueError("update at least one policy")
    for publisher, _, version in updates:
        if version < publisher.version:
            raise ValueError(
                f"the new version {version} of {publisher.model_name!r} is older than the served {publisher.version}"
            )
    lead = updates[0][0]
    started = time.perf_counter()
    versions = ", ".join(f"{p.model_name} {v}" for p, _, v in updates)
    state = lead.client.pause(lead.retry_after_seconds, reason=f"weight update to version {versions}")
    drain_started = time.perf_counter()
    drained, residual = lead.drain(lead.drain_timeout_seconds)
    drain_seconds = time.perf_counter() - drain_started
    if not drained:
        log.warning(
            "drain_timed_out",
            inflight=residual,
            timeout_seconds=lead.drain_timeout_seconds,
            hint="these calls finish on whichever weights serve them; raise "
            "agentlightning.async_rollout.drain_timeout_seconds if this repeats",
        )
    try:
        publish_started = time.perf_counter()
        served: list[list[str]] = []
        for publisher, publish, _ in updates:
            new_endpoints = publish()
            served.append(
                [normalize_endpoint(e) for e in new_endpoints]
                if new_endpoints is not None
                else publisher.endpoints
            )
        publish_seconds = time.perf_counter() - publish_started
        changed = any(set(urls) != set(p.endpoints) for (p, _, _), urls in zip(updates, served, strict=True))
        if changed and len(updates) > 1:
            lead.client.delete_models()
        for (publisher, _, version), urls in zip(updates, served, strict=True):
            publisher.register(urls, version, replace=changed and len(updates) == 1)
    finally:
        lead.client.resume()
    return {
        "training/async/proxy_inflight_at_pause": state.inflight,
        "training/async/proxy_drain_seconds": drain_seconds,
        "training/async/proxy_drain_timed_out": 0 if drained else 1,
        "timing/publish_s": publish_seconds,
        "timing/weight_update_s": time.perf_counter() - started,
    }


class LeaseKeeper:
    """Renews the publishers' endpoint leases from a background thread, several times per lease,
    so that a busy step or a missed renewal does not let them expire; a failed renewal is said
    and retried at the next one (a Gateway that came back gets the endpoints again)."""

    RENEWALS_PER_LEASE = 4

    def __init__(self, publishers: Iterable[EndpointPublisher], lease_seconds: float) -> None:
        self.publishers = list(publishers)
        self.interval = lease_seconds / self.RENEWALS_PER_LEASE
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agl-endpoint-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for publisher in self.publishers:
                try:
                    publisher.refresh()
                except Exception as exc:  # the Gateway away for a moment: the next renewal repairs it
                    log.warning("endpoint_lease_renewal_failed", error=f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
