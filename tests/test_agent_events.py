"""agentlightning.agent_events, the agents' event poster, against a real HTTP server that records
what it was sent and answers with the statuses a test scripts: the request, what is tried again
and how often, that it stays light, and that `agl init`'s self-contained starter sends the same."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentlightning import agent_events
from agentlightning.agent_events import apost_event, apost_reward, post_event, post_reward
from agentlightning.schemas import EVENT_REWARD

ROOT = Path(__file__).resolve().parent.parent
PATH = "/api/rollouts/r1/attempt/a1/events"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class EventSink:
    """Answers each POST with the next scripted status (200 once they run out) and records it."""

    url: str
    statuses: list[int] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[EventSink]:
    state = EventSink(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            state.requests.append(Recorded("POST", self.path, headers, json.loads(raw)))
            status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}{PATH}"
    monkeypatch.setenv("AGL_EVENT_URL", state.url)
    monkeypatch.setenv("AGL_KEY", "k-123")
    monkeypatch.setattr(agent_events, "FIRST_DELAY_SECONDS", 0.01)  # the same schedule, faster
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _sync(event_type: str, data: dict[str, Any], attempts: int = agent_events.ATTEMPTS) -> None:
    post_event(event_type, data, attempts)


def _async(event_type: str, data: dict[str, Any], attempts: int = agent_events.ATTEMPTS) -> None:
    asyncio.run(apost_event(event_type, data, attempts))


POSTERS = pytest.mark.parametrize("post", [_sync, _async], ids=["sync", "async"])


@POSTERS
def test_an_event_goes_to_the_attempts_url_with_its_key(sink: EventSink, post: Callable[..., None]) -> None:
    post("log", {"line": "hello", "n": [1, 2]})
    (request,) = sink.requests
    assert (request.method, request.path) == ("POST", PATH)
    assert request.headers["authorization"] == "Bearer k-123"
    assert request.headers["content-type"] == "application/json"
    assert request.body == {"event_type": "log", "data": {"line": "hello", "n": [1, 2]}}


def test_a_reward_is_a_reward_event_with_its_value_and_data(sink: EventSink) -> None:
    post_reward(0.5, source="test", reason="close")
    asyncio.run(apost_reward(1.0))
    assert EVENT_REWARD == agent_events.EVENT_REWARD  # the Gateway's name for it
    assert [r.body for r in sink.requests] == [
        {"event_type": "reward", "data": {"value": 0.5, "source": "test", "reason": "close"}},
        {"event_type": "reward", "data": {"value": 1.0}},
    ]


def test_without_a_key_no_authorization_header_is_sent(
    sink: EventSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGL_KEY")
    post_reward(1.0)
    assert "authorization" not in sink.requests[0].headers


@POSTERS
def test_a_busy_or_restarting_gateway_is_tried_again(sink: EventSink, post: Callable[..., None]) -> None:
    sink.statuses = [503, 429, 502]
    post("reward", {"value": 1.0})
    assert len(sink.requests) == 4  # three refusals, then stored
    assert all(r.body == sink.requests[0].body for r in sink.requests)


@POSTERS
def test_tries_are_bounded_and_the_last_error_is_raised(sink: EventSink, post: Callable[..., None]) -> None:
    sink.statuses = [500] * 10
    with pytest.raises(httpx.HTTPStatusError) as caught:
        post("reward", {"value": 1.0}, 3)
    assert caught.value.response.status_code == 500 and len(sink.requests) == 3


@POSTERS
@pytest.mark.parametrize("status", [401, 403, 422])
def test_an_answer_that_would_not_change_is_raised_at_once(
    sink: EventSink, post: Callable[..., None], status: int
) -> None:
    sink.statuses = [status]
    with pytest.raises(httpx.HTTPStatusError):
        post("reward", {"value": 1.0})
    assert len(sink.requests) == 1


@POSTERS
def test_no_gateway_at_all_is_tried_again_then_raised(
    post: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()  # a port nobody listens on: connection refused
    monkeypatch.setenv("AGL_EVENT_URL", f"http://127.0.0.1:{port}{PATH}")
    waited_after: list[int] = []

    def no_wait(attempt: int) -> float:
        waited_after.append(attempt)
        return 0.0

    monkeypatch.setattr(agent_events, "retry_delay", no_wait)
    with pytest.raises(httpx.ConnectError):
        post("reward", {"value": 1.0}, 3)
    assert waited_after == [0, 1]  # a wait between tries, none after the last


def test_the_waits_double_up_to_a_cap() -> None:
    assert [agent_events.retry_delay(a) for a in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_importing_it_loads_no_other_module_of_the_package() -> None:
    """An agent's own venv or image carries agent_events.py and __init__.py, nothing else of ours."""
    code = (
        "import json, sys, agentlightning.agent_events\n"
        "ours = ('agentlightning', 'pydantic', 'torch', 'openai')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ours)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == ["agentlightning", "agentlightning.agent_events"]


@pytest.mark.parametrize("key", ["k-123", ""], ids=["key", "no key"])
def test_the_starters_own_reward_post_sends_what_the_helper_sends(
    sink: EventSink, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """`agl init`'s agent.py is a file the user copies, so it keeps its few lines of posting: they
    send the same request (URL, headers, body) as `post_reward`."""
    monkeypatch.setenv("AGL_KEY", key)
    spec = importlib.util.spec_from_file_location(
        "starter_agent", ROOT / "agentlightning" / "commands" / "starter" / "agent.py"
    )
    assert spec is not None and spec.loader is not None
    starter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(starter)

    starter.post_reward(0.25)
    post_reward(0.25)
    starters, helpers = sink.requests
    assert starters == helpers
    assert ("authorization" in helpers.headers) == bool(key)
