"""Weight updates: pause, drain, publish, register, resume — in that order."""

from __future__ import annotations

import pytest

from agentlightning.schemas import ProxyState
from agentlightning.trainer.publish import EndpointPublisher, normalize_endpoint


class RecordingClient:
    """The four Gateway calls a weight update makes, recorded in order."""

    def __init__(self, inflight: list[int]) -> None:
        self.calls: list[tuple] = []
        self._inflight = list(inflight)

    def _state(self, paused: bool) -> ProxyState:
        return ProxyState(
            paused=paused, retry_after_seconds=5, inflight=self._inflight[0] if self._inflight else 0
        )

    def pause(self, retry_after_seconds: float = 5.0, reason: str | None = None) -> ProxyState:
        self.calls.append(("pause", retry_after_seconds))
        return self._state(True)

    def proxy_state(self) -> ProxyState:
        self.calls.append(("state",))
        state = self._state(True)
        if len(self._inflight) > 1:
            self._inflight.pop(0)
        return state

    def resume(self) -> ProxyState:
        self.calls.append(("resume",))
        return self._state(False)

    def delete_models(self) -> None:
        self.calls.append(("delete_models",))

    def register_models(self, models) -> list:
        self.calls.append(("register", tuple((m.model, m.endpoint, m.version) for m in models)))
        return list(models)


def _publisher(client, drain_timeout=5.0):
    p = EndpointPublisher(client, "policy", drain_timeout_seconds=drain_timeout, retry_after_seconds=2.0)
    p.endpoints, p.version = ["http://a:1/v1"], 3
    return p


def test_update_runs_pause_drain_publish_register_resume_in_order():
    client = RecordingClient(inflight=[2, 1, 0])

    def publish():
        client.calls.append(("publish",))
        return None  # same endpoints

    metrics = _publisher(client).update(publish, 4)
    names = [c[0] for c in client.calls]
    assert names == ["pause", "state", "state", "state", "publish", "register", "resume"]
    assert client.calls[0] == ("pause", 2.0)
    assert client.calls[5] == ("register", (("policy", "http://a:1/v1", 4),))
    assert metrics["training/async/proxy_inflight_at_pause"] == 2
    assert metrics["training/async/proxy_drain_timed_out"] == 0


def test_new_endpoints_replace_the_old_ones_while_paused():
    client = RecordingClient(inflight=[0])
    p = _publisher(client)
    p.update(lambda: ["b:2"], 4)
    names = [c[0] for c in client.calls]
    assert names == ["pause", "state", "delete_models", "register", "resume"]
    assert client.calls[3] == ("register", (("policy", "http://b:2/v1", 4),))
    assert (p.endpoints, p.version) == (["http://b:2/v1"], 4)


def test_drain_gives_up_at_its_deadline_and_says_so():
    client = RecordingClient(inflight=[5])
    metrics = _publisher(client, drain_timeout=0.05).update(lambda: None, 4)
    assert metrics["training/async/proxy_drain_timed_out"] == 1
    assert client.calls[-1] == ("resume",)


def test_a_failed_publish_still_resumes_and_registers_nothing():
    client = RecordingClient(inflight=[0])

    def publish():
        raise RuntimeError("weights did not load")

    p = _publisher(client)
    with pytest.raises(RuntimeError, match="did not load"):
        p.update(publish, 4)
    assert [c[0] for c in client.calls] == ["pause", "state", "resume"]
    assert p.version == 3


def test_versions_never_go_back():
    with pytest.raises(ValueError, match="older"):
        _publisher(RecordingClient([0])).update(lambda: None, 2)


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        ("http://h:1/v1/", "http://h:1/v1"),
        ("https://x/v1", "https://x/v1"),
    ],
)
def test_endpoint_addresses_become_urls(address, url):
    assert normalize_endpoint(address) == url


def test_empty_endpoint_is_refused():
    with pytest.raises(ValueError, match="empty"):
        normalize_endpoint(" ")
